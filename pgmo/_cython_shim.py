"""Cython's class decorators as plain Python (no-ops), where Cython is not installed.

The compiled hot path's sources (``pgmo/engine/frees.py``) use them; without
Cython (a build dependency only) they run as plain Python with these.
"""

from typing import TypeVar

T = TypeVar("T")


def cclass(cls: T) -> T:
    return cls


def no_gc_clear(cls: T) -> T:
    return cls
