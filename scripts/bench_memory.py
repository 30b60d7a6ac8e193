#!/usr/bin/env python
"""The paper's memory and speed experiments (Figures 2 and 3) in one run: stock pool vs pgmo.

For each model and batch size, and for each pool, a fresh subprocess trains
(or infers) for ``--iterations`` steps with every allocation going through
that pool (it is installed before the model is built) and reports: peak
device memory in use (``cupy.cuda.runtime.memGetInfo``, CUDA context
included), peak pool total bytes, pgmo's planned peak against the profile's
lower bound, and the median time per iteration after ``--skip`` warm-up
iterations.  Then, per ``--search-arch``, a bounded binary search finds the
largest training batch that runs under ``--memory-limit`` (``set_limit``) with
each pool, and seq2seq trains ``--seq2seq-iterations`` variable-length
batches, reporting memory after them, time and pgmo's re-optimizations.
Last, ``scripts/record_traces.py --densenet`` records DenseNet-BC at
``--densenet-batchsize`` with and without recomputation, under each pool, and
``scripts/recompute_table.py`` tabulates the traces (lower bound, best-fit and
best plans, stock pool reserved).
Markdown tables go to stdout and, with ``-o``, to a file with the command,
device, versions and date::

    python scripts/bench_memory.py --device 0 -o docs/results.md
    python scripts/bench_memory.py --device 0 --arch resnet50 --batchsize 32 \\
        --search-arch resnet50 --seq2seq-iterations 0        # a quick look
    python scripts/bench_memory.py --device -1               # CPU dry run, tiny sizes

``--device -1`` runs the same subprocesses at tiny sizes on the CPU, where
Chainer's NumPy arrays reach the pools only through the stand-in hook of
``record_traces.NumpyMirror``; every number that needs a GPU reads
``n/a (CPU)``.  ``--budget`` bounds the whole run: configurations not started
in time are listed as skipped.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import logging
import math
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
NA = "n/a (CPU)"
RESULT_TAG = "BENCH-RESULT "
ARCHS = ("alexnet", "googlenet", "resnet50", "inception-resnet-v2")
POOLS = ("stock", "pgmo")
SIZE_UNITS = {"": 1, "b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "kb": 10**3,
              "mb": 10**6, "gb": 10**9}

log = logging.getLogger("bench_memory")


# ====================================================================== child
def _child_imports():
    """Chainer, the examples and the workloads: only the subprocesses need them."""
    sys.path.insert(0, str(HERE))
    import record_traces  # also puts examples/ on sys.path and patches Chainer's imports

    import measure

    return record_traces, measure


def _is_out_of_memory(error: BaseException) -> bool:
    import cupy

    if isinstance(error, (cupy.cuda.memory.OutOfMemoryError, MemoryError)):
        return True
    status = getattr(error, "status", None)  # CUDARuntimeError: cudaErrorMemoryAllocation
    if status == 2 and "CUDARuntimeError" in type(error).__name__:
        return True
    return "ALLOC_FAILED" in str(error)  # cuBLAS, cuSOLVER, cuDNN: no room for a workspace


def _child_pool(cfg: dict):
    """(pgmo pool or None, stand-in allocator for the dry run's mirror or None)."""
    dry = cfg["device"] < 0
    if cfg["pool"] == "pgmo":
        options = {"warmup": 1, "method": cfg["method"], "time_limit": cfg["time_limit"]}
        if dry:
            from pgmo.testing import host_pool

            pool = host_pool(**options)
        else:
            import pgmo

            pool = pgmo.ProfileGuidedMemoryPool(**options)
        return pool, pool
    if dry:  # a caching host pool stands in for CuPy's stock pool
        from pgmo.testing import HostFallback, HostMemory

        return None, HostFallback(HostMemory())
    return None, None


def _build(cfg: dict, record_traces, device):
    kind = cfg["workload"]
    if cfg.get("arch") and not cfg.get("insize"):
        from models import ARCHS

        cfg = {**cfg, "insize": ARCHS[cfg["arch"]].insize}
    if kind == "cnn-train":
        return record_traces.cnn_training(cfg["arch"], cfg["batch"], device, cfg["insize"],
                                          cfg["classes"])
    if kind == "cnn-infer":
        return record_traces.cnn_inference(cfg["arch"], device, cfg["insize"], cfg["classes"])
    if kind == "seq2seq-train":
        args = argparse.Namespace(vocab=cfg["vocab"], units=cfg["units"], layers=cfg["layers"],
                                  sentences=cfg["sentences"], min_length=1, max_length=50,
                                  seed=0, seq2seq_batchsize=cfg["batch"])
        return record_traces.seq2seq_training(device, args)
    raise ValueError(f"unknown workload {kind!r}")


def run_child(cfg: dict) -> dict:
    """One configuration in this (fresh) process; returns the measurements."""
    record_traces, measure = _child_imports()
    import chainer
    import cupy

    device_id = cfg["device"]
    device = chainer.get_device("@numpy" if device_id < 0 else f"@cupy:{device_id}")
    device.use()
    limit = cfg.get("limit") or 0
    pool, stand_in = _child_pool(cfg)
    if pool is not None:
        pool.install()  # before the model: weights and optimizer state go through it too
    elif limit and stand_in is None:
        cupy.get_default_memory_pool().set_limit(size=limit)
    if stand_in is not None and pool is None and limit:
        stand_in.set_limit(size=limit)
    result = {"config": cfg, "ok": False, "oom": False, "iterations": 0}
    mirror = record_traces.NumpyMirror(stand_in) if device_id < 0 else contextlib.nullcontext()
    baseline = measure.device_bytes_in_use(device_id)
    recorder = None
    limited = pool is None  # pgmo's limit starts with its plan (see --memory-limit)
    limited_iterations = 0
    limited_max_total = 0  # pgmo's total bytes in the iterations run under the limit
    try:
        with mirror:
            workload = _build(cfg, record_traces, device)
            recorder = measure.Recorder(device_id, pool)
            recorder.start()
            for i in range(cfg["iterations"]):
                if not limited and pool.mode == "optimized":
                    if limit:
                        pool.set_limit(size=limit)
                    limited = True
                with pool.iteration() if pool is not None else contextlib.nullcontext():
                    workload.step()
                recorder.record()
                result["iterations"] = i + 1
                if limited:
                    limited_iterations += 1
                    if pool is not None:
                        limited_max_total = max(limited_max_total, pool.total_bytes())
        result["ok"] = True
    except Exception as error:  # noqa: BLE001 - an out-of-memory is a result, not a crash
        if not _is_out_of_memory(error):
            raise
        result["oom"] = True
        result["error"] = f"{type(error).__name__}: {error}"[:300]
    finally:
        if pool is not None:
            pool.uninstall()
    laps = recorder.watch.laps if recorder is not None else []
    timed = laps[cfg["skip"]:]
    result.update({
        "ms_per_iter": 1e3 * statistics.median(timed) if timed else None,
        "timed_iterations": len(timed),
        "peak_pool_bytes": recorder.peak_pool.value if recorder else None,
        "peak_device_bytes": recorder.peak_device.value if recorder else None,
        "baseline_device_bytes": baseline,
        "final_pool_bytes": measure.pool_bytes(device_id, pool),
        "final_device_bytes": measure.device_bytes_in_use(device_id),
    })
    if pool is not None:
        stats = pool.stats().as_dict()
        result["pgmo"] = {k: stats[k] for k in (
            "mode", "planned_peak", "lower_bound", "arena_bytes", "fallback_requests",
            "reoptimizations", "departures", "planned_requests", "arena_failures",
            "total_bytes")}
        result["limited_max_total_bytes"] = limited_max_total
    # A batch fits when iterations ran under the limit (for pgmo: once it had a
    # plan; served from the arena or, if the arena was refused, its fallback).
    result["fits"] = bool(result["ok"] and limited_iterations > 0
                          and (pool is None or not limit or limited_max_total <= limit))
    result["limited_iterations"] = limited_iterations
    return result


def child_main(cfg_json: str) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    result = run_child(json.loads(cfg_json))
    print(RESULT_TAG + json.dumps(result), flush=True)
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

    def run_script(self, what: str, argv: list[str], cwd: Path | None = None) -> str | None:
        """Run a Python script in a subprocess; None when it succeeded, else why not."""
        remaining = self.remaining()
        if remaining < 5:
            return "budget"
        timeout = min(self.args.child_timeout, remaining)
        env = dict(os.environ, PYTHONWARNINGS="ignore", PYTHONUNBUFFERED="1")
        start = time.monotonic()
        self.children += 1
        try:
            done = subprocess.run([sys.executable, *argv], capture_output=True, text=True,
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
        command = [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(cfg)]
        env = dict(os.environ, PYTHONWARNINGS="ignore", PYTHONUNBUFFERED="1")
        start = time.monotonic()
        self.children += 1
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                                  env=env)
        except subprocess.TimeoutExpired:
            log.warning("%s: timed out after %.0f s", describe(cfg), timeout)
            return {"skipped": f"timeout {timeout:.0f} s"}
        seconds = time.monotonic() - start
        for line in done.stdout.splitlines():
            if line.startswith(RESULT_TAG):
                result = json.loads(line[len(RESULT_TAG):])
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
    return TINY_INSIZE[arch] if args.device < 0 else None


#: Smallest image sizes the models accept: the CPU dry run's.
TINY_INSIZE = {"alexnet": 39, "googlenet": 32, "resnet50": 32, "inception-resnet-v2": 75}


# ------------------------------------------------------------------ formatting
def mib(value) -> str:
    return "-" if value is None else f"{value / 2**20:,.1f}"


def gpu_cell(args, text: str) -> str:
    """Numbers measured in a dry run are stand-ins: never print them as results."""
    return NA if args.device < 0 else text


def markdown(columns, rows) -> str:
    lines = ["| " + " | ".join(columns) + " |",
             "|" + "|".join("---" if i == 0 else "---:" for i in range(len(columns))) + "|"]
    lines += ["| " + " | ".join(str(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


MEMORY_COLUMNS = ("model", "task", "batch", "pool", "peak device in use (MiB)",
                  "peak pool total (MiB)", "planned peak (MiB)", "lower bound (MiB)",
                  "planned / bound", "ms/iter", "pgmo mode", "fallback reqs")


def memory_row(args, cfg, result) -> tuple:
    head = (cfg["arch"], "train" if cfg["workload"] == "cnn-train" else "inference",
            cfg["batch"], cfg["pool"])
    if "skipped" in result:
        return head + (f"skipped: {result['skipped']}",) + ("",) * 7
    if not result["ok"]:
        return head + (f"out of memory at iteration {result['iterations'] + 1}",) + ("",) * 7
    stats = result.get("pgmo")
    planned = lower = ratio = mode = fallbacks = "-"
    if stats:
        planned, lower = mib(stats["planned_peak"]), mib(stats["lower_bound"])
        ratio = (f"{stats['planned_peak'] / stats['lower_bound']:.3f}"
                 if stats["lower_bound"] else "-")
        mode, fallbacks = stats["mode"], stats["fallback_requests"]
    ms = "-" if result["ms_per_iter"] is None else f"{result['ms_per_iter']:.1f}"
    return head + tuple(gpu_cell(args, str(v)) for v in (
        mib(result["peak_device_bytes"]), mib(result["peak_pool_bytes"]), planned, lower,
        ratio, ms, mode, fallbacks))


SEQ2SEQ_COLUMNS = ("pool", "batch", "iterations", "pool total after (MiB)",
                   "device in use after (MiB)", "ms/iter", "re-optimizations",
                   "fallback reqs", "departures")


def seq2seq_row(args, cfg, result) -> tuple:
    head = (cfg["pool"], cfg["batch"])
    if "skipped" in result:
        return head + (f"skipped: {result['skipped']}",) + ("",) * 6
    if not result["ok"]:
        return head + (f"out of memory at iteration {result['iterations'] + 1}",) + ("",) * 6
    stats = result.get("pgmo") or {}
    ms = "-" if result["ms_per_iter"] is None else f"{result['ms_per_iter']:.1f}"
    return head + (result["iterations"],) + tuple(gpu_cell(args, str(v)) for v in (
        mib(result["final_pool_bytes"]), mib(result["final_device_bytes"]), ms,
        stats.get("reoptimizations", "-"), stats.get("fallback_requests", "-"),
        stats.get("departures", "-")))


SEARCH_COLUMNS = ("model", "memory limit (MiB)", "pool", "largest batch that fits", "probes")


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


def run_order(run) -> tuple:
    cfg = run[0]
    return (ARCHS.index(cfg["arch"]), cfg["workload"] != "cnn-train", cfg["batch"],
            POOLS.index(cfg["pool"]))


COMPARE_COLUMNS = ("model", "task", "batch", "device peak stock / pgmo (MiB)",
                   "pool total stock / pgmo (MiB)", "pool memory saved",
                   "ms/iter stock / pgmo", "time pgmo / stock")


def comparison_rows(args, runs) -> list:
    """Figures 2 and 3 side by side: one row per configuration run with both pools."""
    by_config: dict = {}
    for cfg, result in runs:
        key = (cfg["arch"], cfg["workload"], cfg["batch"])
        by_config.setdefault(key, {})[cfg["pool"]] = result
    rows = []
    for (arch, workload, batch), results in by_config.items():
        stock, ours = results.get("stock"), results.get("pgmo")
        if not (stock and ours and stock.get("ok") and ours.get("ok")):
            continue
        head = (arch, "train" if workload == "cnn-train" else "inference", batch)
        if args.device < 0:
            rows.append(head + (NA,) * 5)
            continue
        saved = time_ratio = "-"
        if stock["peak_pool_bytes"] and ours["peak_pool_bytes"] is not None:
            saved = f"{100 * (1 - ours['peak_pool_bytes'] / stock['peak_pool_bytes']):.1f} %"
        if stock["ms_per_iter"] and ours["ms_per_iter"] is not None:
            time_ratio = f"{ours['ms_per_iter'] / stock['ms_per_iter']:.3f}"
        ms = ["-" if r["ms_per_iter"] is None else f"{r['ms_per_iter']:.1f}"
              for r in (stock, ours)]
        rows.append(head + (
            f"{mib(stock['peak_device_bytes'])} / {mib(ours['peak_device_bytes'])}",
            f"{mib(stock['peak_pool_bytes'])} / {mib(ours['peak_pool_bytes'])}",
            saved, f"{ms[0]} / {ms[1]}", time_ratio))
    return rows


def part_seq2seq(args, runner) -> list:
    """seq2seq: memory after ``--seq2seq-iterations`` variable-length batches, each pool."""
    rows = []
    for pool in args.pools:
        cfg = {**base_config(args), "workload": "seq2seq-train", "arch": None,
               "batch": args.seq2seq_batchsize, "pool": pool,
               "iterations": args.seq2seq_iterations}
        rows.append(seq2seq_row(args, cfg, runner.run(cfg)))
    return rows


def part_recompute(args, runner) -> str:
    """DenseNet-BC, recomputation off and on, under each pool: the traces' Markdown table."""
    sys.path.insert(0, str(HERE))
    import recompute_table

    with contextlib.ExitStack() as stack:
        out_dir = args.trace_dir or Path(stack.enter_context(
            tempfile.TemporaryDirectory(prefix="pgmo-densenet-")))
        out_dir.mkdir(parents=True, exist_ok=True)
        # Run in the output folder: the command the traces record names no path.
        argv = [str(HERE / "record_traces.py"), "--device", str(args.device), "--out-dir", ".",
                "--arch", "--batchsize", "--densenet", str(args.densenet_batchsize)]
        failed = runner.run_script(f"densenet b{args.densenet_batchsize} traces", argv,
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
                log_lines.append(f"{arch} {pool} batch {batch}: "
                                 f"{'fits' if answer else result.get('skipped', 'does not fit')}")
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
                          env=dict(os.environ, PYTHONWARNINGS="ignore"), timeout=120)
    env = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else {}
    if args.device < 0:
        env["device"] = f"CPU ({platform.machine()}), DRY RUN: no GPU numbers"
    return env


def report(args, env, parts, timings, command, recompute: str = "") -> str:
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    out = ["# pgmo against CuPy's stock memory pool", ""]
    if args.device < 0:
        out += ["**CPU DRY RUN**: the subprocesses ran at tiny sizes on NumPy; "
                f"every number that needs a GPU reads `{NA}`.", ""]
    out += [f"- command: `{command}`",
            f"- device: {env.get('device', 'unknown')}"
            + (f" ({env['device memory']}, CUDA runtime {env['CUDA runtime']})"
               if "device memory" in env else ""),
            "- versions: " + ", ".join(f"{k} {env[k]}" for k in
                                       ("pgmo", "cupy", "chainer", "numpy", "python")
                                       if k in env),
            f"- date: {date}",
            f"- pgmo solver: `{args.method}`, time limit {args.time_limit} s; "
            f"{args.iterations} iterations per run; ms/iter = median of the last "
            f"{args.iterations - args.skip}, leaving out the first {args.skip} "
            "(pgmo's warm-up and profiled iterations, and the same for the stock pool)",
            "- time per part: " + ", ".join(f"{k} {v:.0f} s" for k, v in timings.items()),
            ""]
    memory_runs, seq_rows, search_rows, search_log = parts
    memory_rows = [memory_row(args, cfg, result) for cfg, result in memory_runs]
    compare = comparison_rows(args, memory_runs)
    if compare:
        out += ["## Stock pool and pgmo side by side (Figures 2 and 3)", "",
                "From the runs of the next table: peaks of device memory in use and of the "
                "pools' total bytes, the share of pool memory pgmo saves, and the median "
                "time per iteration.", "", markdown(COMPARE_COLUMNS, compare), ""]
    if memory_rows:
        out += ["## Memory and time per iteration, every run", "",
                "Each row is a fresh process whose every allocation goes through the pool "
                "named (installed before the model is built).  *Peak device in use*: "
                "total minus free device memory (`memGetInfo`) at iteration ends, CUDA "
                "context and libraries included.  *Peak pool total*: bytes the pools hold "
                "from `cudaMalloc`; for pgmo both are taken once it answers from its plan "
                "(after releasing the cache its profiled iteration left in its fallback).",
                "", markdown(MEMORY_COLUMNS, memory_rows), ""]
    if search_rows:
        out += ["## Largest training batch under a memory limit", "",
                f"`set_limit({args.memory_limit})` on the pool under test, batch sizes "
                f"1-{args.search_max} bisected with at most {args.search_probes} probes, "
                f"each a fresh process running {args.search_iterations} iterations.  pgmo "
                "profiles its first iterations on its fallback (a stock pool), so its limit "
                "is set once it has a plan, and a batch fits when the iterations after that "
                "run and its total bytes stay under the limit (an arena the limit refuses "
                "leaves pgmo serving from its fallback): profiling once needs the memory "
                "the stock pool needs.", "",
                markdown(SEARCH_COLUMNS, search_rows), ""]
        if search_log:
            out += ["<details><summary>probes</summary>", "", *[f"- {line}" for line in
                                                                search_log],
                    "", "</details>", ""]
    if seq_rows:
        out += ["## seq2seq: variable-length batches", "",
                f"NStepLSTM encoder-decoder, vocabulary {args.vocab}, {args.layers} x "
                f"{args.units} units, sentences of 1-50 words; memory after the last of the "
                "iterations.", "", markdown(SEQ2SEQ_COLUMNS, seq_rows), ""]
    if recompute:
        out.append(recompute)
    return "\n".join(out)


# ------------------------------------------------------------------ arguments
def parse_size(text: str) -> int:
    match = re.fullmatch(r"\s*([0-9.]+)\s*([a-zA-Z]*)\s*", text)
    if not match or match.group(2).lower() not in SIZE_UNITS:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 2GiB, 512MiB)")
    return int(float(match.group(1)) * SIZE_UNITS[match.group(2).lower()])


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", "-d", type=int, default=0,
                        help="GPU id, or -1 for a CPU dry run at tiny sizes")
    parser.add_argument("--arch", nargs="*", choices=ARCHS, default=list(ARCHS))
    parser.add_argument("--batchsize", "-b", nargs="*", type=int, default=[32, 64, 128])
    parser.add_argument("--no-inference", dest="inference", action="store_false",
                        help="leave out the batch-1 inference rows")
    parser.add_argument("--pools", nargs="+", choices=POOLS, default=list(POOLS))
    parser.add_argument("--iterations", "-i", type=int, default=7)
    parser.add_argument("--skip", type=int, default=2,
                        help="iterations left out of the time (pgmo: warm-up, profiling)")
    parser.add_argument("--memory-limit", type=parse_size, default=parse_size("4GiB"))
    parser.add_argument("--search-arch", nargs="*", choices=ARCHS, default=["resnet50"],
                        help="models whose largest batch under the limit is searched")
    parser.add_argument("--search-max", type=int, default=1024)
    parser.add_argument("--search-probes", type=int, default=6,
                        help="processes per (model, pool) in the search, at most")
    parser.add_argument("--search-iterations", type=int, default=4)
    parser.add_argument("--seq2seq-iterations", type=int, default=30, help="0: no seq2seq")
    parser.add_argument("--seq2seq-batchsize", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=40000)
    parser.add_argument("--units", type=int, default=512)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--sentences", type=int, default=4000)
    parser.add_argument("--densenet-batchsize", type=int, default=64,
                        help="DenseNet-BC batch of the recomputation table (0: no table)")
    parser.add_argument("--trace-dir", type=Path,
                        help="keep the DenseNet-BC traces here (default: a temporary folder)")
    parser.add_argument("--insize", type=int, help="image size (default: the model's)")
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--method", default="best")
    parser.add_argument("--time-limit", type=float, default=2.0, help="pgmo solver seconds")
    parser.add_argument("--budget", type=float, default=480.0,
                        help="seconds for the whole run; later configurations are skipped")
    parser.add_argument("--child-timeout", type=float, default=150.0)
    parser.add_argument("--output", "-o", type=Path, help="also write the report here")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is None:
        if args.iterations <= args.skip:
            parser.error("--iterations must exceed --skip")
        if args.densenet_batchsize < 0:
            parser.error(f"--densenet-batchsize must be 0 or more, got {args.densenet_batchsize}")
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
             "densenet_batchsize": 2,
             "arch": ["alexnet"], "search_arch": ["alexnet"]}
    for key, value in small.items():
        if getattr(args, key) == defaults[key]:
            setattr(args, key, value)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.child is not None:
        return child_main(args.child)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    command = shlex.join(["python", "scripts/bench_memory.py", *argv])
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
    start = time.monotonic()
    memory_runs += part_memory(args, runner, args.batchsize[1:], False)
    timings["memory and time, other batch sizes"] = time.monotonic() - start
    timings["total"] = time.monotonic() - runner.started
    memory_runs.sort(key=run_order)
    text = report(args, env, (memory_runs, seq_rows, search_rows, search_log), timings,
                  command, recompute)
    print(text)
    for part, seconds in timings.items():
        log.info("%s: %.1f s", part, seconds)
    if args.output is not None:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(text + "\n")
        log.info("wrote %s", args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
