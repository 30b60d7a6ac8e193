"""Moved to :mod:`pgmo.measure.plot`; this old path goes in the next release."""

import warnings as _warnings
from typing import Any as _Any

from .measure import plot as _moved
from .measure.plot import *  # noqa: F401,F403
from .measure.plot import __all__  # noqa: F401

_warnings.warn("pgmo.plot moved to pgmo.measure.plot; the old path goes in the next "
               "release", DeprecationWarning, stacklevel=2)


def __getattr__(name: str) -> _Any:
    """The moved module's other names (those outside its ``__all__``) as well."""
    return getattr(_moved, name)
