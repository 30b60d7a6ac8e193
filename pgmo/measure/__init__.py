"""Measurement: what a pool holds over whole runs, and whether every block stayed intact.

The layer above the pool that the benchmarks, ``pgmo demo``, ``pgmo analyze``
and the tests all use: :mod:`.hosts` (the pool and its engine on host memory,
no GPU), :mod:`.replay` (drives a pool through traces and runs, checking every
block), :mod:`.footprint` (a pool's device memory and device syncs over a run),
:mod:`.analysis` (``pgmo analyze``: plans against reserved memory) and
:mod:`.plot` (Figure-1-style pictures).  Nothing is imported here, so the core
modules (:mod:`.analysis`, :mod:`.plot`) load without the adapters.
"""
