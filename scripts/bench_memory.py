"""The paper's memory and speed experiments (Figures 2 and 3) in one run: stock pool vs pgmo.

For each model and batch size, and for each pool, a fresh subprocess trains
(or infers) for ``--iterations`` steps with every allocation going through
that pool (it is installed before the model is built) and reports,
measured the same way for both pools over the whole run: the device memory
it took, seen from outside the pool (``cudaMemGetInfo`` sampled every 5 ms
inside iterations and at their ends, and NVML through ``nvidia-ml-py`` when
installed, less the baseline once the CUDA context exists), the most bytes
in live blocks (a CuPy memory hook), each pool's own count beside them
(never compared), pgmo's planned peak against the profile's lower bound,
the first iterations' times and the median time per iteration after
``--skip`` warm-up iterations.  Each configuration runs up to ``--repeats``
times, each a fresh process: time is the median of the runs' medians with
their range.  Then, per ``--search-arch``, a bounded binary search finds the
largest training batch that runs under ``--memory-limit`` (``set_limit`` on
either pool from the start: the same criterion for both), and seq2seq trains
``--seq2seq-iterations`` variable-length batches, reporting memory the
same way, time and pgmo's re-optimizations.  ``scripts.record_traces
--densenet`` records DenseNet-BC at ``--densenet-batchsize`` with and
without recomputation, under each pool, and ``scripts.recompute_table``
tabulates the traces.  With ``--run-dir``, whole runs (every malloc and
free from process start, iterations marked; :class:`pgmo.TraceRecorder`) of
``--run-arch`` and seq2seq are recorded under each pool as run files.
Markdown tables go to stdout and, with ``-o``, to a file with the command,
device, versions and date (:mod:`scripts.bench_memory_report`)::

    python -m scripts.bench_memory --device 0 -o results.md --run-dir runs
    python -m scripts.bench_memory --device 0 --arch resnet50 --batchsize 32 \\
        --search-arch resnet50 --seq2seq-iterations 0        # a quick look
    python -m scripts.bench_memory --device -1               # CPU dry run, tiny sizes

``--device -1`` runs the same subprocesses at tiny sizes on the CPU, where
Chainer's NumPy arrays reach the pools through CuPy's allocator by the
stand-in hook of :class:`scripts.numpy_mirror.NumpyMirror`; every number that needs a
GPU reads ``n/a (CPU)``.  ``--budget`` bounds the whole run: configurations
not started in time are listed as skipped.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import logging
import math
import platform
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pgmo import programs

programs.start(__name__)  # Ctrl-C from here on: one line, exit status 130

from pgmo.runs import write_run  # noqa: E402

from . import children, examples, needs_gpu, nvml_probe  # noqa: E402
from .bench_memory_report import (  # noqa: E402  (the report's tables, tested apart)
    ARCHS, POOLS, combine, gpu_cell, mib, report, run_order, seq2seq_row)

SIZE_UNITS = {"": 1, "b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "kb": 10**3,
              "mb": 10**6, "gb": 10**9}

log = logging.getLogger("bench_memory")


# ====================================================================== child
def _child_imports():
    """Chainer, the examples and the workloads: only the subprocesses need them."""
    from . import chainer_workloads  # patches Chainer's imports first

    return chainer_workloads, examples.load("measure")


def _is_out_of_memory(error: BaseException) -> bool:
    import cupy

    if isinstance(error, (cupy.cuda.memory.OutOfMemoryError, MemoryError)):
        return True
    status = getattr(error, "status", None)  # CUDARuntimeError: cudaErrorMemoryAllocation
    if status == 2 and "CUDARuntimeError" in type(error).__name__:
        return True
    return "ALLOC_FAILED" in str(error)  # cuBLAS, cuSOLVER, cuDNN: no room for a workspace


def _child_pool(cfg: dict, workloads):
    """(pgmo's pool or None, the pool a dry run installs as CuPy's allocator or None).

    Both pools get the limit from the start: the same criterion for both.  On
    a GPU the stock pool is CuPy's default pool.  In a dry run every request
    reaches its pool through CuPy's allocator (``chainer_workloads.mirror_for``):
    pgmo's host pool with its own defaults, or, standing in for CuPy's pool,
    one kept interrupted (its fallback is a caching host pool).
    """
    device, limit = cfg["device"], cfg.get("limit") or 0
    if cfg["pool"] == "pgmo":
        pool = workloads.new_pool(device, warmup=1, method=cfg["method"],
                                      time_limit=cfg["time_limit"])
        installed = pool
    elif device < 0:
        pool, installed = None, workloads.new_pool(device, warmup=0)
        installed.interrupt()
    else:
        import cupy

        pool = installed = None
        if limit:
            cupy.get_default_memory_pool().set_limit(size=limit)
    if installed is not None:
        if limit:
            installed.set_limit(size=limit)
        installed.install()  # before the model: weights and optimizer state go through it
    return pool, installed


def _build(cfg: dict, workloads, device):
    kind = cfg["workload"]
    if cfg.get("arch") and not cfg.get("insize"):
        cfg = {**cfg, "insize": workloads.ARCHS[cfg["arch"]].insize}
    if kind == "cnn-train":
        return workloads.cnn_training(cfg["arch"], cfg["batch"], device, cfg["insize"],
                                          cfg["classes"])
    if kind == "cnn-infer":
        return workloads.cnn_inference(cfg["arch"], device, cfg["insize"], cfg["classes"])
    if kind == "seq2seq-train":
        args = argparse.Namespace(vocab=cfg["vocab"], units=cfg["units"], layers=cfg["layers"],
                                  sentences=cfg["sentences"], min_length=1, max_length=50,
                                  seed=0, seq2seq_batchsize=cfg["batch"])
        return workloads.seq2seq_training(device, args)
    raise ValueError(f"unknown workload {kind!r}")


def run_child(cfg: dict) -> dict:
    """One configuration in this (fresh) process; returns the measurements.

    One measurement for both pools (:func:`_measures`): once the CUDA context
    exists and before the pool takes anything, an ``OutsideView`` takes its
    baseline and samples ``cudaMemGetInfo`` and NVML on a thread, inside
    iterations as well as at their ends, until the run is over (warm-up,
    profiling and re-plans included); a ``LiveBytes`` hook counts the bytes in
    live blocks.  Each pool's own count is read at iteration ends and reported
    beside them, never compared.  With ``cfg["run_path"]`` a :class:`pgmo.TraceRecorder`
    hears every request and the whole run is written there.
    """
    workloads, measure = _child_imports()
    import chainer

    device_id = cfg["device"]
    gpu = _device_modules(cfg)
    hook = _run_hook(cfg)
    device = chainer.get_device("@numpy" if device_id < 0 else f"@cupy:{device_id}")
    device.use()
    view, live, why = _measures(cfg, gpu)
    result = {"config": cfg, "ok": False, "oom": False, "iterations": 0}
    per_iteration = {"device_peak_bytes": [], "nvml_peak_bytes": [], "own_bytes": [],
                     "live_peak_bytes": [], "ms": []}
    recorder = pool = installed = None
    own = measure.Peak()
    try:
        with hook if hook is not None else contextlib.nullcontext(), \
                live if live is not None else contextlib.nullcontext(), \
                workloads.mirror_for(device_id):
            pool, installed = _child_pool(cfg, workloads)
            count = _own_count(cfg, pool, installed, measure)
            if gpu is not None and gpu.stand_in:
                gpu.device.track(lambda: count() or 0)  # the stand-in device holds the pools
            workload = _build(cfg, workloads, device)
            recorder = measure.Recorder(device_id, pool)
            recorder.start()
            for i in range(cfg["iterations"]):
                if hook is not None:
                    hook.begin()
                with pool.iteration() if pool is not None else contextlib.nullcontext():
                    workload.step()
                if hook is not None:
                    hook.end()
                seconds, _, _ = recorder.record()
                inside = view.mark()
                for key, value in (("device_peak_bytes", inside.get(MEMINFO)),
                                   ("nvml_peak_bytes", inside.get(NVML)),
                                   ("own_bytes", own.add(count())),
                                   ("live_peak_bytes", live.mark() if live else None),
                                   ("ms", round(1e3 * seconds, 3))):
                    per_iteration[key].append(value)
                result["iterations"] = i + 1
        result["ok"] = True
    except Exception as error:  # noqa: BLE001 - an out-of-memory is a result, not a crash
        if not _is_out_of_memory(error):
            raise
        result["oom"] = True
        result["error"] = f"{type(error).__name__}: {error}"[:300]
    finally:
        if installed is not None:
            installed.uninstall()
    outside = view.stop()
    laps = recorder.watch.laps if recorder is not None else []
    timed = laps[cfg["skip"]:]
    result.update({
        "ms_per_iter": 1e3 * statistics.median(timed) if timed else None,
        "timed_iterations": len(timed),
        "laps_ms": [round(1e3 * t, 3) for t in laps],
        # outside every pool, over the whole run: the basis of every comparison
        "taken_device_bytes": view.taken(MEMINFO),
        "taken_nvml_bytes": view.taken(NVML),
        "outside": {**outside, "nvml_source": getattr(view.readers.get(NVML), "source", None),
                    "unavailable": why},
        "live_peak_bytes": live.peak if live is not None else None,
        # each pool's own count: reported, never compared
        "own_peak_bytes": _own_peak(cfg, pool, own, measure),
    })
    if pool is not None:
        stats = pool.stats()
        result["pgmo"] = {k: getattr(stats, k) for k in PGMO_COUNTERS}
        result["pgmo"]["arena_kind"] = arena_kind(stats)
    # The same criterion for both pools: every iteration ran with the limit set
    # on the pool from the start (the pool keeps under it or runs out of memory).
    result["fits"] = bool(result["ok"])
    if hook is not None:
        _save_run(hook, cfg, result, per_iteration, workloads)
    return result


#: Readings of the outside view: ``cudaMemGetInfo``'s used bytes and NVML's.
MEMINFO, NVML = "cudaMemGetInfo", "NVML"
#: pgmo's own counters, reported beside the outside view.
PGMO_COUNTERS = ("mode", "planned_peak", "lower_bound", "arena_bytes", "departed_requests",
                 "reoptimizations", "departures", "planned_requests", "arena_failures",
                 "total_bytes", "peak_total_bytes", "peak_used_bytes")
#: Where a pgmo may say which kind of arena it chose (a reserved range grown in place, or
#: cudaMalloc); the first present is reported.
ARENA_KIND_FIELDS = ("arena_kind", "device_memory", "arena_type")


def arena_kind(stats) -> str | None:
    """The kind of arena the pool chose, if this pgmo's ``stats()`` says (None otherwise)."""
    for name in ARENA_KIND_FIELDS:
        value = getattr(stats, name, None)
        if value is not None:
            return str(value)
    return None


def _device_modules(cfg: dict):
    """The GPU's modules: None on a plain CPU dry run; the stand-ins when the config asks."""
    if cfg.get("stand_ins"):
        from . import gpu_stand_ins

        return gpu_stand_ins.modules()
    if cfg["device"] < 0:
        return None
    import cupy

    return argparse.Namespace(runtime=cupy.cuda.runtime, stand_in=False, nvml=None)


def _measures(cfg: dict, gpu):
    """(the outside view, started; the live-bytes hook or None; why NVML is not read, or "").

    Called once the CUDA context exists (the baseline leaves it out) and
    before the pool takes anything.
    """
    outside_view = examples.load("outside_view")

    device_id = max(cfg["device"], 0)
    readers, why = {}, "CPU dry run"
    if gpu is not None:
        readers[MEMINFO] = outside_view.mem_info_reader(gpu.runtime, device_id)
        readers[MEMINFO]()  # the CUDA context exists from here on
        nvml, why = (gpu.nvml, "") if gpu.stand_in else nvml_probe.load_nvml()
        if nvml is not None:
            readers[NVML] = nvml_probe.NvmlReader(nvml, device_id)
    live = None
    if gpu is not None or cfg.get("live_bytes"):
        live = examples.load("live_bytes").LiveBytes(device_id)
    return outside_view.OutsideView(readers).start(), live, why


def _own_count(cfg: dict, pool, installed, measure):
    """A callable: the bytes the pools say they hold (CuPy's default pool included on a GPU)."""
    if cfg["device"] >= 0:
        return lambda: measure.pool_bytes(cfg["device"], pool)
    if installed is not None and cfg.get("stand_ins"):
        return lambda: installed.stats().total_bytes
    return lambda: None


def _own_peak(cfg: dict, pool, own, measure) -> int | None:
    """The most the pools said they held: pgmo's own ``peak_total_bytes`` (the whole run) plus
    CuPy's default pool; for CuPy's pool, the largest of its totals at iteration ends (its
    cache only grows)."""
    if pool is not None and (cfg["device"] >= 0 or cfg.get("stand_ins")):
        rest = measure.pool_bytes(cfg["device"]) if cfg["device"] >= 0 else 0
        return max(pool.stats().peak_total_bytes + (rest or 0), own.value or 0)
    return own.value


def _run_hook(cfg: dict):
    """A :class:`pgmo.TraceRecorder` to install now (process start) when the configuration
    records its whole run."""
    if not cfg.get("run_path"):
        return None
    from pgmo.trace_recorder import TraceRecorder

    return TraceRecorder()


def _save_run(hook, cfg: dict, result: dict, per_iteration: dict, workloads) -> None:
    """The whole run, with where, when, how and what the pool and the device held."""
    env = workloads.environment(cfg["device"])
    dry = cfg["device"] < 0
    metadata = {
        **env, "model": cfg.get("arch") or "seq2seq", "workload": cfg["workload"],
        "kind": "inference" if cfg["workload"] == "cnn-infer" else "training",
        "batch_size": cfg["batch"], "pool": cfg["pool"], "iterations_run": result["iterations"],
        "out_of_memory": result["oom"], "command": cfg.get("command", ""),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "per_iteration": per_iteration, "outside": result["outside"],
        "pgmo_stats": result.get("pgmo"), "synthetic": dry, "dry_run": dry,
        "recorded_by": "pgmo.TraceRecorder: a CuPy memory hook installed at process start",
    }
    if dry:
        metadata["note"] = workloads.DRY_RUN_NOTE
    path = Path(cfg["run_path"])
    path.parent.mkdir(parents=True, exist_ok=True)
    run = hook.run(max(cfg["device"], 0), **metadata)
    write_run(run, path)
    result["run_file"] = {"path": str(path), "requests": len(run),
                          "iterations": len(run.iterations)}


def child_main(cfg_json: str) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    children.print_result(run_child(json.loads(cfg_json)))
    return 0


# ===================================================================== parent
class Runner:
    """Starts one subprocess per configuration, within the run's time budget."""

    def __init__(self, args):
        self.args = args
        self.started = time.monotonic()
        self.children = 0

    def remaining(self) -> float:
        return self.args.budget - (time.monotonic() - self.started)

    def run_program(self, what: str, command: list[str], cwd: Path | None = None) -> str | None:
        """Run another program of this package (:func:`children.command`) in a subprocess;
        None when it succeeded, else why not."""
        remaining = self.remaining()
        if remaining < 5:
            return "budget"
        timeout = min(self.args.child_timeout, remaining)
        env = children.environment(PYTHONWARNINGS="ignore", PYTHONUNBUFFERED="1")
        start = time.monotonic()
        self.children += 1
        try:
            done = subprocess.run(command, capture_output=True, text=True,
                                  timeout=timeout, env=env, cwd=cwd)
        except subprocess.TimeoutExpired:
            log.warning("%s: timed out after %.0f s", what, timeout)
            return f"timeout {timeout:.0f} s"
        seconds = time.monotonic() - start
        if done.returncode != 0:
            log.warning("%s failed (exit %s) in %.1f s:\n%s", what, done.returncode, seconds,
                        (done.stdout + done.stderr)[-2500:])
            return f"failed (exit {done.returncode})"
        log.info("%s: done in %.1f s", what, seconds)
        return None

    def run(self, cfg: dict) -> dict:
        """The child's result; ``{"skipped": why}`` when it did not run or failed."""
        remaining = self.remaining()
        if remaining < 5:
            return {"skipped": "budget"}
        timeout = min(self.args.child_timeout, remaining)
        command = children.command("bench_memory", "--child", json.dumps(cfg))
        env = children.environment(PYTHONWARNINGS="ignore", PYTHONUNBUFFERED="1")
        start = time.monotonic()
        self.children += 1
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                                  env=env)
        except subprocess.TimeoutExpired:
            log.warning("%s: timed out after %.0f s", describe(cfg), timeout)
            return {"skipped": f"timeout {timeout:.0f} s"}
        seconds = time.monotonic() - start
        result = children.result_of(done.stdout)
        if result is not None:
            result["seconds"] = seconds
            log.info("%s: %s in %.1f s", describe(cfg),
                     "fits" if result["fits"] else ("OOM" if result["oom"] else "done"),
                     seconds)
            return result
        log.warning("%s failed (exit %s) in %.1f s:\n%s", describe(cfg), done.returncode,
                    seconds, (done.stdout + done.stderr)[-2500:])
        return {"skipped": f"failed (exit {done.returncode})"}


def describe(cfg: dict) -> str:
    what = cfg.get("arch") or "seq2seq"
    limit = f" limit {cfg['limit'] / 2**20:.0f} MiB" if cfg.get("limit") else ""
    return f"{what} {cfg['workload']} b{cfg['batch']} {cfg['pool']}{limit}"


def base_config(args) -> dict:
    return {"device": args.device, "iterations": args.iterations, "skip": args.skip,
            "method": args.method, "time_limit": args.time_limit, "classes": args.classes,
            "vocab": args.vocab, "units": args.units, "layers": args.layers,
            "sentences": args.sentences, "limit": 0}


def insize_of(args, arch: str) -> int | None:
    """The image size asked for; None: the model's own (the child knows it)."""
    if args.insize:
        return args.insize
    if args.device >= 0:
        return None
    from .chainer_workloads import TINY_INSIZE  # the smallest the models accept

    return TINY_INSIZE[arch]


# ------------------------------------------------------------------ the parts
def part_memory(args, runner, batches, inference: bool) -> list:
    """Figure 2 (memory) and 3 (speed): models at ``batches`` (and batch-1 inference), each pool.

    Returns ``(config, result)`` pairs.
    """
    runs = []
    plans = [("cnn-train", arch, batch) for batch in batches for arch in args.arch]
    if inference:
        plans += [("cnn-infer", arch, 1) for arch in args.arch]
    for workload, arch, batch in plans:
        for pool in args.pools:
            cfg = {**base_config(args), "workload": workload, "arch": arch, "batch": batch,
                   "insize": insize_of(args, arch), "pool": pool}
            runs.append((cfg, runner.run(cfg)))
    return runs


def part_repeats(args, runner, runs: list) -> list:
    """More runs of the configurations that ran to the end, up to ``--repeats`` each.

    Last of all and shortest first, so that the budget buys as many as it
    can and a cut loses repeats, never a configuration.  Returns the runs
    with each configuration's results combined (:func:`combine`).
    """
    more: dict[int, list] = {k: [] for k in range(len(runs))}
    order = sorted((k for k, (_, result) in enumerate(runs) if result.get("ok")),
                   key=lambda k: runs[k][1].get("seconds", 0))
    for _ in range(args.repeats - 1):
        for k in order:
            result = runner.run(runs[k][0])
            if "skipped" in result and result["skipped"] == "budget":
                break
            more[k].append(result)
    return [(cfg, combine([result, *more[k]])) for k, (cfg, result) in enumerate(runs)]


def part_seq2seq(args, runner) -> list:
    """seq2seq: memory after ``--seq2seq-iterations`` variable-length batches, each pool."""
    rows = []
    for pool in args.pools:
        cfg = {**base_config(args), "workload": "seq2seq-train", "arch": None,
               "batch": args.seq2seq_batchsize, "pool": pool,
               "iterations": args.seq2seq_iterations}
        rows.append(seq2seq_row(args, cfg, runner.run(cfg)))
    return rows


def part_runs(args, runner, command: str) -> list:
    """Whole runs, every request from process start, of one CNN and seq2seq, each pool."""
    recorded = []
    workloads = [{"workload": "cnn-train", "arch": arch, "batch": args.batchsize[0],
                  "insize": insize_of(args, arch)} for arch in args.run_arch]
    if args.seq2seq_iterations:
        workloads.append({"workload": "seq2seq-train", "arch": None,
                          "batch": args.seq2seq_batchsize})
    dry = ".dry-run" if args.device < 0 else ""
    for workload in workloads:
        for pool in args.pools:
            name = f"{workload['arch'] or 'seq2seq'}-train-b{workload['batch']}-{pool}"
            cfg = {**base_config(args), **workload, "pool": pool,
                   "iterations": args.run_iterations, "command": command,
                   "run_path": str((args.run_dir / f"{name}{dry}.run.json.gz").resolve())}
            recorded.append((cfg, runner.run(cfg)))
    return recorded


def part_recompute(args, runner) -> str:
    """DenseNet-BC, recomputation off and on, under each pool: the traces' Markdown table."""
    from . import recompute_table

    with contextlib.ExitStack() as stack:
        out_dir = args.trace_dir or Path(stack.enter_context(
            tempfile.TemporaryDirectory(prefix="pgmo-densenet-")))
        out_dir.mkdir(parents=True, exist_ok=True)
        # Run in the output folder: the command the traces record names no path.
        command = children.command("record_traces", "--device", args.device, "--out-dir", ".",
                                   "--arch", "--batchsize", "--densenet",
                                   args.densenet_batchsize)
        failed = runner.run_program(f"densenet b{args.densenet_batchsize} traces", command,
                                    cwd=out_dir)
        entries = recompute_table.analyse(recompute_table.find_traces([out_dir]), args.method,
                                          args.time_limit)
    text = recompute_table.section(entries, args.method, args.time_limit)
    if failed:
        text += f"\nRecording stopped early ({failed}): the table holds what was written.\n"
    return text


def largest_fitting_batch(fits, high: int, probes: int):
    """Bisect (geometrically while the bracket is wide) for the largest batch that fits.

    ``fits(batch)`` is True, False or None (could not tell; the search stops).
    Returns ``(lo, hi, probes used)``: ``lo`` fits (0: none known), ``hi`` does not
    (``high + 1``: none known); exact when ``hi == lo + 1``.
    """
    lo, hi, used = 0, high + 1, 0
    while hi - lo > 1 and used < probes:
        mid = int(round(math.sqrt(max(lo, 1) * hi))) if hi > 4 * max(lo, 1) else (lo + hi) // 2
        mid = min(max(mid, lo + 1), hi - 1)
        answer = fits(mid)
        used += 1
        if answer is None:
            break
        if answer:
            lo = mid
        else:
            hi = mid
    return lo, hi, used


def fit_text(lo: int, hi: int, high: int) -> str:
    if hi == lo + 1:
        if lo == 0:
            return "none (batch 1 does not fit)"
        return str(lo) if hi <= high else f">= {lo} (search max)"
    if lo == 0 and hi > high:
        return "unknown (no probe ran)"
    return f"between {lo} and {hi - 1}" if lo else f"below {hi}"


def part_search(args, runner) -> tuple[list, list]:
    rows, log_lines = [], []
    for arch in args.search_arch:
        for pool in args.pools:
            def fits(batch, arch=arch, pool=pool):
                cfg = {**base_config(args), "workload": "cnn-train", "arch": arch,
                       "batch": batch, "insize": insize_of(args, arch), "pool": pool,
                       "iterations": args.search_iterations, "limit": args.memory_limit}
                result = runner.run(cfg)
                answer = None if "skipped" in result else bool(result["fits"])
                said = "fits" if answer else result.get("skipped", "does not fit")
                if "pgmo" in result and args.device >= 0:
                    said += f" (pgmo ended {result['pgmo']['mode']})"
                log_lines.append(f"{arch} {pool} batch {batch}: {said}")
                log.info("search %s", log_lines[-1])
                return answer

            lo, hi, used = largest_fitting_batch(fits, args.search_max, args.search_probes)
            rows.append((arch, mib(args.memory_limit), pool,
                         gpu_cell(args, fit_text(lo, hi, args.search_max)), used))
    return rows, log_lines


# ------------------------------------------------------------------ the report
def environment(args) -> dict:
    code = ("import json, platform, numpy, cupy; env = {'python': platform.python_version(), "
            "'numpy': numpy.__version__, 'cupy': cupy.__version__}\n"
            "import pgmo, pgmo.chainer, chainer; env.update(pgmo=pgmo.__version__, "
            "chainer=chainer.__version__)\n"
            f"d = {args.device}\n"
            "if d >= 0:\n"
            "    p = cupy.cuda.runtime.getDeviceProperties(d); n = p['name']\n"
            "    env['device'] = n.decode() if isinstance(n, bytes) else str(n)\n"
            "    env['device memory'] = f\"{p['totalGlobalMem'] / 2**30:.1f} GiB\"\n"
            "    env['CUDA runtime'] = cupy.cuda.runtime.runtimeGetVersion()\n"
            "print(json.dumps(env))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=children.environment(PYTHONWARNINGS="ignore"), timeout=120)
    env = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else {}
    if args.device < 0:
        env["device"] = f"CPU ({platform.machine()}), DRY RUN: no GPU numbers"
        env["nvml"] = "not used in a CPU dry run"
    else:
        interval = examples.load("outside_view").INTERVAL
        nvml, why = nvml_probe.load_nvml()
        env["nvml"] = (f"cudaMemGetInfo and NVML sampled every {interval * 1e3:g} ms and at "
                       "iteration ends, the same for both pools" if nvml else
                       f"cudaMemGetInfo sampled every {interval * 1e3:g} ms and at iteration "
                       f"ends, the same for both pools; NVML unavailable ({why}): its "
                       "columns read -")
    return env


# ------------------------------------------------------------------ arguments
def parse_size(text: str) -> int:
    match = re.fullmatch(r"\s*([0-9.]+)\s*([a-zA-Z]*)\s*", text)
    if not match or match.group(2).lower() not in SIZE_UNITS:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 2GiB, 512MiB)")
    return int(float(match.group(1)) * SIZE_UNITS[match.group(2).lower()])


def parse_args(argv=None):
    parser = programs.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", "-d", type=int, default=0,
                        help="GPU id, or -1 for a CPU dry run at tiny sizes")
    parser.add_argument("--arch", nargs="*", choices=ARCHS, default=list(ARCHS))
    parser.add_argument("--batchsize", "-b", nargs="*", type=programs.integer(1),
                        default=[32, 64, 128])
    parser.add_argument("--no-inference", dest="inference", action="store_false",
                        help="leave out the batch-1 inference rows")
    parser.add_argument("--pools", nargs="+", choices=POOLS, default=list(POOLS))
    parser.add_argument("--iterations", "-i", type=programs.integer(1), default=7)
    parser.add_argument("--repeats", type=programs.integer(1), default=3,
                        help="runs per configuration of the memory and time tables, each a "
                             "fresh process (the repeats come last, shortest first, as the "
                             "budget allows)")
    parser.add_argument("--skip", type=programs.non_negative_int, default=2,
                        help="iterations left out of the time (pgmo: warm-up, profiling)")
    parser.add_argument("--memory-limit", type=parse_size, default=parse_size("4GiB"))
    parser.add_argument("--search-arch", nargs="*", choices=ARCHS, default=["resnet50"],
                        help="models whose largest batch under the limit is searched")
    parser.add_argument("--search-max", type=programs.integer(1), default=1024)
    parser.add_argument("--search-probes", type=programs.integer(1), default=6,
                        help="processes per (model, pool) in the search, at most")
    parser.add_argument("--search-iterations", type=programs.integer(1), default=4)
    parser.add_argument("--seq2seq-iterations", type=programs.integer(0), default=30,
                        help="0: no seq2seq")
    parser.add_argument("--seq2seq-batchsize", type=programs.integer(1), default=64)
    parser.add_argument("--vocab", type=programs.integer(3), default=40000)
    parser.add_argument("--units", type=programs.integer(1), default=512)
    parser.add_argument("--layers", type=programs.integer(1), default=3)
    parser.add_argument("--sentences", type=programs.integer(1), default=4000)
    parser.add_argument("--densenet-batchsize", type=programs.integer(0), default=64,
                        help="DenseNet-BC batch of the recomputation table (0: no table)")
    parser.add_argument("--trace-dir", type=programs.output_folder,
                        help="keep the DenseNet-BC traces here (default: a temporary folder)")
    parser.add_argument("--run-dir", type=programs.output_folder,
                        help="also record whole runs (every malloc and free from process "
                             "start, iterations marked) of --run-arch and seq2seq training "
                             "under each pool, as run files in this folder")
    parser.add_argument("--run-arch", nargs="*", choices=ARCHS, default=["resnet50"],
                        help="CNNs whose whole run is recorded (at the first --batchsize)")
    parser.add_argument("--run-iterations", type=programs.integer(1), default=10,
                        help="iterations of each whole run recorded")
    parser.add_argument("--insize", type=programs.integer(1),
                        help="image size (default: the model's)")
    parser.add_argument("--classes", type=programs.integer(1), default=1000)
    parser.add_argument("--method", default="best", choices=("bestfit", "best", "exact"),
                        help="pgmo's solver")
    parser.add_argument("--time-limit", type=programs.non_negative_float, default=2.0,
                        help="pgmo solver seconds")
    parser.add_argument("--budget", type=programs.non_negative_float, default=480.0,
                        help="seconds for the whole run; later configurations are skipped")
    parser.add_argument("--child-timeout", type=programs.non_negative_float, default=150.0)
    parser.add_argument("--output", "-o", type=programs.output_file,
                        help="also write the report here")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is None:
        if args.iterations <= args.skip:
            parser.error("--iterations must exceed --skip")
        if args.device < 0:
            tiny(args, parser)
    return args


def tiny(args, parser) -> None:
    """Dry-run sizes, unless given: the CPU runs the path, not the experiment."""
    defaults = {k: parser.get_default(k) for k in vars(args)}
    small = {"batchsize": [2], "classes": 10, "vocab": 50, "units": 16, "layers": 1,
             "sentences": 40, "seq2seq_batchsize": 4, "seq2seq_iterations": 4,
             "iterations": 3, "skip": 1, "search_max": 8, "search_probes": 3,
             "search_iterations": 3, "memory_limit": 96 * 2**20, "time_limit": 1.0,
             "densenet_batchsize": 2, "repeats": 2, "run_iterations": 3,
             "arch": ["alexnet"], "search_arch": ["alexnet"], "run_arch": ["alexnet"]}
    for key, value in small.items():
        if getattr(args, key) == defaults[key]:
            setattr(args, key, value)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.child is not None:
        return child_main(args.child)
    if args.device >= 0:  # every child would fail alike, each with the driver's traceback
        needs_gpu.require_gpu(args.device, instead="--device -1 runs it on the CPU (a dry run)")
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    command = shlex.join(["python", "-m", "scripts.bench_memory", *argv])
    env = environment(args)
    log.info("device: %s; budget %.0f s", env.get("device", "unknown"), args.budget)
    runner = Runner(args)
    # Order of work: a bit of every part first, so that a budget cut loses the
    # largest batch sizes, not whole parts.  Tables are sorted afterwards.
    timings = {}
    start = time.monotonic()
    memory_runs = part_memory(args, runner, args.batchsize[:1], args.inference)
    timings["memory and time, first batch size and inference"] = time.monotonic() - start
    start = time.monotonic()
    seq_rows = part_seq2seq(args, runner) if args.seq2seq_iterations else []
    timings["seq2seq"] = time.monotonic() - start
    recompute = ""
    if args.densenet_batchsize:
        start = time.monotonic()
        recompute = part_recompute(args, runner)
        timings["recomputation"] = time.monotonic() - start
    start = time.monotonic()
    search_rows, search_log = part_search(args, runner)
    timings["largest batch"] = time.monotonic() - start
    recorded = []
    if args.run_dir is not None:
        start = time.monotonic()
        recorded = part_runs(args, runner, command)
        timings["whole runs"] = time.monotonic() - start
    start = time.monotonic()
    memory_runs += part_memory(args, runner, args.batchsize[1:], False)
    timings["memory and time, other batch sizes"] = time.monotonic() - start
    if args.repeats > 1:
        start = time.monotonic()
        memory_runs = part_repeats(args, runner, memory_runs)
        timings["repeats"] = time.monotonic() - start
    else:
        memory_runs = [(cfg, combine([result])) for cfg, result in memory_runs]
    timings["total"] = time.monotonic() - runner.started
    memory_runs.sort(key=run_order)
    text = report(args, env, (memory_runs, seq_rows, search_rows, search_log), timings,
                  command, recompute, recorded)
    print(text)
    for part, seconds in timings.items():
        log.info("%s: %.1f s", part, seconds)
    if args.output is not None:
        args.output.write_text(text + "\n")
        log.info("wrote %s", args.output)
    return 0


if __name__ == "__main__":
    sys.exit(programs.run(main))
