"""Shared fixtures: CuPy's allocator is restored after every test; ``gpu`` tests skip without a device."""

from __future__ import annotations

import functools

import pytest


@functools.lru_cache(maxsize=None)
def gpu_available() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if gpu_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (cupy.cuda.runtime.getDeviceCount() "
                                   "failed or is 0)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _restore_cupy_allocator():
    """A test that installs a pool must not leak it into the next test."""
    try:
        import cupy
    except ImportError:
        yield
        return
    previous = cupy.cuda.get_allocator()
    yield
    cupy.cuda.set_allocator(previous)
