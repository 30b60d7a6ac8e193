"""Shared test set-up: Hypothesis profiles, CuPy's allocator restored after every test,
``gpu`` tests skipped without a device, and the plan cache in a folder of each test's own
(never the user's)."""

from __future__ import annotations

import atexit
import functools
import itertools
import os
import shutil
import tempfile

import pytest
from hypothesis import settings

# Slow 2-core CI machines: no per-example deadline; under CI the examples are
# derandomized so that a run can be reproduced exactly.  The nightly profile
# (``python -m pytest --hypothesis-profile=pgmo-nightly``, see
# docs/testing.rst) draws new examples every run, NIGHTLY_FACTOR times as many.
settings.register_profile("pgmo", deadline=None, print_blob=True)
settings.register_profile("pgmo-ci", parent=settings.get_profile("pgmo"), derandomize=True)
NIGHTLY_FACTOR = 10
settings.register_profile("pgmo-nightly", parent=settings.get_profile("pgmo"),
                          derandomize=False, max_examples=100 * NIGHTLY_FACTOR)
settings.load_profile("pgmo-ci" if os.environ.get("CI") else "pgmo")

# The plan cache (pgmo.plan_cache) never writes the user's cache folder from the suite: the
# whole session points it at a folder of its own, and each test at an empty one below it
# (a test's plans are not the next test's hints).  Child processes inherit it.
_SESSION_CACHE = tempfile.mkdtemp(prefix="pgmo-test-plan-cache-")
os.environ["PGMO_CACHE_DIR"] = _SESSION_CACHE
atexit.register(shutil.rmtree, _SESSION_CACHE, True)


def _more_examples(items) -> None:
    """Under the nightly profile, tests that name their number of examples run
    NIGHTLY_FACTOR times as many (the profile alone would not change them)."""
    if settings.default.max_examples != settings.get_profile("pgmo-nightly").max_examples:
        return
    scaled = set()
    for item in items:
        test = getattr(item, "obj", None)
        own = getattr(test, "_hypothesis_internal_use_settings", None)  # @settings(...)
        if own is None or id(test) in scaled or own.max_examples == settings.default.max_examples:
            continue
        scaled.add(id(test))
        test._hypothesis_internal_use_settings = settings(
            own, max_examples=own.max_examples * NIGHTLY_FACTOR)


@functools.lru_cache(maxsize=None)
def gpu_available() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    _more_examples(items)
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


_cache_folders = itertools.count()


@pytest.fixture(autouse=True)
def _own_plan_cache(monkeypatch):
    """Each test starts with an empty plan cache of its own (under the session's)."""
    folder = os.path.join(_SESSION_CACHE, f"test-{next(_cache_folders)}")
    monkeypatch.setenv("PGMO_CACHE_DIR", folder)
    yield folder
