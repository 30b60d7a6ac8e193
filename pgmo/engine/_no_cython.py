"""Cython's class decorators as plain Python (no-ops), where Cython is not installed."""


def cclass(cls):
    return cls


def no_gc_clear(cls):
    return cls
