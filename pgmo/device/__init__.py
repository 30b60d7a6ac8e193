"""pgmo's device layer: what speaks to a GPU's memory (:mod:`.cuda`), and the host model
that stands in for it (:mod:`.host_memory`).
"""
