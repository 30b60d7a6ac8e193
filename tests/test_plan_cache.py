"""The plan cache: a second run starts on its plan, warm-up included; a wrong, stale or damaged
entry never hands out memory in use and costs at most a profile; writes are atomic between
processes; ``pgmo cache`` lists and clears."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pgmo import plan_cache, workloads
from pgmo.cli import main as cli_main
from pgmo.measure.hosts import host_engine
from pgmo.measure.replay import Checker, replay_run
from pgmo.runs import run_from_iteration
from pgmo.trace import Trace

MiB = 1 << 20


def needs_cupy():
    pytest.importorskip("cupy")  # the pool's face keeps and reads the plans


def train(pool, iterations=4, scale=1, checker=None, later=1, later_from=2, reshape_from=None):
    """A training loop: parameters and optimizer state made in the first iteration (kept),
    activations made and freed in each (``later`` times larger from iteration
    ``later_from`` on; from iteration ``reshape_from`` on, the last one 1 MiB larger:
    another shape, the same peak of live bytes); every block checked.  The pool's modes,
    and the checker."""
    checker = checker or Checker(host=True, device=pool.host_device, write=True)
    kept, modes = [], []
    for it in range(iterations):
        with pool.iteration():
            modes.append(pool.mode)
            live = {"x": checker.alloc(pool, 4 * MiB)}
            if it == 0:
                kept.append(checker.alloc(pool, 3 * MiB * scale))  # parameters
            reshaped = reshape_from is not None and it >= reshape_from
            live["a"] = checker.alloc(pool, 8 * MiB * scale * (later if it >= later_from else 1))
            live["b"] = checker.alloc(pool, 2 * MiB)
            assert checker.free(live.pop("a"))
            if it == 0:
                kept.append(checker.alloc(pool, 5 * MiB))  # optimizer state
            live["c"] = checker.alloc(pool, (7 if reshaped else 6) * MiB)
            for name in ("b", "c", "x"):
                assert checker.free(live.pop(name))
    for handle in kept:
        assert checker.free(handle)
    kept.clear()
    assert checker.corrupted == 0 and checker.overlaps == 0
    return modes, checker


def pool(**options):
    from pgmo.measure.hosts import host_pool

    return host_pool(page=512, **{"plan_cache": True, **options})


# -------------------------------------------------------------------- the folder and keys
def test_the_suite_never_writes_the_users_cache():
    assert os.environ.get(plan_cache.ENV)
    assert Path.home() / ".cache" not in plan_cache.cache_dir().parents


def test_without_the_variable_the_platforms_cache_folder(monkeypatch, tmp_path):
    monkeypatch.delenv(plan_cache.ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    if sys.platform.startswith("linux"):
        assert plan_cache.cache_dir() == tmp_path / "pgmo" / "plans"
    monkeypatch.setenv(plan_cache.ENV, str(tmp_path / "mine"))
    assert plan_cache.cache_dir() == tmp_path / "mine"


def test_devices_and_versions_have_folders_of_their_own():
    h100 = plan_cache.DeviceKey("NVIDIA H100", 80 * 2 ** 30, "14.0.0")
    assert h100.folder == plan_cache.DeviceKey("NVIDIA H100", 80 * 2 ** 30, "14.0.0").folder
    others = [plan_cache.DeviceKey("NVIDIA H200", 80 * 2 ** 30, "14.0.0"),
              plan_cache.DeviceKey("NVIDIA H100", 40 * 2 ** 30, "14.0.0"),
              plan_cache.DeviceKey("NVIDIA H100", 80 * 2 ** 30, "13.6.0"),
              plan_cache.DeviceKey("NVIDIA H100", 80 * 2 ** 30, "14.0.0", plan_format=99)]
    assert len({h100.folder, *(o.folder for o in others)}) == 5


def test_an_entry_is_named_by_its_first_size_and_the_hash_of_its_first_sizes():
    name = plan_cache.entry_name([512, 1024, 2048])
    assert name.startswith("512-") and name.endswith(".plan.json")
    assert name != plan_cache.entry_name([512, 1024, 4096])
    many = list(range(512, 512 * 40, 512))
    assert plan_cache.entry_name(many) == plan_cache.entry_name(many[:plan_cache.KEY_SIZES])


def test_a_gpu_is_keyed_by_its_name_and_cupys_version(monkeypatch):
    cupy = pytest.importorskip("cupy")
    from pgmo.pool_plans import cache_key

    monkeypatch.setattr(cupy.cuda.runtime, "getDeviceProperties",
                        lambda device: {"name": b"NVIDIA H100 80GB HBM3"})
    key = cache_key(None, 0, 80 * 2 ** 30)
    assert key == plan_cache.DeviceKey("NVIDIA H100 80GB HBM3", 80 * 2 ** 30, cupy.__version__)
    assert cache_key(object(), 0, 1 << 30).cupy is None  # a raw allocator: its class


# ------------------------------------------------------------------ a second run
def test_a_second_run_starts_on_its_plan_from_its_first_iteration():
    needs_cupy()
    first = pool()
    modes, _ = train(first)
    assert modes == ["warmup", "profiling", "optimized", "optimized"]
    assert first.stats().planned_requests == 2 * 4
    entries = plan_cache.entries()
    assert len(entries) == 1 and entries[0].warmup_plans == 1 and not entries[0].error
    first.close()

    second = pool()
    modes, _ = train(second)
    assert "profiling" not in modes and modes[1:] == ["optimized"] * 3
    st = second.stats()
    # every request of every iteration from its plan, the warm-up's included: its two
    # long-lived blocks kept apart, where the steady plan expects them (outside its arena)
    assert st.planned_requests == 4 + 3 * 4 and st.pinned_requests == 2
    assert st.departed_requests == 0
    assert second.host_device.peak <= first.host_device.peak
    second.close()


def test_background_planning_keeps_its_plans_from_the_worker_process(monkeypatch):
    """In background mode the entry (its warm-up plan and its encoding) is made by the worker
    process, never by the training process; a pool closed at once still leaves it, and
    the next run starts on it."""
    needs_cupy()
    made_here = []

    def here(*args, **kwargs):
        made_here.append(args)
        raise AssertionError("planned in the training process")

    originals = {name: getattr(plan_cache, name) for name in ("warmup_plan", "dumps")}
    for name in originals:
        monkeypatch.setattr(plan_cache, name, here)
    first = pool(replan="background", method="best")
    train(first, iterations=6)
    first.close()  # at once: the worker's entry is waited for
    entries = plan_cache.entries()
    assert made_here == []
    assert len(entries) == 1 and entries[0].warmup_plans == 1 and not entries[0].error
    for name, original in originals.items():
        monkeypatch.setattr(plan_cache, name, original)
    second = pool()
    modes, _ = train(second)
    assert "profiling" not in modes
    second.close()


def test_a_plan_to_keep_that_a_newer_one_replaces_before_it_leaves_is_never_made():
    """Plans installed in a row (re-plans): only the newest is made and written (it
    supersedes the others), and the pool's close waits for it."""
    import threading

    from pgmo.engine.planner import Planner
    from pgmo.plan import Plan
    from pgmo.solver import SolverOptions

    planner = Planner(SolverOptions(method="bestfit"), mode="background")
    cache = plan_cache.PlanCache(plan_cache.DeviceKey("newest", 1 << 30, None))
    made = []
    profiles = [Trace.from_tuples([(0, 0, 1, 512 * k)]) for k in (1, 2, 3)]
    gate = threading.Event()
    planner.later(gate.wait)  # the planner thread waits: three plans queue behind it
    for profile in profiles:
        plan = Plan(profile, (0,), method="test")
        planner.keep(lambda p=profile, q=plan: made.append(p) or cache.keep_request(p, q),
                     lambda: made.append("here"))
    gate.set()
    planner.shutdown()
    assert made == [profiles[-1]]
    written = plan_cache.PlanCache(cache.device)  # lists the folder afresh
    assert len(written) == 1
    entry = written.find(3 * 512)
    assert entry is not None and entry.profile.blocks[0].size == 3 * 512


def test_a_worker_that_cannot_write_the_cache_says_so_here_in_one_line(tmp_path, monkeypatch,
                                                                      caplog):
    needs_cupy()
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv(plan_cache.ENV, str(blocker))
    with caplog.at_level(logging.WARNING, logger="pgmo.cache"):
        first = pool(replan="background", method="best")
        train(first, iterations=6)
        first.close()
    said = [r for r in caplog.records if r.name == "pgmo.cache"]
    assert said and all("cannot keep the plan" in r.getMessage() for r in said)


def test_plan_cache_false_neither_reads_nor_writes():
    needs_cupy()
    train(pool())
    assert len(plan_cache.entries()) == 1
    off = pool(plan_cache=False)
    modes, _ = train(off)
    assert "profiling" in modes
    plan_cache.clear()
    train(pool(plan_cache=False))
    assert plan_cache.entries() == []


def test_an_explicit_plan_path_keeps_working_and_bypasses_the_cache(tmp_path):
    needs_cupy()
    path = tmp_path / "plan.json"
    train(pool(plan_path=path))
    assert path.exists() and plan_cache.entries() == []
    modes, _ = train(pool(plan_path=path))
    assert "profiling" not in modes and modes[0] == "warmup"


@pytest.mark.parametrize("scale", [2, 3])
def test_another_workload_with_the_same_first_request_is_profiled_afresh(scale, caplog):
    """The entry's first request matches, the rest is larger: the plan departs, every
    block stays intact, and the run profiles and plans itself (then keeps its own)."""
    needs_cupy()
    train(pool())
    other = pool()
    with caplog.at_level(logging.INFO, logger="pgmo.pool"):
        modes, checker = train(other, iterations=5, scale=scale)
    assert "profiling" in modes and modes[-1] == "optimized"
    assert checker.corrupted == 0 and checker.overlaps == 0
    assert sum("cached plan does not fit" in r.message for r in caplog.records) == 1
    assert len(plan_cache.entries()) == 2  # its own plan kept beside the first
    third = pool()
    modes, _ = train(third, scale=scale)
    assert "profiling" not in modes


def test_a_steady_iteration_that_departs_is_re_planned_as_in_any_run(caplog):
    """The warm-up holds (the entry is this workload's); a later, larger iteration departs
    from the steady plan: merged and re-planned as the run that made it would, not
    profiled from scratch; every block intact."""
    needs_cupy()
    train(pool())
    second = pool()
    with caplog.at_level(logging.INFO, logger="pgmo.pool"):
        modes, checker = train(second, iterations=6, later=2)
    assert "profiling" not in modes and modes[1:] == ["optimized"] * 5
    assert not any("does not fit this run" in r.message for r in caplog.records)
    st = second.stats()
    assert st.departures >= 1 and st.reoptimizations >= 1
    assert checker.corrupted == 0 and checker.overlaps == 0


def _cold_and_from_the_entry(caplog, **run):
    """The workload trained once (its entry kept), then ``run`` with no cache (``cold``) and
    from the entry (``second``, its log captured): the two pools, and the second's modes
    and checker."""
    needs_cupy()
    train(pool())
    cold = pool(plan_cache=False)
    train(cold, **run)
    second = pool()
    with caplog.at_level(logging.INFO, logger="pgmo.pool"):
        modes, checker = train(second, **run)
    return cold, second, modes, checker


def test_a_first_steady_iteration_that_departs_costs_one_profile_and_no_more_memory(caplog):
    """The warm-up holds, the first steady iteration departs (this run's activations are
    larger than the entry's): the hint is dropped with one log line, one iteration is
    profiled, every block is intact, and the run holds no more than the same run with no
    cache."""
    cold, second, modes, checker = _cold_and_from_the_entry(caplog, iterations=6, later=2,
                                                            later_from=1)
    assert modes.count("profiling") == 1 and modes[-1] == "optimized"
    assert sum("cached plan does not fit" in r.message for r in caplog.records) == 1
    assert checker.corrupted == 0 and checker.overlaps == 0
    assert second.host_device.peak <= cold.host_device.peak


def test_a_first_steady_iteration_of_another_shape_and_the_same_size_keeps_the_plan(caplog):
    """The warm-up holds, the first steady iteration departs (its last activation is 1 MiB
    larger) but needs what the cached plan's arena holds: the plan stays, and each such
    departure is placed in the arena's gaps as in any run; no iteration is profiled,
    every block is intact, and the run holds no more than the same run with no cache (a
    fresh profile's heap beside the arena cost more)."""
    cold, second, modes, checker = _cold_and_from_the_entry(caplog, iterations=6,
                                                            reshape_from=1)
    assert "profiling" not in modes and modes[1:] == ["optimized"] * 5
    assert not any("does not fit this run" in r.message for r in caplog.records)
    st = second.stats()
    assert st.profiled_requests == 0 and st.departures >= 1
    assert checker.corrupted == 0 and checker.overlaps == 0
    assert second.host_device.peak <= cold.host_device.peak


def test_a_damaged_entry_is_ignored_with_one_log_line(caplog):
    needs_cupy()
    train(pool())
    (entry,) = plan_cache.entries()
    entry.path.write_bytes(entry.path.read_bytes()[:-40])  # truncated
    with caplog.at_level(logging.INFO):
        modes, _ = train(pool())
    assert "profiling" in modes
    lines = [r for r in caplog.records if "cached plan" in r.getMessage()]
    assert len(lines) == 1 and str(entry.path) in lines[0].getMessage()
    assert not plan_cache.entries()[0].error  # the run wrote a whole entry over it


def test_an_entry_of_another_device_is_not_offered():
    needs_cupy()
    from pgmo.measure.hosts import host_pool

    train(host_pool(8 << 30, page=512, plan_cache=True))
    modes, _ = train(host_pool(16 << 30, page=512, plan_cache=True))  # another memory size: another device
    assert "profiling" in modes
    assert len({e.path.parent for e in plan_cache.entries()}) == 2


# --------------------------------------------- wrong hints, whole runs, every block checked
def _entry_of(run, **options):
    """The cache entry a pool would keep for ``run`` (planned on the engine alone)."""
    engine = host_engine(page=512, warmup=1, **options)
    kept = []
    engine.on_install = lambda schedule: kept.append(
        (schedule.profile, schedule.plan, list(engine.opening_profiles)))
    replay_run(run, engine, write=False)
    engine.close()
    profile, plan, openings = kept[-1]
    cache = plan_cache.PlanCache(plan_cache.DeviceKey("test", 1 << 40, None))
    path = cache.keep(profile, plan, openings)
    return plan_cache.loads(path.read_bytes())


RUNS = {
    "lstm-random": lambda: workloads.make("lstm-random", seed=1, scale=0.03, iterations=5),
    "cnn-resolutions": lambda: workloads.make("cnn-resolutions", seed=1, scale=0.02,
                                              iterations=5),
    "stairs": lambda: run_from_iteration(
        Trace.from_tuples([(0, 0, 5, 3 * MiB), (1, 1, 3, MiB), (2, 2, 4, 2 * MiB),
                           (3, 3, 6, MiB), (4, 4, 7, 4 * MiB), (5, 6, None, 512)]),
        5, setup=[MiB, 2 * MiB], state=[3 * MiB]),
}


@pytest.mark.parametrize("theirs", sorted(RUNS))
@pytest.mark.parametrize("ours", sorted(RUNS))
def test_a_plan_of_another_workload_never_hands_out_memory_in_use(ours, theirs):
    """The worst hint: whatever the first request, the engine is handed another workload's
    plan (warm-up and steady).  Every block is written and checked: none overlaps a live
    one, and the run ends on plans of its own (or on that plan, where it held)."""
    hint = _entry_of(RUNS[theirs]())
    engine = host_engine(page=512, warmup=1)
    asked = []
    engine.hints = lambda rs: asked.append(rs) or hint
    result = replay_run(RUNS[ours](), engine, write="ends")
    assert len(asked) == 1
    assert result["corrupted"] == 0 and result["overlaps"] == 0
    engine.close()


def test_a_plan_the_arena_cannot_hold_costs_only_the_profile():
    """A hint whose plan needs more than the device has: no arena, the run profiles."""
    from pgmo.plan import Plan

    huge = Trace.from_tuples([(0, 0, 1, 1 << 30), (1, 1, 2, 512)])
    hint = plan_cache.CachedPlan(huge, Plan(huge, (0, 0)), (), (1 << 30, 512), {})
    engine = host_engine(256 * MiB, page=512, warmup=1)
    engine.hints = lambda rs: hint
    result = replay_run(RUNS["stairs"](), engine, write=True)
    assert result["corrupted"] == 0 and result["overlaps"] == 0
    assert result["stats"].planned_requests > 0  # planned from its own profile
    engine.close()


def test_the_same_workload_from_its_entry_keeps_its_peak_from_the_first_iteration():
    run = RUNS["stairs"]()
    hint = _entry_of(run)
    engine = host_engine(page=512, warmup=1)
    engine.hints = lambda rs: hint
    result = replay_run(run, engine, write=True)
    st = result["stats"]
    assert st.departed_requests == 0 and st.reoptimizations == 0
    assert st.planned_requests + st.pinned_requests == len(run.trace.blocks)
    engine.close()


def test_a_small_warm_up_is_planned_with_the_full_method_and_once_per_profile(monkeypatch):
    """A warm-up of a few hundred requests (serving's batch of 32, where the paper's best-fit
    packs 1.29x the lower bound) gets the full method's plan, never above best-fit's, made
    once per profile however many plans are kept."""
    from pgmo.solver import SolverOptions, solve

    run = workloads.make("serving", iterations=1, scale=0.05, batches=(32,))
    lo, hi = run.iterations[0]
    closed = [b for b in run.trace.blocks if lo <= b.lower and b.upper is not None
              and b.upper < hi]
    opening = Trace.from_tuples([(k, b.lower, b.upper, b.size) for k, b in enumerate(closed)])
    best_fit = solve(opening, SolverOptions(method="bestfit"))
    assert best_fit.peak > 1.2 * opening.lower_bound()
    plan = plan_cache.warmup_plan(opening)
    assert plan.is_valid() and plan.peak <= best_fit.peak
    cache = plan_cache.PlanCache(plan_cache.DeviceKey("test", 1 << 40, None))
    calls = []
    monkeypatch.setattr(plan_cache, "warmup_plan",
                        lambda o: calls.append(o) or solve(o, SolverOptions(method="bestfit")))
    steady = Trace.from_tuples([(0, 0, 1, MiB)])
    for _ in range(3):
        cache.keep(steady, solve(steady, SolverOptions(method="bestfit")), [(opening, None)])
    assert calls == [opening]


def test_a_best_fit_plan_kept_from_the_worker_is_written_as_the_full_methods(monkeypatch):
    """A run planned with best-fit (``method="bestfit"``, or background planning whose
    better plan never landed) leaves the next run a better plan: the worker searches the
    profile before it writes the entry; a plan at its lower bound, or another method's, is
    written as installed; a plan installed again is not searched again."""
    from pgmo.solver import SolverOptions, solve

    run = workloads.make("serving", iterations=1, scale=0.05, batches=(32,))
    lo, hi = run.iterations[0]
    closed = [b for b in run.trace.blocks if lo <= b.lower and b.upper is not None
              and b.upper < hi]
    profile = Trace.from_tuples([(k, b.lower, b.upper, -(-b.size // 512) * 512)
                                 for k, b in enumerate(closed)])  # sizes as the pool rounds
    best_fit = solve(profile, SolverOptions(method="bestfit"))
    assert best_fit.peak > 1.2 * profile.lower_bound()
    cache = plan_cache.PlanCache(plan_cache.DeviceKey("searched", 1 << 40, None))
    caches = {(cache.folder.parent.parent, cache.device): cache}
    searches = []
    real = plan_cache.searched_plan
    monkeypatch.setattr(plan_cache, "searched_plan", lambda p: searches.append(p) or real(p))
    for _ in range(2):
        path = plan_cache.keep_from_request(cache.keep_request(profile, best_fit), caches)
    assert path is not None and len(searches) == 1
    entry = plan_cache.PlanCache(cache.device).find(profile.blocks[0].size)
    assert entry is not None and entry.plan.is_valid()
    assert entry.plan.peak < best_fit.peak and entry.plan.peak <= 1.02 * profile.lower_bound()
    other = plan_cache.Plan(profile, best_fit.offsets, method="best")
    assert plan_cache.searched_plan(other) is other  # the full method's: as installed


# --------------------------------------------------------------------- atomic writes
WRITER = textwrap.dedent("""
    import sys
    from pgmo import plan_cache
    from pgmo.trace import Trace
    from pgmo.plan import Plan

    n = int(sys.argv[1])
    profile = Trace.from_tuples([(i, i, i + 2, 512 * (1 + (i + n) % 7)) for i in range(300)])
    plan = Plan(profile, tuple(512 * 8 * (i % 2) for i in range(300)), method="test")
    cache = plan_cache.PlanCache(plan_cache.DeviceKey("ranks", 1 << 30, None))
    for _ in range(int(sys.argv[2])):
        cache.store([512] * 16, profile, plan)
""")


def test_ranks_writing_the_same_key_at_once_always_leave_a_readable_entry(tmp_path):
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    ranks = [subprocess.Popen([sys.executable, str(script), str(n), "25"], env=env)
             for n in range(4)]
    folder = plan_cache.PlanCache(plan_cache.DeviceKey("ranks", 1 << 30, None)).folder
    path = folder / plan_cache.entry_name([512] * 16)
    reads = 0
    while any(r.poll() is None for r in ranks):
        if path.exists():
            plan_cache.loads(path.read_bytes(), str(path))  # never half a file
            reads += 1
    assert all(r.wait() == 0 for r in ranks)
    plan_cache.loads(path.read_bytes(), str(path))
    assert [p.name for p in folder.iterdir()] == [path.name]  # no temporary file left
    assert reads > 0


def test_an_unwritable_cache_is_one_log_line_and_the_pool_goes_on(tmp_path, monkeypatch,
                                                                  caplog):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv(plan_cache.ENV, str(blocker))
    cache = plan_cache.PlanCache(plan_cache.DeviceKey("x", 1, None))
    profile = Trace.from_tuples([(0, 0, 1, 512)])
    from pgmo.plan import Plan

    with caplog.at_level(logging.WARNING, logger="pgmo.cache"):
        assert cache.store([512], profile, Plan(profile, (0,))) is None
    assert len(caplog.records) == 1


# ---------------------------------------------------------------------- pgmo cache
def test_pgmo_cache_lists_and_clears(capsys):
    needs_cupy()
    train(pool())
    assert cli_main(["cache"]) == 0
    out = capsys.readouterr().out
    assert "1 cached plan in" in out and "HostMemory" in out and "peak" in out
    assert "1 warm-up plan" in out
    assert cli_main(["cache", "--clear"]) == 0
    assert "removed 1 cached plan" in capsys.readouterr().out
    assert plan_cache.entries() == []
    assert cli_main(["cache", "clear"]) == 0
    assert cli_main(["cache"]) == 0
    assert "no cached plans" in capsys.readouterr().out


def test_pgmo_cache_answers_a_mistake_with_one_line():
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    done = subprocess.run([sys.executable, "-m", "pgmo", "cache", "purge"], env=env,
                          capture_output=True, text=True)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr and "invalid choice" in done.stderr
