"""Deprecated old path of :mod:`pgmo.device.mappings`: it goes in the next release.

Kept so that code importing ``pgmo.mappings`` still runs: it re-exports the
same objects and warns once, when first imported.
"""

import warnings

from .device.mappings import MappingLedger

__all__ = ["MappingLedger"]

warnings.warn("pgmo.mappings moved to pgmo.device.mappings; "
              "the old path goes in the next release",
              DeprecationWarning, stacklevel=2)
