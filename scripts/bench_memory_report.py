"""The Markdown report of ``scripts.bench_memory``: its tables, from the children's results.

Kept apart from the runs so that formatting is tested on results shaped as
a GPU child prints them, without a GPU.  Every comparison of the two pools
(pgmo / stock, memory saved) rests on one measurement made the same way for
both: the device memory the run took, seen from outside the pool
(``cudaMemGetInfo`` sampled inside iterations, and NVML), peak over the
whole run less the baseline once the CUDA context exists.  Each pool's own
count is printed beside it and never compared.  A configuration may have run
several times (``--repeats``): :func:`combine` makes one result of them,
memory at its worst run and time as the median of the runs' medians with
their range, so that a reader can tell a difference from noise.
In a CPU dry run every number that needs a GPU reads ``n/a (CPU)``.
"""

from __future__ import annotations

import datetime
import statistics

from .markdown import NA, mib, table

ARCHS = ("alexnet", "googlenet", "resnet50", "inception-resnet-v2")
POOLS = ("stock", "pgmo")
#: Peaks taken as the largest over a configuration's runs.
PEAK_KEYS = ("taken_device_bytes", "taken_nvml_bytes", "live_peak_bytes", "own_peak_bytes")


def gpu_cell(args, text: str) -> str:
    """Numbers measured in a dry run are stand-ins: never print them as results."""
    return NA if args.device < 0 else text


# ---------------------------------------------------------------- several runs
def combine(results: list[dict]) -> dict:
    """One result for a configuration's runs: the first run's, with peaks at their largest
    over the runs that finished, the median time of those runs and every run's time."""
    finished = [r for r in results if "skipped" not in r and r.get("ok")]
    if not finished:
        return {**results[0], "runs": 0, "ms_runs": []}
    out = dict(finished[0])
    for key in PEAK_KEYS:
        values = [r[key] for r in finished if r.get(key) is not None]
        out[key] = max(values) if values else None
    out["ms_runs"] = [r["ms_per_iter"] for r in finished if r.get("ms_per_iter") is not None]
    out["ms_per_iter"] = statistics.median(out["ms_runs"]) if out["ms_runs"] else None
    out["runs"] = len(finished)
    out["failed_runs"] = len(results) - len(finished)
    return out


def time_text(result: dict) -> str:
    """Median ms/iter over the runs, with their range: "43.5 (41.2-47.9, 3 runs)"."""
    ms = result.get("ms_runs") or []
    if result.get("ms_per_iter") is None:
        return "-"
    if len(ms) < 2:
        return f"{result['ms_per_iter']:.1f} (1 run)"
    return f"{result['ms_per_iter']:.1f} ({min(ms):.1f}-{max(ms):.1f}, {len(ms)} runs)"


def ratio_text(stock: dict, ours: dict) -> str:
    """pgmo / stock time: ratio of the medians, and the range any two runs could give."""
    if not stock.get("ms_per_iter") or ours.get("ms_per_iter") is None:
        return "-"
    text = f"{ours['ms_per_iter'] / stock['ms_per_iter']:.3f}"
    a, b = stock.get("ms_runs") or [], ours.get("ms_runs") or []
    if len(a) > 1 or len(b) > 1:
        text += f" ({min(b) / max(a):.2f}-{max(b) / min(a):.2f})"
    return text


def saving_text(stock: dict, ours: dict, key: str = "taken_device_bytes") -> str:
    """The share of the device memory the stock pool's run took that pgmo's did not take."""
    if not stock.get(key) or ours.get(key) is None:
        return "-"
    return f"{100 * (1 - ours[key] / stock[key]):.1f} %"


def times_text(result: dict, first: int = 3) -> str:
    """The first iterations' times (pgmo: warm-up, profiling, first planned): "812 / 430 / 215"."""
    laps = result.get("laps_ms") or []
    return " / ".join(f"{ms:.0f}" for ms in laps[:first]) or "-"


def pgmo_counters(result: dict) -> tuple:
    """pgmo's own counters for the tables: planned peak, lower bound, their ratio, mode, arena
    kind, fallback requests; ``-`` for CuPy's pool."""
    stats = result.get("pgmo")
    if not stats:
        return ("-",) * 6
    ratio = (f"{stats['planned_peak'] / stats['lower_bound']:.3f}"
             if stats["lower_bound"] else "-")
    return (mib(stats["planned_peak"]), mib(stats["lower_bound"]), ratio, stats["mode"],
            stats.get("arena_kind") or "not reported", _departed(stats))


# ---------------------------------------------------------------------- tables
MEMORY_COLUMNS = ("model", "task", "batch", "pool", "taken, cudaMemGetInfo (MiB)",
                  "taken, NVML (MiB)", "live bytes, peak (MiB)",
                  "pool's own count, peak (MiB)", "planned peak (MiB)", "lower bound (MiB)",
                  "planned / bound", "ms/iter", "iterations 1-3 (ms)", "pgmo mode", "arena",
                  "fallback reqs")


def failed_row(head: tuple, columns: tuple, result: dict) -> tuple | None:
    blank = ("",) * (len(columns) - len(head) - 1)
    if "skipped" in result:
        return head + (f"skipped: {result['skipped']}",) + blank
    if not result["ok"]:
        return head + (f"out of memory at iteration {result['iterations'] + 1}",) + blank
    return None


def memory_row(args, cfg, result) -> tuple:
    head = (cfg["arch"], "train" if cfg["workload"] == "cnn-train" else "inference",
            cfg["batch"], cfg["pool"])
    failed = failed_row(head, MEMORY_COLUMNS, result)
    if failed:
        return failed
    planned, lower, ratio, mode, arena, fallbacks = pgmo_counters(result)
    return head + tuple(gpu_cell(args, str(v)) for v in (
        mib(result.get("taken_device_bytes")), mib(result.get("taken_nvml_bytes")),
        mib(result.get("live_peak_bytes")), mib(result.get("own_peak_bytes")), planned, lower,
        ratio, time_text(result), times_text(result), mode, arena, fallbacks))


SEQ2SEQ_COLUMNS = ("pool", "batch", "iterations", "taken, cudaMemGetInfo (MiB)",
                   "taken, NVML (MiB)", "live bytes, peak (MiB)",
                   "pool's own count, peak (MiB)", "ms/iter", "iterations 1-3 (ms)",
                   "re-optimizations", "fallback reqs", "departures")


def seq2seq_row(args, cfg, result) -> tuple:
    head = (cfg["pool"], cfg["batch"])
    failed = failed_row(head, SEQ2SEQ_COLUMNS, result)
    if failed:
        return failed
    stats = result.get("pgmo") or {}
    ms = "-" if result["ms_per_iter"] is None else f"{result['ms_per_iter']:.1f}"
    return head + (result["iterations"],) + tuple(gpu_cell(args, str(v)) for v in (
        mib(result.get("taken_device_bytes")), mib(result.get("taken_nvml_bytes")),
        mib(result.get("live_peak_bytes")), mib(result.get("own_peak_bytes")), ms,
        times_text(result), stats.get("reoptimizations", "-"),
        _departed(stats, "-"), stats.get("departures", "-")))


SEARCH_COLUMNS = ("model", "memory limit (MiB)", "pool", "largest batch that fits", "probes")

COMPARE_COLUMNS = ("model", "task", "batch", "taken, cudaMemGetInfo, stock / pgmo (MiB)",
                   "taken, NVML, stock / pgmo (MiB)", "memory saved (cudaMemGetInfo)",
                   "memory saved (NVML)", "ms/iter stock / pgmo", "time pgmo / stock")


def run_order(run) -> tuple:
    cfg = run[0]
    return (ARCHS.index(cfg["arch"]), cfg["workload"] != "cnn-train", cfg["batch"],
            POOLS.index(cfg["pool"]))


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
            rows.append(head + (NA,) * (len(COMPARE_COLUMNS) - len(head)))
            continue
        ms = [time_text(r) for r in (stock, ours)]
        rows.append(head + (
            f"{mib(stock.get('taken_device_bytes'))} / {mib(ours.get('taken_device_bytes'))}",
            f"{mib(stock.get('taken_nvml_bytes'))} / {mib(ours.get('taken_nvml_bytes'))}",
            saving_text(stock, ours), saving_text(stock, ours, "taken_nvml_bytes"),
            f"{ms[0]} / {ms[1]}", ratio_text(stock, ours)))
    return rows


RUNS_COLUMNS = ("file", "model", "pool", "batch", "iterations", "requests",
                "taken, cudaMemGetInfo (MiB)")


def run_file_rows(args, recorded) -> list:
    """One row per whole run recorded (``--run-dir``)."""
    rows = []
    for cfg, result in recorded:
        name = cfg["run_path"].rsplit("/", 1)[-1]
        what = (cfg.get("arch") or "seq2seq", cfg["pool"], cfg["batch"])
        if "run_file" not in result:
            why = result.get("skipped") or ("out of memory" if result.get("oom") else "failed")
            rows.append((name, *what, f"not written: {why}", "", ""))
            continue
        rows.append((name, *what, result["run_file"]["iterations"],
                     result["run_file"]["requests"],
                     gpu_cell(args, mib(result.get("taken_device_bytes")))))
    return rows


# ---------------------------------------------------------------------- report
def header(args, env, timings, command) -> list[str]:
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    out = ["# pgmo against CuPy's stock memory pool", ""]
    if args.device < 0:
        out += ["**CPU DRY RUN**: the subprocesses ran at tiny sizes on NumPy; "
                f"every number that needs a GPU reads `{NA}`.", ""]
    nvml = env.get("nvml", "not asked")
    return out + [
        f"- command: `{command}`",
        f"- device: {env.get('device', 'unknown')}"
        + (f" ({env['device memory']}, CUDA runtime {env['CUDA runtime']})"
           if "device memory" in env else ""),
        "- versions: " + ", ".join(f"{k} {env[k]}" for k in
                                   ("pgmo", "cupy", "chainer", "numpy", "python") if k in env),
        f"- date: {date}",
        f"- pgmo solver: `{args.method}`, time limit {args.time_limit} s; "
        f"{args.iterations} iterations per run; ms/iter = median of the last "
        f"{args.iterations - args.skip}, leaving out the first {args.skip} "
        "(pgmo's warm-up and profiled iterations, and the same for the stock pool)",
        f"- runs per configuration: up to {args.repeats} (fresh processes; time: the median "
        "of the runs' medians, with their range; memory: the largest of the runs)",
        f"- outside view: {nvml}",
        "- time per part: " + ", ".join(f"{k} {v:.0f} s" for k, v in timings.items()),
        ""]


def section(title: str, prose: str, columns, rows) -> list[str]:
    """A section of the report: its title, how its table was measured, the table."""
    return [f"## {title}", "", prose, "", *table(columns, rows), ""]


def report(args, env, parts, timings, command, recompute: str = "", runs=()) -> str:
    out = header(args, env, timings, command)
    memory_runs, seq_rows, search_rows, search_log = parts
    memory_rows = [memory_row(args, cfg, result) for cfg, result in memory_runs]
    compare = comparison_rows(args, memory_runs)
    if compare:
        out += section(
                "Stock pool and pgmo side by side (Figures 2 and 3)",
                "From the runs of the next table.  Memory: what each run took from the "
                "device, seen from outside the pool and measured the same way for both "
                "pools (*taken*, next table); *memory saved* is the share of the stock "
                "pool's run that pgmo's did not take (negative: pgmo took more).  Time: "
                "the median per iteration (median of the runs, their range; the ratio's "
                "range is the most and least any two runs give).", COMPARE_COLUMNS, compare)
    if memory_rows:
        out += section(
                "Memory and time per iteration, every run",
                "Each row is one configuration, each run of it a fresh process whose every "
                "allocation goes through the pool named (installed before the model is "
                "built).  Measured the same way for both pools, over the whole run "
                "(building the model, warm-up, profiling, the switch to the plan and "
                "re-plans included): *taken, cudaMemGetInfo*: the peak of the device's "
                "used bytes (total minus free), sampled every 5 ms on a thread and at "
                "every iteration's end, less what was used once the CUDA context existed "
                "and before the pool took anything; *taken, NVML*: the same through "
                "NVML's count for the process (`-` without `nvidia-ml-py`).  *Live bytes*: "
                "the most bytes in live blocks at once (requests rounded to 512 B, "
                "counted by a CuPy memory hook under both pools): no pool can hold less.  "
                "*Pool's own count*: what the pools say they held at their peak (pgmo: "
                "its `peak_total_bytes` counter; CuPy's pool: its total at iteration "
                "ends, which only grows): reported, never compared.  pgmo's planned peak, "
                "lower bound, mode, arena (the kind it chose, when its `stats()` says) "
                "and fallback requests are its own counters.  *Iterations 1-3*: each "
                "one's time (pgmo: warm-up, profiling, the first planned one).",
                MEMORY_COLUMNS, memory_rows)
    if search_rows:
        out += section(
                "Largest training batch under a memory limit",
                f"`set_limit({args.memory_limit})` on the pool under test from the start of "
                f"each process, batch sizes 1-{args.search_max} bisected with at most "
                f"{args.search_probes} probes, each a fresh process running "
                f"{args.search_iterations} iterations.  The same criterion for both pools: "
                "a batch fits when every iteration runs under the limit (pgmo's warm-up "
                "and profiled iterations included); the probes say in which mode pgmo "
                "ended.", SEARCH_COLUMNS, search_rows)
        if search_log:
            out += ["<details><summary>probes</summary>", "",
                    *[f"- {line}" for line in search_log], "", "</details>", ""]
    if seq_rows:
        out += section(
                "seq2seq: variable-length batches",
                f"NStepLSTM encoder-decoder, vocabulary {args.vocab}, {args.layers} x "
                f"{args.units} units, sentences of 1-50 words; memory measured as in the table "
                "of every run, over all the iterations.", SEQ2SEQ_COLUMNS, seq_rows)
    if recompute:
        out.append(recompute)
    run_rows = run_file_rows(args, runs)
    if run_rows:
        out += section(
                "Whole runs recorded",
                "Every malloc and free from the start of the process, with the iterations "
                "marked, heard by a CuPy memory hook (`pgmo.TraceRecorder`): run files of "
                "`pgmo.runs` (`read_run`), with each iteration's pool total, device in "
                "use and NVML peak in their metadata, for checking the CPU models of the "
                "footprint against the device.", RUNS_COLUMNS, run_rows)
    return "\n".join(out)


def _departed(stats: dict, missing=None):
    """Requests of a planned iteration after it left its plan (sessions before 2026-11-26
    name them ``fallback_requests``)."""
    return stats.get("departed_requests", stats.get("fallback_requests", missing))
