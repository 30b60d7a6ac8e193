"""What re-planning costs a training loop: boundary stalls, plan latency, the loop's own rate.

Each workload is replayed through the pool on host memory (no GPU needed),
once per re-planning mode (``--modes``: ``sync``, ``bestfit`` and
``background`` by default), with ``method="best"`` and ``--time-limit``:

* the bundled real traces (``pgmo traces`` lists them; the ``h100-*`` ones),
  each repeated for ``--iterations`` iterations whose sizes grow
  ``--growth`` times in the first half (every third request by 4 KiB per
  step, as seq2seq batches with longer sentences do), so that the pool
  departs from its plan and re-plans, then stay put;
* the variable-workload family (:mod:`pgmo.workloads`), whole runs as made
  from seed 0.

Between two iterations the loop does what a training step does besides
allocating: it launches work, here ``--launches`` small NumPy calls (a
stand-in for kernel launches, timed).  Per workload and mode it reports:

* boundaries (``begin_iteration`` + ``end_iteration``): the worst (and the
  training thread's CPU time in it: where far below the wall time, the
  thread waited for the interpreter lock or the OS), the median (in
  microseconds: a steady boundary takes a few) and the 99th percentile, and
  how many runs kept the worst under 20 ms; sync and bestfit modes plan at
  the boundary by design, so the boundaries that planned (those that
  installed a plan or planned a recurring shape) are shown apart; and the
  worst boundary **with the driver's calls modelled**: its time here plus
  what its virtual-memory calls cost on the GPU the host model was fitted to
  (:func:`pgmo.device.host_memory.call_cost_us`; here they are mmap calls
  of microseconds), the calls' share alone in brackets (one ``cuMemUnmap``
  over a run of mappings costed as one over a single mapping of that size
  until a GPU's quick check times the joined call); with
  ``--one-unmap-per-mapping`` also on a model of a driver that takes one
  mapping per call (version "this, one unmap per mapping");
* plan latency: from the profiled iteration's end to its first plan and to
  its best plan installed (the one still in use when the next re-plan
  starts, or at the end), in iterations and seconds, the median over runs
  and the worst ("none in the run": no run installed one before it ended);
* the launch loop's rate while a plan is being made (the planner busy
  before or after the loop) as a share of its rate in the same run while
  nothing is planned (``planning/idle``; the goal is 0.98 or more);
* the CPU time the training process spent on threads other than the
  training loop's during the loop (the planner's threads: what shares the
  interpreter lock with training), the median over runs;
* which hot path each version ran (a line above the tables: a checkout copied
  without its files' times, ``cp -r``, looks edited since it was compiled
  and runs the plain-Python one, whose boundaries are slower);
* the final planned peak over the lower bound, garbage-collector pauses
  inside boundaries (a long stall's usual suspect), and how long the
  planner took to be ready after the pool was made (the loop starts then,
  as a training job's first step comes after its set-up).

Every run of every workload starts in a fresh process.  ``--compare DIR``
adds another checkout of pgmo (the code in ``DIR/pgmo``, compiled in place
if it has a compiled hot path), run in the same way and interleaved with
this one run by run, so that both see the same machine load.  ``--busy-core``
keeps one core busy with another process throughout (a machine whose other
work, data loaders say, wants the CPU too: where the planner's priority
decides when plans land).

    python -m scripts.bench_overhead                       # every workload, 3 runs
    python -m scripts.bench_overhead --runs 10 --compare ../base
    python -m scripts.bench_overhead --workloads h100-alexnet-train-b32,lstm-random --runs 1
"""

from __future__ import annotations

import gc
import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

try:
    from pgmo import programs
except ImportError:  # a run for --compare imports the other checkout's pgmo, which may predate
    programs = None  # these helpers: a run (replay) needs none of them

#: This repository's root (its ``pgmo`` is the one measured unless ``--compare`` adds others).
ROOT = Path(__file__).resolve().parent.parent
GOAL_MS = 20.0
RATE_GOAL = 0.98


# ------------------------------------------------------------------- workloads
def grown_sizes(sizes: list[int], step: int) -> list[int]:
    """Every third request larger by ``step`` x 4 KiB: more memory, same lifetimes."""
    return [s + (4096 * step if i % 3 == 0 else 0) for i, s in enumerate(sizes)]


#: Replay operations, one code each: a request (index, size), a free (index), a boundary.
ALLOC, FREE, BEGIN, END = 0, 1, 2, 3


class Ops:
    """Replay operations in three flat arrays: the replay's own data holds no Python
    objects the garbage collector would walk (it would lengthen every collection)."""

    def __init__(self) -> None:
        from array import array

        self.codes, self.indices, self.sizes = bytearray(), array("q"), array("q")

    def add(self, code: int, index: int = 0, size: int = 0) -> None:
        self.codes.append(code)
        self.indices.append(index)
        self.sizes.append(size)


def trace_ops(trace, iterations: int, growth: int) -> Ops:
    """``trace`` repeated, growing ``growth`` times in the first half, as replay operations."""
    from pgmo.trace import events

    blocks = trace.blocks
    base = [b.size for b in blocks]
    order = events(blocks)
    steps = [iterations // 2 * (k + 1) // (growth + 1) for k in range(growth)]
    ops = Ops()
    step = 0
    for it in range(iterations):
        while step < len(steps) and it >= steps[step]:
            step += 1
        sizes = grown_sizes(base, step)
        ops.add(BEGIN)
        for _, kind, i in order:
            if kind:
                ops.add(ALLOC, i, sizes[i])
            else:
                ops.add(FREE, i)
        ops.add(END)
    return ops


def run_ops(run) -> Ops:
    """A :class:`~pgmo.runs.Run` as replay operations (requests outside iterations kept)."""
    blocks = run.trace.blocks
    ops = Ops()
    codes = {"free": FREE, "begin": BEGIN, "end": END}
    for kind, i in run.events():
        if kind == "alloc":
            ops.add(ALLOC, i, blocks[i].size)
        else:
            ops.add(codes[kind], i)
    return ops


def workload_names(spec: str) -> list[str]:
    from pgmo import bundled, workloads

    real = [n for n in bundled.names() if bundled.is_real(bundled.load(n).metadata)]
    names: list[str] = []
    for part in spec.split(","):
        part = part.strip()
        if part == "real":
            names += real
        elif part == "family":
            names += workloads.names()
        elif part in bundled.names() or part in workloads.names():
            names.append(part)
        elif part:
            raise programs.unknown_name("workload (real, family, a bundled trace or a family "
                                        "member)", part,
                                        ["real", "family", *bundled.names(), *workloads.names()])
    return list(dict.fromkeys(names))


def workload_ops(name: str, iterations: int, growth: int) -> Ops:
    from pgmo import bundled, workloads

    if name in workloads.names():
        return run_ops(workloads.make(name))
    return trace_ops(bundled.load(name), iterations, growth)


# --------------------------------------------------------------- one replay
class _GcTimer:
    """Seconds the garbage collector ran, and its longest pause, while armed."""

    def __init__(self) -> None:
        self.total = 0.0
        self.started = 0.0
        gc.callbacks.append(self)

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self.started = time.perf_counter()
        else:
            self.total += time.perf_counter() - self.started

    def close(self) -> None:
        gc.callbacks.remove(self)


def replay(ops: Ops, mode: str, time_limit: float, launches: int,
           plan_cache: str | None = None, joins_unmaps: bool = True) -> dict:
    """One replay of ``ops`` through a fresh host pool in ``mode``: what the parent tabulates
    (``plan_cache``: a folder, in which the pool keeps its plans, as by default, in an
    empty folder of its own: a first run; ``joins_unmaps`` false: a driver that unmaps
    one mapping per call)."""
    import numpy as np

    from pgmo.testing import host_pool  # a path every checkout has (see --compare)

    cache = {}
    if plan_cache:
        os.makedirs(plan_cache, exist_ok=True)
        os.environ["PGMO_CACHE_DIR"] = tempfile.mkdtemp(dir=plan_cache)
        cache = {"plan_cache": True}
    made = time.perf_counter()
    pool = host_pool(warmup=1, replan=mode, method="best", time_limit=time_limit, seed=0,
                     **cache)
    engine = pool.engine
    planner = engine.planner
    # A training job sets its model up before its first step: the pool's planner (a worker
    # process, where there is one) starts meanwhile.
    wait_idle = getattr(planner, "wait_idle", None)  # (older versions have none)
    if wait_idle is not None:
        wait_idle(60)
    ready = time.perf_counter() - made
    shapes = getattr(engine, "shapes", None)
    shape_plans = shapes.planned if shapes is not None else 0
    a, b, c = np.ones(8), np.ones(8), np.empty(8)
    add = np.add
    malloc, begin, end = pool.malloc, pool.begin_iteration, pool.end_iteration
    gct = _GcTimer()
    boundaries: list[float] = []  # per iteration: its begin + its end, seconds
    installed: list[bool] = []  # whether that boundary installed a plan
    gc_in: list[float] = []
    # the driver's calls at each boundary, timed as on the GPU the host model was fitted to
    device = getattr(pool, "host_device", None)
    modelled = device is not None and hasattr(device, "driver_us")  # (older versions: none)
    if modelled:
        device.joins_unmaps = joins_unmaps
    driver: list[float] = []
    d0 = d_begin = 0.0
    cpu: list[float] = []  # per boundary: the training thread's own CPU time in it
    thread_time = time.thread_time
    c0 = c_begin = 0.0
    busy_calls = busy_time = idle_calls = idle_time = 0.0
    starts: list[tuple[int, float]] = []  # (iteration, time its end began): profiles made
    installs: list[tuple[int, float, str]] = []  # (iteration, time, method)
    live: dict[int, object] = {}
    schedule = engine.schedule
    cpu0, main0 = time.process_time(), time.thread_time()  # CPU of the process, of this thread
    it = 0
    stall = gc0 = gc_begin = 0.0
    departures = engine.departures
    iteration_mode = ""
    started = time.perf_counter()
    for code, index, size in zip(ops.codes, ops.indices, ops.sizes):
        if code == ALLOC:
            live[index] = malloc(size)
        elif code == FREE:
            del live[index]
        elif code == BEGIN:
            gc0 = gct.total
            d0 = device.driver_us if modelled else 0.0
            c0 = thread_time()
            t0 = time.perf_counter()
            begin()
            stall = time.perf_counter() - t0
            c_begin = thread_time() - c0
            d_begin = device.driver_us - d0 if modelled else 0.0
            gc_begin = gct.total - gc0
            iteration_mode = pool.mode
            if engine.schedule is not schedule:
                schedule = engine.schedule
                installs.append((it, t0, schedule.plan.method))
        else:
            gc0 = gct.total
            d0 = device.driver_us if modelled else 0.0
            c0 = thread_time()
            t0 = time.perf_counter()
            end()
            t1 = time.perf_counter()
            cpu.append(c_begin + thread_time() - c0)
            boundaries.append(stall + t1 - t0)
            gc_in.append(gc_begin + gct.total - gc0)
            if modelled:
                driver.append((d_begin + device.driver_us - d0) * 1e-6)
            new = engine.schedule is not schedule
            planned_shapes = shapes.planned if shapes is not None else 0
            # a boundary that installed a plan, or planned a recurring shape
            installed.append(new or planned_shapes != shape_plans)
            shape_plans = planned_shapes
            if iteration_mode == "profiling" or engine.departures != departures:
                starts.append((it, t0))
                departures = engine.departures
            if new:
                schedule = engine.schedule
                installs.append((it, t1, schedule.plan.method))
            it += 1
            # the rest of a training step: launching work
            was_busy = planner.busy
            t0 = time.perf_counter()
            for _ in range(launches):
                add(a, b, out=c)
            spent = time.perf_counter() - t0
            if was_busy or planner.busy:  # a plan was being made (or delivered) meanwhile
                busy_calls += launches
                busy_time += spent
            else:
                idle_calls += launches
                idle_time += spent
    total = time.perf_counter() - started
    others = (time.process_time() - cpu0) - (time.thread_time() - main0)
    live.clear()
    deadline = time.perf_counter() + time_limit * 1.05 + 30  # let a last solve land
    while planner.busy and time.perf_counter() < deadline:
        time.sleep(0.02)
    begin()
    end()
    st = pool.stats()
    pool.close()
    gct.close()
    return {"mode": mode, "ready_s": ready, "total_s": total, "boundaries": boundaries,
            "installed": installed, "driver": driver, "cpu": cpu,
            "gc_in": gc_in, "starts": starts, "installs": installs,
            "busy_rate": busy_calls / busy_time if busy_time else None,
            "idle_rate": idle_calls / idle_time if idle_time else None,
            "busy_s": busy_time, "others_cpu_s": others, "final_peak": st.planned_peak, "lower_bound": st.lower_bound,
            "final_method": st.plan_method, "replans": st.reoptimizations,
            "failures": st.planner_failures + st.solve_failures}


def latencies(starts, installs) -> list[dict | None]:
    """Per profile made (a profiled iteration, or a departure once the last one's plan
    came): its first and best plan's latency in iterations and seconds from the end of
    the iteration that made it; None where no plan came before the next profile."""
    episodes: list[tuple[int, float]] = []
    for it, t in starts:
        if episodes and not any(episodes[-1][0] <= i and s >= episodes[-1][1]
                                for i, s, _ in installs if i <= it):
            continue  # still waiting for the last one's plan: the same episode
        episodes.append((it, t))
    out: list[dict | None] = []
    for k, (it, t) in enumerate(episodes):
        until = episodes[k + 1][1] if k + 1 < len(episodes) else float("inf")
        mine = [(i, s, m) for i, s, m in installs if t <= s < until]
        if not mine:
            out.append(None)
            continue
        first, last = mine[0], mine[-1]
        out.append({"first_it": first[0] - it, "first_s": first[1] - t,
                    "best_it": last[0] - it, "best_s": last[1] - t, "method": last[2]})
    return out


def child(spec_path: str) -> None:
    """Run one workload in every mode asked for, with the pgmo the spec names."""
    spec = json.loads(Path(spec_path).read_text())  # run in the checkout measured: its pgmo
    ops = Ops()
    with open(spec["ops"], "rb") as f:
        ops.codes, ops.indices, ops.sizes = pickle.load(f)  # plain data: no class to import
    results = []
    for mode in spec["modes"]:
        r = replay(ops, mode, spec["time_limit"], spec["launches"], spec.get("plan_cache"),
                   spec.get("joins_unmaps", True))
        r["latency"] = latencies(r.pop("starts"), r.pop("installs"))
        r["hot_path"] = hot_path_run()
        results.append(r)
    Path(spec["out"]).write_text(json.dumps(results))


def hot_path_run() -> str:
    """Which hot path the checkout measured runs: a copy whose compiled module looks older
    than its source (``cp -r``) runs the plain-Python one, and its boundaries are slower."""
    try:
        from pgmo.engine.hot_path_choice import COMPILED, compiled
    except ImportError:  # a version before the compiled hot path
        return "plain Python (none compiled in this version)"
    if compiled():
        return "compiled"
    if os.environ.get("PGMO_PURE_PYTHON"):
        return "plain Python (PGMO_PURE_PYTHON)"
    return "plain Python (its compiled module is stale)" if COMPILED else "plain Python"


def hot_paths(results: dict, versions: list[str]) -> str:
    """One line: the hot path each version ran (every run of it, or each kind seen)."""
    seen: dict[str, set] = {}
    for (_, _, version), rows in results.items():
        seen.setdefault(version, set()).update(r.get("hot_path", "unknown") for r in rows)
    return "; ".join(f"{v}: {', '.join(sorted(seen.get(v, {'no run'})))}" for v in versions)


# ------------------------------------------------------------------ the parent
def run_child(root: Path, ops_file: str, modes: list[str], args, workdir: str,
              joins_unmaps: bool = True) -> list[dict]:
    out = os.path.join(workdir, "result.json")
    spec = os.path.join(workdir, "spec.json")
    Path(spec).write_text(json.dumps({"ops": ops_file, "modes": modes,
                                      "time_limit": args.time_limit,
                                      "launches": args.launches, "out": out,
                                      "joins_unmaps": joins_unmaps,
                                      "plan_cache": os.path.join(workdir, "cache")
                                      if args.plan_cache else None}))
    code = ("import runpy, sys; mod = runpy.run_path(sys.argv[1], run_name='bench_child'); "
            "mod['child'](sys.argv[2])")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    with programs.children_leave_ctrl_c_to_me():  # a Ctrl-C is this process's to answer
        proc = subprocess.Popen([sys.executable, "-c", code, __file__, spec], cwd=root,
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
    try:
        _, stderr = proc.communicate()
    except BaseException:  # Ctrl-C: the run stops with this program
        proc.kill()
        proc.wait()
        raise
    if proc.returncode != 0 or not os.path.exists(out):
        raise SystemExit(f"bench_overhead: the run with {root} failed:\n{stderr[-3000:]}")
    results = json.loads(Path(out).read_text())
    os.remove(out)
    return results


def _ms(x: float) -> str:
    return f"{x * 1e3:.1f}"


def summarize(rows: list[dict]) -> dict:
    """One table row from the runs of a workload, mode and version."""
    worst = [max(r["boundaries"]) for r in rows]
    quiet = [max([b for b, new in zip(r["boundaries"], r["installed"]) if not new] or [0.0])
             for r in rows]
    planning = [max([b for b, new in zip(r["boundaries"], r["installed"]) if new] or [0.0])
                for r in rows]
    median = [statistics.median(r["boundaries"]) for r in rows]
    p99 = [sorted(r["boundaries"])[min(len(r["boundaries"]) - 1,
                                       int(0.99 * len(r["boundaries"])))] for r in rows]
    gc_worst = [max(r["gc_in"]) for r in rows]
    # each boundary as it would take on the GPU: its time here plus its driver calls' model
    # (the host model's calls themselves take little time here, so little is counted twice)
    on_gpu = [max(b + d for b, d in zip(r["boundaries"], r["driver"]))
              for r in rows if r.get("driver")]
    calls = [max(r["driver"]) for r in rows if r.get("driver")]
    # the worst boundary's CPU time on the training thread: near its wall time, pgmo's own
    # work; far below it, the thread waited (the interpreter lock, the OS scheduler)
    worst_run = max(rows, key=lambda r: max(r["boundaries"]))
    k = max(range(len(worst_run["boundaries"])), key=worst_run["boundaries"].__getitem__)
    worst_cpu = worst_run["cpu"][k] if worst_run.get("cpu") else None
    firsts = [r["latency"][0] for r in rows if r["latency"] and r["latency"][0] is not None]
    later = [lat for r in rows for lat in r["latency"][1:] if lat is not None]
    rates = [r["busy_rate"] / r["idle_rate"] for r in rows if r["busy_rate"] and r["idle_rate"]]
    return {"worst": max(worst), "ok": sum(w <= GOAL_MS / 1e3 for w in worst),
            "on_gpu": max(on_gpu) if on_gpu else None, "worst_cpu": worst_cpu,
            "on_gpu_ok": sum(w <= GOAL_MS / 1e3 for w in on_gpu),
            "calls": max(calls) if calls else None,
            "quiet": max(quiet), "quiet_ok": sum(w <= GOAL_MS / 1e3 for w in quiet),
            "planning": max(planning), "median": statistics.median(median),
            "p99": statistics.median(p99), "gc": max(gc_worst),
            "boundaries_s": statistics.median(sum(r["boundaries"]) for r in rows),
            "first": firsts, "later": later, "rates": rates,
            "busy_s": sum(r["busy_s"] for r in rows),
            "ready_s": max(r.get("ready_s", 0.0) for r in rows),
            # (the process's and the thread's clocks tick apart: a few us below 0 is none)
            "others_ms": max(0.0, statistics.median(r.get("others_cpu_s", 0.0) * 1e3
                                                    for r in rows)),
            "peak_lb": max(r["final_peak"] / r["lower_bound"] if r["lower_bound"] else 1.0
                           for r in rows),
            "methods": sorted({r["final_method"] for r in rows}),
            "failures": sum(r["failures"] for r in rows), "runs": len(rows)}


def _lat(values: list[dict], key: str) -> str:
    if not values:
        return "none in the run"
    its = [v[f"{key}_it"] for v in values]
    secs = [v[f"{key}_s"] for v in values]
    return f"{statistics.median(its):g} it / {statistics.median(secs):.2f} s (max {max(its)} / {max(secs):.2f})"


def print_tables(results: dict, versions: list[str], modes: list[str], names: list[str]) -> None:
    print("| workload | replan | version | worst ms (its CPU on the training thread) "
          "| runs <= 20 ms "
          "| worst with the driver's calls modelled ms (runs <= 20 ms; the calls alone) "
          "| worst non-planning ms "
          "| worst planning ms | median us | p99 ms | boundaries s | worst GC in a boundary ms "
          "| first plan | best plan | later re-plans (best) | launch rate planning/idle "
          "| other threads' CPU ms | final peak / LB | final method | planner ready s |")
    print("|---|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---|---|---|---|---:|---:|---|---:|")
    for name in names:
        for mode in modes:
            for v in versions:
                rows = results.get((name, mode, v))
                if not rows:
                    continue
                s = summarize(rows)
                rates = s["rates"]
                rate = (f"{statistics.median(rates):.3f} (min {min(rates):.3f}, "
                        f"{s['busy_s']:.2f} s planning)" if rates else "-")
                gpu = (f"{_ms(s['on_gpu'])} ({s['on_gpu_ok']}/{s['runs']}; "
                       f"{_ms(s['calls'])})" if s["on_gpu"] is not None else "-")
                cpu = f" ({_ms(s['worst_cpu'])})" if s["worst_cpu"] is not None else ""
                print(f"| {name} | {mode} | {v} | {_ms(s['worst'])}{cpu} | {s['ok']}/{s['runs']} "
                      f"| {gpu} | {_ms(s['quiet'])} | {_ms(s['planning'])} | {s['median'] * 1e6:.1f} "
                      f"| {_ms(s['p99'])} | {s['boundaries_s']:.2f} | {_ms(s['gc'])} "
                      f"| {_lat(s['first'], 'first')} | {_lat(s['first'], 'best')} "
                      f"| {_lat(s['later'], 'best')} | {rate} | {s['others_ms']:.1f} "
                      f"| {s['peak_lb']:.4f} "
                      f"| {','.join(s['methods'])} | {s['ready_s']:.2f} |")


def main(argv=None) -> None:
    ap = programs.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", default="real,family",
                    help="comma-separated: 'real' (the bundled real traces), 'family' (the "
                         "variable workloads), or names of either (default: real,family)")
    ap.add_argument("--modes", default="sync,bestfit,background",
                    help="re-planning modes, comma-separated (default: all three)")
    ap.add_argument("--runs", type=int, default=3, help="runs of each workload (default: 3)")
    ap.add_argument("--iterations", type=int, default=200,
                    help="iterations of each real trace (default: 200)")
    ap.add_argument("--growth", type=int, default=5,
                    help="size increases in the first half of a real trace's run (default: 5)")
    ap.add_argument("--time-limit", type=programs.non_negative_float, default=1.0, metavar="S",
                    help="the solver's time limit per plan (default: 1 s)")
    ap.add_argument("--launches", type=int, default=1000,
                    help="small NumPy calls between two iterations (default: 1000)")
    ap.add_argument("--compare", type=Path, action="append", default=[], metavar="DIR",
                    help="another checkout of pgmo to run interleaved with this one")
    ap.add_argument("--plan-cache", action="store_true",
                    help="pools keep their plans in the plan cache, as by default (an empty "
                         "folder per run: every run is a first run); without it they keep "
                         "none")
    ap.add_argument("--busy-core", action="store_true",
                    help="keep one core busy with another process during the runs (a machine "
                         "whose other work wants the CPU too, as data loaders do)")
    ap.add_argument("--one-unmap-per-mapping", action="store_true",
                    help="also run this checkout on a host model of a driver that unmaps one "
                         "mapping per call (version 'this, one unmap per mapping'), "
                         "interleaved: what joining a run's unmaps in one call saves")
    ap.add_argument("--raw", type=Path, help="also write every run's numbers to this JSON file "
                                             "(once every run is done)")
    args = ap.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    known = ("sync", "bestfit", "background")
    if not modes or any(m not in known for m in modes):
        bad = ", ".join(m for m in modes if m not in known) or repr(args.modes)
        ap.error(f"--modes {bad}: the modes are {', '.join(known)}")
    if args.runs < 1 or args.iterations < 4 or args.launches < 0:
        ap.error("--runs must be >= 1, --iterations >= 4 and --launches >= 0")
    for d in args.compare:
        if not (d / "pgmo" / "__init__.py").is_file():
            ap.error(f"--compare {d}: no pgmo package there")
    if args.raw and not args.raw.parent.is_dir():  # found now, not after the runs
        ap.error(f"--raw {args.raw}: no folder {args.raw.parent}")
    if args.raw and args.raw.is_dir():
        ap.error(f"--raw {args.raw}: a folder; give a file to write")
    if args.growth < 0:
        ap.error("--growth must be >= 0")
    names = workload_names(args.workloads)
    if not names:
        ap.error(f"--workloads {args.workloads!r} names no workload (real, family, or names)")
    roots = [ROOT] + [d.resolve() for d in args.compare]
    versions = ["this"] + [str(d) for d in args.compare]
    joined = [True] * len(roots)
    if args.one_unmap_per_mapping:
        roots.append(ROOT)
        versions.append("this, one unmap per mapping")
        joined.append(False)
    print(f"workloads: {', '.join(names)}; modes {', '.join(modes)}; {args.runs} runs; "
          f"method best, time limit {args.time_limit} s; {args.launches} launches between "
          f"iterations; load average at the start {os.getloadavg()[0]:.2f}; "
          f"{os.cpu_count()} cores; a core kept busy: {'yes' if args.busy_core else 'no'}",
          flush=True)
    from scripts.children import busy_core  # here: a child runs this file on its own

    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="bench-overhead-") as workdir, \
            busy_core(args.busy_core):
        files = {}
        for name in names:
            files[name] = os.path.join(workdir, f"{name}.ops")
            with open(files[name], "wb") as f:
                ops = workload_ops(name, args.iterations, args.growth)
                pickle.dump((ops.codes, ops.indices, ops.sizes), f)
        try:
            for run in range(args.runs):
                for name in names:
                    order = list(zip(roots, versions, joined))
                    if run % 2:
                        order.reverse()  # neither version always goes first
                    for root, v, joins in order:
                        for r in run_child(root, files[name], modes, args, workdir, joins):
                            results.setdefault((name, r["mode"], v), []).append(r)
                print(f"run {run + 1} of {args.runs} done; load average "
                      f"{os.getloadavg()[0]:.2f}", flush=True)
        except KeyboardInterrupt:
            if results:  # the runs so far, then the one line Ctrl-C gets (no --raw file)
                print("\nthe runs finished before Ctrl-C:")
                print(f"hot path run: {hot_paths(results, versions)}")
                print_tables(results, versions, modes, names)
            raise
    print()
    print(f"hot path run: {hot_paths(results, versions)}")
    print_tables(results, versions, modes, names)
    print(f"\nload average at the end {os.getloadavg()[0]:.2f}")
    if args.raw:
        args.raw.write_text(json.dumps({"|".join(k): v for k, v in results.items()}))


if __name__ == "__main__":
    raise SystemExit(programs.run(main))
