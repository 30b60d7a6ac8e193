"""The quick GPU check's Markdown: its verdicts and tables, from the raw results it writes.

Kept apart from the runs so that ``scripts.results_table`` renders the
same tables from ``quick-check.json`` in a session's folder, and so that the
formatting is tested on results shaped as a GPU run writes them.  Every
comparison of the two pools rests on the measurement both runs share (the
device memory taken, seen from outside the pool); each pool's own count is
shown beside it, never compared.
"""

from __future__ import annotations

import statistics

from .markdown import mib, table

MiB = 2**20
#: Within this share of each other, two figures are "about the same".
SAME = 0.02


def size_text(size: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", MiB), ("KiB", 2**10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} B"


def markdown(columns, rows, text_columns: int = 2) -> list[str]:
    """A table of the report: workload and pool (or the like) left-aligned."""
    return table(columns, rows, text_columns)


# ------------------------------------------------------------------ a. allocator costs
def waits_verdict(rows: list[dict]) -> str:
    """Whether an operation waited for the queued kernels, over the sizes measured."""
    measured = [r for r in rows if "waited" in r]
    if not measured:
        return "not measured"
    waited = [r for r in measured if r["waited"]]
    if not waited:
        return "never waits for queued kernels"
    if len(waited) == len(measured):
        return "waits for queued kernels at every size: it synchronizes"
    return ("waits for queued kernels at " + ", ".join(size_text(r["size"]) for r in waited)
            + " (not at the other sizes)")


def range_text(values: list[float]) -> str:
    if not values:
        return "-"
    lo, hi = min(values), max(values)
    return f"{lo:,.1f} us" if abs(hi - lo) < 0.05 * max(hi, 1e-9) else \
        f"{lo:,.1f}-{hi:,.1f} us"


def cost_verdicts(costs: dict) -> list[tuple]:
    by_op: dict[tuple, list] = {}
    for row in costs.get("rows", []):
        by_op.setdefault((row["way"], row["op"]), []).append(row)
    behind = costs.get("info", {}).get("behind_ms", 5)
    out = []
    for (way, op), rows in by_op.items():
        errors = [r for r in rows if "error" in r]
        idle = [r["idle_us"] for r in rows if "idle_us" in r]
        late = [r["behind_us"] for r in rows if "behind_us" in r]
        measured = (f"idle {range_text(idle)}; behind {behind:g} ms of kernels "
                    f"{range_text(late)}")
        if errors:
            measured += f"; failed at {', '.join(size_text(r['size']) for r in errors)} " \
                        f"({errors[0]['error']})"
        out.append((f"{way}: does `{op}` wait for queued kernels?", measured,
                    waits_verdict(rows)))
    out += [("allocation costs", f"not measured: {why}", "-")
            for why in costs.get("problems", [])]
    return out


COST_COLUMNS = ("way", "call", "size", "idle (us)", "behind queued kernels (us)",
                "waited (of the tries)")


def cost_rows(costs: dict) -> list[tuple]:
    rows = []
    for r in costs.get("rows", []):
        if "error" in r:
            rows.append((r["way"], f"`{r['op']}`", size_text(r["size"]), r["error"], "", ""))
            continue
        rows.append((r["way"], f"`{r['op']}`", size_text(r["size"]),
                     f"{r.get('idle_us', float('nan')):,.1f}",
                     f"{r.get('behind_us', float('nan')):,.1f}",
                     ("yes " if r.get("waited") else "no ") + f"({r.get('waits', '-')})"))
    return rows


# ------------------------------------------------------------------ b, c. pools compared
def ratio_verdict(ours, stock, what: str = "memory") -> str:
    """pgmo's figure against the stock pool's: which is lower, by how much."""
    if ours is None or not stock:
        return "not measured"
    ratio = ours / stock
    less, more = ("takes less", "takes more") if what == "memory" else ("is faster", "is slower")
    if ratio < 1 - SAME:
        return (f"pgmo {less}: {ratio:.2f}x the stock pool's {what} "
                f"({100 * (1 - ratio):.1f} % less)")
    if ratio > 1 + SAME:
        return f"pgmo {more}: {ratio:.2f}x the stock pool's {what}"
    return f"about the same: {ratio:.3f}x"


def first_ms(result: dict, n: int = 3) -> list[float]:
    return (result.get("laps_ms") or [])[:n]


def steady_ms(result: dict, skip: int = 3) -> float | None:
    laps = (result.get("laps_ms") or [])[skip:]
    return statistics.median(laps) if laps else None


def why_not(result: dict | None) -> str:
    if result is None:
        return "not run"
    if "skipped" in result:
        return result["skipped"]
    if result.get("oom"):
        return f"out of memory at iteration {result.get('iterations', 0) + 1}"
    return "failed"


def pairs(runs: list[dict]):
    """(workload name, stock result or None, pgmo result or None), in the order run."""
    by: dict[str, dict] = {}
    for run in runs:
        by.setdefault(run["workload"], {})[run["pool"]] = run.get("result")
    return [(name, pools.get("stock"), pools.get("pgmo")) for name, pools in by.items()]


def usable(result: dict | None) -> bool:
    return bool(result) and "skipped" not in result and bool(result.get("ok"))


def pool_verdicts(runs: list[dict]) -> list[tuple]:
    out = []
    for name, stock, ours in pairs(runs):
        if not (usable(stock) and usable(ours)):
            out.append((f"{name}: memory and time, pgmo / stock", "stock: "
                        + ("ran" if usable(stock) else why_not(stock)) + "; pgmo: "
                        + ("ran" if usable(ours) else why_not(ours)), "not compared"))
            continue
        for key, what in (("taken_device_bytes", "cudaMemGetInfo"), ("taken_nvml_bytes", "NVML")):
            out.append((f"{name}: device memory taken over the whole run, pgmo / stock "
                        f"({what})", f"{mib(ours.get(key))} / {mib(stock.get(key))} MiB",
                        ratio_verdict(ours.get(key), stock.get(key))))
        a, b = first_ms(ours), first_ms(stock)
        out.append((f"{name}: iterations 1-3, pgmo / stock",
                    f"{' + '.join(f'{x:.0f}' for x in a)} / {' + '.join(f'{x:.0f}' for x in b)}"
                    " ms", ratio_verdict(sum(a) if a else None, sum(b), "time")))
        s, p = steady_ms(stock), steady_ms(ours)
        out.append((f"{name}: steady state (median of iterations 4 on), pgmo / stock",
                    "-" if s is None or p is None else f"{p:.1f} / {s:.1f} ms",
                    ratio_verdict(p, s, "time")))
        kind = (ours.get("pgmo") or {}).get("arena_kind")
        out.append((f"{name}: the arena pgmo chose", kind or "not reported by this pgmo "
                    "(its stats() has no arena kind)", "-"))
    return out


MEMORY_COLUMNS = ("workload", "pool", "taken, cudaMemGetInfo (MiB)", "taken, NVML (MiB)",
                  "live bytes, peak (MiB)", "pool's own count, peak (MiB)",
                  "pgmo: lower bound (MiB)", "pgmo: mode", "pgmo: arena")


def memory_rows(runs: list[dict]) -> list[tuple]:
    rows = []
    for run in runs:
        r = run.get("result")
        head = (run["workload"], run["pool"])
        if not usable(r):
            rows.append(head + (why_not(r),) + ("",) * (len(MEMORY_COLUMNS) - 3))
            continue
        stats = r.get("pgmo") or {}
        rows.append(head + (mib(r.get("taken_device_bytes")), mib(r.get("taken_nvml_bytes")),
                            mib(r.get("live_peak_bytes")), mib(r.get("own_peak_bytes")),
                            mib(stats.get("lower_bound")) if stats else "-",
                            stats.get("mode", "-"),
                            (stats.get("arena_kind") or "not reported") if stats else "-"))
    return rows


TIME_COLUMNS = ("workload", "pool", "iteration 1 (ms)", "iteration 2 (ms)", "iteration 3 (ms)",
                "steady state (ms)", "iterations")


def time_rows(runs: list[dict]) -> list[tuple]:
    rows = []
    for run in runs:
        r = run.get("result")
        head = (run["workload"], run["pool"])
        if not usable(r):
            rows.append(head + (why_not(r),) + ("",) * (len(TIME_COLUMNS) - 3))
            continue
        first = [f"{x:,.1f}" for x in first_ms(r)] + ["-"] * 3
        steady = steady_ms(r)
        rows.append(head + tuple(first[:3]) + (
            "-" if steady is None else f"{steady:,.1f}", r.get("iterations", "-")))
    return rows


# ------------------------------------------------------------------ the page
def render(data: dict, heading: str = "#") -> str:
    """The whole report; ``heading`` is the level of its title ("##" inside another page)."""
    sub = heading + "#"
    out = [f"{heading} pgmo quick GPU check", ""]
    if data.get("dry_run"):
        out += ["**DRY RUN on the CPU**: stand-in modules for `cupy.cuda.runtime`, NVML and "
                "`cuda.bindings.driver`, tiny stand-in workloads: every number below is a "
                "stand-in's, not a measurement.", ""]
    env = data.get("environment", {})
    out += [f"- command: `{data.get('command', '?')}`",
            f"- device: {env.get('device', 'unknown')}"
            + (f" ({env['device memory']})" if env.get("device memory") else ""),
            "- versions: " + (", ".join(f"{k} {env[k]}" for k in
                                        ("pgmo", "cupy", "CUDA runtime", "cuda-bindings")
                                        if k in env) or "unknown"),
            f"- date: {data.get('date', '?')}",
            "- steps (limit, time): " + "; ".join(
                f"{s['name']} {s['status']} ({s['limit_s']:.0f} s, {s['seconds']:.0f} s)"
                for s in data.get("steps", [])),
            ""]
    verdicts = cost_verdicts(data.get("costs") or {}) + pool_verdicts(data.get("runs", []))
    out += [f"{sub} Verdicts", "", *markdown(("question", "measured", "verdict"), verdicts, 3), ""]
    costs = data.get("costs") or {}
    info = costs.get("info", {})
    out += [f"{sub} a. What taking and giving back device memory costs", "",
            f"Each call timed on the host, the median of {info.get('repeats', '?')} tries (fewer "
            f"at 4 GiB), idle and right after {info.get('behind_ms', 5):g} ms of kernels were "
            f"queued ({info.get('kernels', 5)} spin kernels) on the stream the calls use; "
            "*waited*: the call returned only once the queue was empty and took at least half "
            "that time.  Virtual memory maps whole granules"
            + (f" of {size_text(info['granularity'])}" if info.get("granularity") else "")
            + ": smaller sizes are rounded up.", ""]
    out += (markdown(COST_COLUMNS, cost_rows(costs), 3) if costs.get("rows")
            else ["not measured."]) + [""]
    runs = data.get("runs", [])
    out += [f"{sub} b. Device memory, the same measurement for both pools", "",
            "Each run a fresh process with every allocation through the pool named, from "
            "before the model is built to the end (warm-up, profiling, the switch to the "
            "plan and re-plans included).  *Taken*: the peak of the device's used bytes "
            "(`cudaMemGetInfo`, sampled every 5 ms inside iterations and at their ends) or of "
            "NVML's count for the process, less the baseline once the CUDA context existed; "
            "*live bytes*: the most bytes in live blocks at once (a CuPy memory hook, under "
            "both pools); *pool's own count*: what the pools say they held (pgmo: its "
            "`peak_total_bytes`), reported, never compared; *arena*: the kind pgmo's "
            "`stats()` says it chose.", ""]
    out += (markdown(MEMORY_COLUMNS, memory_rows(runs)) if runs else ["not measured."]) + [""]
    out += [f"{sub} c. Time per iteration", "",
            "Wall time of each iteration after a device sync (pgmo's iteration 1 is its "
            "warm-up, 2 its profiled one); *steady state*: the median from iteration 4 on.  "
            "Both pools run the same live-bytes hook.", ""]
    out += (markdown(TIME_COLUMNS, time_rows(runs)) if runs else ["not measured."]) + [""]
    return "\n".join(out)
