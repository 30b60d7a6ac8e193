"""Replays with a byte pattern in every block: the pool never corrupts data, in any mode.

The random workloads, in every re-planning mode, are in ``test_pool_properties.py``.
"""

from __future__ import annotations

import random
import sys

import pytest

import pgmo
from pgmo.engine import Engine, compiled, pool_options, reference_handout
from pgmo.engine import handout as compiled_handout
from pgmo.measure.hosts import host_backend, host_engine
from pgmo.measure.replay import Checker, replay
from pgmo.trace import events

from .benchmarks import BENCH, needs_bench
from .late_frees import LateFreer


def _host_pool(**options):
    pytest.importorskip("cupy")
    from pgmo.measure.hosts import host_pool

    return host_pool(**options)


#: Every replay test runs on the engine alone (no CuPy needed) and on the CuPy pool.
POOLS = {"engine": host_engine, "cupy-pool": _host_pool}


@pytest.fixture(params=sorted(POOLS))
def make_pool(request):
    return POOLS[request.param]



def scaled(trace: pgmo.Trace, max_peak: int = 4 << 20) -> pgmo.Trace:
    """Shrink sizes so a host replay stays cheap; lifetimes untouched."""
    k = max(1, -(-trace.lower_bound() // max_peak))
    return pgmo.Trace.from_tuples([(b.id, b.lower, b.upper, max(1, b.size // k))
                                   for b in trace.blocks])


def assert_clean(res, fresh: bool = True):
    """No corrupted byte, no shared address, every block given back, peaks as observed."""
    assert res["corrupted"] == 0
    assert res["overlaps"] == 0
    st = res["stats"]
    assert st.live_bytes == 0 and st.used_bytes == 0
    if fresh:  # the replay was all this pool ever served
        assert st.peak_used_bytes == res["peak_bytes"]
    else:
        assert st.peak_used_bytes >= res["peak_bytes"]


def bundled_names():
    try:
        from pgmo import bundled
    except ImportError:
        return []
    return bundled.names()


@pytest.mark.parametrize("name", bundled_names() or ["<none>"])
def test_bundled_traces_in_all_modes(name, make_pool):
    if name == "<none>":
        pytest.skip("no bundled traces")
    from pgmo import bundled

    trace = scaled(bundled.load(name))
    survivors = sum(b.upper is None for b in trace.blocks)  # real traces: gradients, say
    # 512-byte pages: at 4 MiB, 2 MiB pages would weigh more than the packing (the page
    # heap keeps the weights' two pages beside the arena, and the plan is rightly declined)
    pool = make_pool(warmup=1, page=512)
    res = replay([trace] * 4, pool)
    assert_clean(res)
    assert res["modes"] == ["warmup", "profiling", "optimized", "optimized"]
    st = res["stats"]
    assert st.planned_requests + st.pinned_requests == 2 * len(trace)
    assert st.pinned_requests == 2 * survivors  # blocks that outlive their iteration
    assert st.departed_requests == 0 and st.reoptimizations == 0
    assert st.planned_peak >= st.lower_bound > 0
    fb = replay([trace], pool, interrupted=True)
    assert_clean(fb, fresh=False)
    assert fb["modes"] == ["fallback"]
    assert fb["stats"].interrupted_requests == len(trace)


def test_replay_stats_count_no_block_of_the_last_iteration_as_live():
    """replay() frees a trace's open blocks after each iteration; nothing may keep one alive."""
    trace = pgmo.Trace.from_rows([(0, 0, 2, 1024), (1, 1, None, 512)])  # block 1 stays open
    assert replay([trace], host_engine(warmup=0))["stats"].live_bytes == 0


def test_the_checker_catches_a_pool_that_hands_out_an_address_in_use():
    """The oracle of every replay test, against a deliberately broken plan."""
    from pgmo import bundled

    trace = scaled(bundled.load("synthetic-alexnet-train-b32"))
    pool = host_engine(warmup=0)
    assert_clean(replay([trace] * 2, pool))
    rows = pool.current.rows
    pool.hot.install(rows, [pool.hot.arena.ptr] * len(rows))  # every request at offset 0
    broken = replay([trace], pool)
    assert broken["overlaps"] > 0 and broken["corrupted"] > 0


DSA_FILES = ["omnimalloc-small/c.8.csv", "minimalloc/challenging/A.1048576.csv",
             "minimalloc/challenging/K.1048576.csv", "idealloc/iree/iree_mobilenet.csv",
             "idealloc/iree/iree_mobilebert.csv", "idealloc/somas_tensors/resnet50.csv",
             "idealloc/somas_tensors/tiny_bert.csv", "idealloc/somas_tensors/bert_base.csv",
             "idealloc/iopddl/G_1.csv"]


@needs_bench
@pytest.mark.parametrize("rel", DSA_FILES)
def test_dsa_benchmark_traces_in_all_modes(rel, make_pool):
    path = BENCH / rel
    if not path.exists():
        pytest.skip(f"{rel} not present")
    trace = pgmo.read_trace(path, inclusive="iree" in rel)
    trace = scaled(trace)
    pool = make_pool(warmup=1)
    res = replay([trace] * 3, pool)
    assert_clean(res)
    assert res["modes"][-1] == "optimized"
    assert res["stats"].planned_requests == len(trace)
    assert res["stats"].departed_requests == 0
    fb = replay([trace], pool, interrupted=True)
    assert_clean(fb, fresh=False)


def variable_length_trace(rng: random.Random) -> pgmo.Trace:
    """A decoder-like iteration: length 1..12 steps, each step's blocks live to backward."""
    length = rng.randint(1, 12)
    rows, tick, stack = [], 0, []
    for step in range(length):
        for size in (4096, 2048 * (1 + step % 3)):
            rows.append([len(rows), tick, None, size])
            stack.append(len(rows) - 1)
            tick += 1
        tmp = len(rows)
        rows.append([tmp, tick, tick + 1, 8192])
        tick += 2
    for i in reversed(stack):
        rows[i][2] = tick
        tick += 1
    return pgmo.Trace.from_tuples([tuple(r) for r in rows])


def test_reoptimizations_become_rare_on_a_variable_length_workload(make_pool):
    rng = random.Random(7)
    pool = make_pool(warmup=1)
    counts = []
    corrupted = 0
    for _ in range(150):
        res = replay([variable_length_trace(rng)], pool)
        corrupted += res["corrupted"] + res["overlaps"]
        counts.append(res["stats"].reoptimizations)
    early = counts[49] - counts[0]
    late = counts[149] - counts[99]
    assert corrupted == 0
    assert early >= 1
    assert late <= 1 and late < early
    st = pool.stats()
    assert st.planned_requests > st.departed_requests


def test_seq2seq_sizes_converge(make_pool):
    from pgmo import synth

    pool = make_pool(warmup=1)
    counts = []
    for seed in range(90):
        t = synth.seq2seq_training(batch=2, hidden=16, vocab=40, layers=2, seed=seed)
        res = replay([t], pool)
        assert res["corrupted"] == 0 and res["overlaps"] == 0
        counts.append(res["stats"].reoptimizations)
    assert counts[-1] - counts[59] <= 1
    assert counts[29] >= 1


def test_concurrent_stats_and_frees_from_other_threads(make_pool):
    """The owner's lock-free path must stay exclusive when other threads join in.

    A watcher reads ``stats()`` as fast as it can, racing the owner's mallocs
    and another thread's frees: each answer must be consistent, and whenever
    no malloc or free is in flight (the test's lock held) the pool's live
    bytes must be those the checker counted itself.  Any exception in either
    thread fails the test.
    """
    import threading

    from .threads import CheckedThread

    trace = pgmo.Trace.from_tuples([(i, i, i + 3, 1000 + 512 * (i % 5)) for i in range(40)])
    pool = make_pool(warmup=1)
    replay([trace] * 2, pool)
    assert pool.mode == "optimized"
    stop = threading.Event()
    lock = threading.Lock()  # held around every malloc and free: the checker's count is exact
    checker = Checker(host=True)
    errors = []
    compared = []

    def watcher():
        while not stop.is_set():
            for _ in range(20):
                st = pool.stats()  # races the other threads
                assert 0 <= st.used_bytes <= st.total_bytes, st
                assert st.used_bytes % 512 == 0 and st.peak_used_bytes >= st.used_bytes, st
            with lock:
                used = pool.stats().used_bytes
                assert used == checker.live_bytes, (used, checker.live_bytes)
                compared.append(used)

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # threads take turns every few bytecodes: races show up
    watching = CheckedThread(target=watcher, name="stats-watcher")
    watching.start()
    freer = LateFreer(checker, lock, errors)
    events = sorted([(b.upper, 0, i) for i, b in enumerate(trace.blocks)]
                    + [(b.lower, 1, i) for i, b in enumerate(trace.blocks)])
    try:
        for _ in range(100):
            live = {}
            with pool.iteration():
                for _, kind, i in events:
                    if kind:
                        with lock:
                            live[i] = checker.alloc(pool, trace.blocks[i].size)
                    else:  # freed by the other thread, later; handed over under the
                        with lock:  # lock, so that only the freer holds it when it frees
                            freer.put(live.pop(i))
    finally:
        stop.set()
        sys.setswitchinterval(switch)
        watching.join(60)
        freer.stop()
    assert not errors
    assert checker.corrupted == 0 and checker.overlaps == 0
    assert len(compared) > 0 and max(compared) > 0  # compared while blocks were live
    st = pool.stats()
    assert st.live_bytes == st.used_bytes == checker.live_bytes == 0
    assert st.peak_used_bytes >= checker.peak_bytes
    assert st.planned_requests > 0  # the arena was in use while the threads ran


# -- the compiled hot path against its plain-Python reference -------------------------
def placements(engine, traces):
    """Where each request went: ("arena", offset) or ("fallback", None), per iteration."""
    out = []
    for trace in traces:
        live = {}
        with engine.iteration():
            for _, kind, i in events(trace.blocks):
                if kind:
                    p = engine.malloc(trace.blocks[i].size)
                    arena = engine.hot.arena
                    inside = arena is not None and arena.ptr <= p.ptr < arena.ptr + arena.size
                    out.append(("arena", p.ptr - arena.ptr) if inside else ("fallback", None))
                    live[i] = p
                else:
                    del live[i]
        live.clear()
    return out


@pytest.mark.skipif(not compiled_handout.COMPILED, reason="pgmo was built without Cython")
@pytest.mark.parametrize("name", bundled_names()[:3] or ["<none>"])
def test_compiled_and_reference_hot_paths_place_every_block_alike(name):
    if name == "<none>":
        pytest.skip("no bundled traces")
    from pgmo import bundled, synth

    hot = scaled(bundled.load(name))
    other = [synth.seq2seq_training(batch=2, hidden=16, vocab=40, layers=2, seed=s)
             for s in range(3)]
    traces = [hot, hot, hot, other[0], hot, other[1], other[2], hot, hot]
    results = []
    for hot_path in (compiled_handout.HotPath, reference_handout().HotPath):
        engine = Engine(host_backend(page=512),
                        pool_options(warmup=1, replan="sync", method="bestfit"),
                        hot_path=hot_path)
        results.append((placements(engine, traces), engine.stats()))
    (compiled_out, compiled_stats), (reference_out, reference_stats) = results
    assert compiled_out == reference_out
    assert compiled_stats.planned_requests > 0 and compiled_stats.departures > 0
    assert compiled_stats == reference_stats


def test_the_default_hot_path_is_the_compiled_one_when_built(monkeypatch):
    engine = host_engine()
    assert (type(engine.hot).__module__ == "pgmo.engine.handout") == compiled()
    monkeypatch.setenv("PGMO_PURE_PYTHON", "1")
    assert not compiled()
    assert type(host_engine().hot).__module__ == "pgmo.engine._reference.handout"
