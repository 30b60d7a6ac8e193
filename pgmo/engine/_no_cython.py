"""Cython's class decorators as plain Python (no-ops), where Cython is not installed."""

from typing import TypeVar

T = TypeVar("T")


def cclass(cls: T) -> T:
    return cls


def no_gc_clear(cls: T) -> T:
    return cls
