"""What the pool holds from the device over whole runs, on the host model of the device.

The footprint pgmo promises: on a repeating run, never more than CuPy's
stock pool at any moment and at most 1.05x the physical limit (the most
bytes the run has live at once); on a variable-length run, one arena near
its largest iteration; on a device barely larger than the physical limit,
the run completes; every block checked.
"""

from __future__ import annotations

import pytest

import pgmo
from pgmo import bundled
from pgmo.measure import footprint
from pgmo.measure.replay import replay_run
from pgmo.runs import run_from_iteration

#: Tests of what CuPy itself adds (its pool objects, its OutOfMemoryError); the rest run on
#: the pool's engine alone where CuPy is not installed (footprint.pgmo_pool).
needs_cupy = pytest.mark.skipif(not footprint.has_cupy(),
                                reason="needs CuPy (its pool objects, its OutOfMemoryError)")


def real_run(name: str, iterations: int = 6):
    """A whole run of a trace recorded on the H100 (bundled): weights and momentum the size
    of its gradients (its open blocks), made in the first iteration."""
    trace = bundled.load(f"h100-{name}")
    grads = [b.size for b in trace.blocks if b.upper is None]
    return run_from_iteration(trace, iterations, setup=grads, state=grads)


@pytest.mark.parametrize("name, replan", [
    ("alexnet-train-b32", "sync"), ("alexnet-train-b32", "background"),
    ("densenet-bc100-k12-train-b64-recompute-on-stock", "sync")])
def test_a_repeating_run_holds_the_physical_limit_and_never_more_than_cupy(name, replan):
    run = real_run(name)
    stock = footprint.measure(run, footprint.stock_pool())
    pool = footprint.pgmo_pool(replan=replan, method="bestfit")(None)
    engine = getattr(pool, "engine", pool)  # the engine alone where CuPy is not installed
    assert engine.planner.wait_idle(60)  # its worker started, as after a model's set-up
    mine = footprint.measure(run, pool, step_seconds=0.01 if replan == "background" else 0)
    pool.close()
    assert mine.completed and mine.corrupted == 0
    assert mine.peak <= 1.05 * run.lower_bound_rounded()
    # The warm-up and profiled iterations are served online, as CuPy's pool serves them;
    # from the first planned iteration on, pgmo never holds more than CuPy had by then.
    first_planned = [k for k, (kind, _) in enumerate(run.events()) if kind == "begin"][2]
    held, theirs = mine.held, stock.held
    assert footprint.moments_above(held[first_planned:],
                                   [max(theirs[:first_planned + 1])] + theirs[first_planned + 1:]) \
        == (0, 0)
    assert mine.peak < stock.peak
    st = mine.stats
    assert st.stock_bytes == 0
    assert st.total_bytes == st.arena_bytes + st.exact_bytes + st.kept_bytes
    # beside the arena: the long-lived blocks (weights, momentum, gradients), in whole pages
    # (a survivor keeps the page it shares with the first iterations' blocks: DenseNet-BC's
    # 897 long-lived blocks, 9 MB, keep 46 MB of the page heap's pages, 3.9% of the peak)
    assert st.exact_bytes + st.kept_bytes <= run.long_lived_bytes() + 0.04 * mine.peak


@pytest.mark.parametrize("heap", ["own", "driver"])
@needs_cupy
def test_without_cupy_the_engine_alone_holds_what_the_pool_holds(monkeypatch, heap):
    """Where CuPy is not installed, the footprint is measured on the pool's engine alone
    (``python -m scripts.bench_footprint`` runs there too): the same bytes at every moment,
    the same calls that wait and release, the same plans."""
    from pgmo.engine import Engine

    run = real_run("alexnet-train-b32", iterations=4)

    def once():
        pool = footprint.pgmo_pool(replan="sync", method="bestfit", heap=heap)(None)
        try:
            return footprint.measure(run, pool), isinstance(pool, Engine)
        finally:
            pool.close()

    mine, engine = once()
    monkeypatch.setattr(footprint, "has_cupy", lambda: False)
    alone, engine_alone = once()
    assert not engine and engine_alone
    assert mine.completed and alone.completed
    for field in ("peak", "held", "syncs_inside", "syncs_boundary", "releases_inside",
                  "releases_boundary", "requests", "raw_allocations"):
        assert getattr(alone, field) == getattr(mine, field), field
    assert alone.stats.planned_peak == mine.stats.planned_peak
    assert alone.stats.planned_requests == mine.stats.planned_requests


def test_a_run_completes_on_a_device_barely_larger_than_its_physical_limit():
    """Within 3% of the limit in whole 2 MiB pages, every byte written and checked."""
    run = real_run("alexnet-train-b32", iterations=4)
    device = int(run.lower_bound_rounded() * 1.03)
    pool = footprint.pgmo_pool(replan="sync", method="bestfit")(device)
    result = footprint.measure(run, pool, timeline=False, write=True)
    pool.close()
    assert result.completed and result.corrupted == 0 and result.peak <= device
    # CuPy's pool needs more: its cached chunks cannot merge across allocations
    assert not footprint.measure(run, footprint.stock_pool(device), timeline=False).completed


@needs_cupy
def test_a_device_too_small_for_the_run_is_cupys_out_of_memory_with_the_numbers():
    from cupy.cuda.memory import OutOfMemoryError

    run = real_run("alexnet-train-b32", iterations=3)
    small = run.lower_bound_rounded() - 50 * 2 ** 20
    pool = footprint.pgmo_pool(replan="sync", method="bestfit")(small)
    with pytest.raises(OutOfMemoryError, match=r"Out of memory allocating [\d,]+ bytes"):
        replay_run(run, pool, write=False)
    assert pool.stats().used_bytes == 0  # every block handed out was checked and freed
    pool.close()


def test_variable_lengths_live_in_one_arena_near_the_largest_iteration():
    run = pgmo.synth.seq2seq_run(iterations=30, batch=8, hidden=64, vocab=2000, layers=2)
    stock = footprint.measure(run, footprint.stock_pool())
    # a 14 MiB run: a device of 512-byte pages, so that 2 MiB granules do not decide it
    pool = footprint.pgmo_pool(replan="sync", method="bestfit", page=512)(None)
    engine = getattr(pool, "engine", pool)  # the engine alone where CuPy is not installed
    arenas = []  # the arena's size at each plan installed (the engine is held: no stats())
    engine.on_install = lambda schedule: arenas.append(engine.memory.parts()["arena"])
    mine = footprint.measure(run, pool, write=True)
    pool.close()
    st = mine.stats
    assert mine.completed and mine.corrupted == 0
    assert mine.peak <= 1.1 * run.lower_bound_rounded() and mine.peak < stock.peak
    assert st.departed_requests > st.planned_requests  # most requests were placed off plan...
    assert st.stock_bytes == 0  # ...with no cache left behind
    # re-planned only when an iteration larger than any before came, and one arena
    assert 1 <= st.reoptimizations == len(arenas) - 1 <= record_iterations(run) + 2
    assert st.arena_bytes <= 1.1 * st.planned_peak + 2 ** 21


def record_iterations(run) -> int:
    """Iterations after the profiled one (the second) whose lower bound is above every one
    before them, the profiled one included."""
    where, sizes = run.iteration_of(), {}
    for i, b in enumerate(run.trace.blocks):
        sizes.setdefault(where[i], []).append(b)
    best, records = 0, 0
    for k in sorted(k for k in sizes if k >= 1):
        lb = _iteration_lb(run, k)
        records += lb > best and k > 1
        best = max(best, lb)
    return records


def _iteration_lb(run, k: int) -> int:
    begin, end = run.iterations[k]
    live = peak = 0
    for kind, i in run.events():
        b = run.trace.blocks[i] if kind in ("alloc", "free") else None
        if b is None or not begin <= b.lower < end:
            continue
        if kind == "alloc":
            live += b.size
        elif b.upper is not None and b.upper <= end:
            live -= b.size
        peak = max(peak, live)
    return peak


def test_moments_above_compare_each_event_with_what_cupy_held_by_then():
    assert footprint.moments_above([5, 9, 9, 7], [6, 6, 8, 8]) == (2, 3)


def test_profiling_in_the_stream_ordered_heap_holds_near_the_live_bytes():
    """What the pool held from the device through warm-up and profiling, measured in pages,
    is within 5 % of the most bytes live then (best fit in the heap, no device sync),
    and below what CuPy's caching pool held for the same iterations."""
    run = real_run("densenet-bc100-k12-train-b64-recompute-on-stock", iterations=3)
    peaks = footprint.profiling_candidates(run)
    pool = footprint.pgmo_pool(replan="sync", method="bestfit")(None)
    mine = footprint.measure(run, pool)
    pool.close()
    profiled_end = [k for k, (kind, _) in enumerate(run.events()) if kind == "end"][1]
    assert mine.completed
    held = max(mine.held[:profiled_end])  # before the arena is taken
    assert peaks["exact"] <= held <= 1.05 * peaks["exact"]
    assert held < peaks["stock"]
    assert sum(mine.syncs_inside[:2]) == 0  # and nothing waited for the device meanwhile
