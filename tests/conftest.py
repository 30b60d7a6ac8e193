"""Shared test set-up: Hypothesis profiles, CuPy's allocator restored after every test,
``gpu`` tests skipped without a device."""

from __future__ import annotations

import functools
import os

import pytest
from hypothesis import settings

# Slow 2-core CI machines: no per-example deadline; under CI the examples are
# derandomized so that a run can be reproduced exactly.
settings.register_profile("pgmo", deadline=None, print_blob=True)
settings.register_profile("pgmo-ci", parent=settings.get_profile("pgmo"), derandomize=True)
settings.load_profile("pgmo-ci" if os.environ.get("CI") else "pgmo")


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
