"""Deprecated old path of :mod:`pgmo.device.params`: it goes in the next release.

Kept so that code importing ``pgmo.device_params`` still runs: it re-exports the
same objects and warns once, when first imported.
"""

import warnings

from .device.params import PARAMS, SOURCE

__all__ = ["PARAMS", "SOURCE"]

warnings.warn("pgmo.device_params moved to pgmo.device.params; "
              "the old path goes in the next release",
              DeprecationWarning, stacklevel=2)
