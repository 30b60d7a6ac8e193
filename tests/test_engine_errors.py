"""Mistakes answered like CuPy: misuse of the iteration calls, sizes CuPy refuses,
sizes no device has, the null block.

Tests pgmo.engine.core (the slow path's checks).
"""

from __future__ import annotations

import pytest

from pgmo.engine import pool_options

from .engine_bench import Checked, HOT, hot_path  # noqa: F401 (hot_path: a fixture)


def test_misuse_gives_clear_errors(hot_path):
    c = Checked(hot_path)
    e = c.engine
    with pytest.raises(RuntimeError, match="without begin_iteration"):
        e.end_iteration()
    with pytest.raises(RuntimeError, match="without interrupt"):
        e.resume()
    with pytest.raises(RuntimeError, match="nothing to optimize"):
        e.optimize()
    e.begin_iteration()
    with pytest.raises(RuntimeError, match="inside an iteration"):
        e.begin_iteration()
    e.end_iteration()
    with pytest.raises(ValueError, match="unknown method 'magic'"):
        pool_options(method="magic")
    with pytest.raises(ValueError, match="warmup"):
        pool_options(warmup=-1)
    with pytest.raises(ValueError, match="replan mode 'later'"):
        pool_options(replan="later")
    with pytest.raises(TypeError, match=r"unknown option 'wramup' \(did you mean 'warmup'\?\)"):
        pool_options(wramup=1)
    with pytest.raises(TypeError, match="unknown option 'zzz'; the pool's options are"):
        pool_options(zzz=1)


@pytest.mark.parametrize("size, error, message", [
    (-1, OverflowError, "can't convert negative value to size_t"),
    (2 ** 70, OverflowError, "too large to convert"),
    ("1024", TypeError, "an integer is required"),
    # Stricter than CuPy on purpose: CuPy 14 truncates 1.5 to 1 byte silently.
    (1.5, TypeError, "an integer is required, got float"),
])
def test_invalid_sizes_raise_like_cupy_in_every_mode(hot_path, size, error, message):
    c = Checked(hot_path, warmup=0)
    c.iteration(HOT)  # optimized now: the inline path must refuse them too
    e = c.engine
    for phase in ("outside", "planned"):
        if phase == "planned":
            e.begin_iteration()
        with pytest.raises(error, match=message):
            e.malloc(size)
        if phase == "planned":
            e.end_iteration()
    assert e.stats().requests == len([op for op in HOT if isinstance(op, int)])


@pytest.mark.parametrize("size", [1 << 62, 1 << 63, (1 << 64) - 1])
def test_a_size_no_device_has_is_out_of_memory_in_every_mode(hot_path, size):
    # The fake device lends any size: only the engine can refuse, and must, the same way
    # in warm-up, profiling, optimized iterations and outside them (CuPy's pool: its
    # OutOfMemoryError), rather than overflow a C integer of the hot path.
    c = Checked(hot_path, warmup=1)
    e = c.engine
    modes = []
    for _ in range(3):
        e.begin_iteration()
        modes.append(e.mode)
        with pytest.raises(MemoryError, match="Out of memory allocating"):
            e.malloc(size)
        c.run(HOT)
        e.end_iteration()
    with pytest.raises(MemoryError, match="Out of memory allocating"):
        e.malloc(size)
    assert modes == ["warmup", "profiling", "optimized"]
    assert e.stats().requests == 3 * 4  # the refused requests are not requests
    assert e.stats().planned_requests == 4 and e.mode == "optimized"


def test_size_zero_is_a_null_block_and_not_a_request(hot_path):
    c = Checked(hot_path, warmup=0)
    e = c.engine
    e.begin_iteration()
    p = e.malloc(0)
    assert p.ptr == 0 and p.size == 0
    e.end_iteration()
    assert e.stats().requests == 0
