"""Moved to :mod:`pgmo.measure.footprint`; this old path goes in the next release."""

import warnings as _warnings
from typing import Any as _Any

from .measure import footprint as _moved
from .measure.footprint import *  # noqa: F401,F403
from .measure.footprint import __all__  # noqa: F401

_warnings.warn("pgmo.footprint moved to pgmo.measure.footprint; the old path goes in the next "
               "release", DeprecationWarning, stacklevel=2)


def __getattr__(name: str) -> _Any:
    """The moved module's other names (those outside its ``__all__``) as well."""
    return getattr(_moved, name)
