"""The quick GPU check's judgement and Markdown, from the raw results it writes.

Kept apart from the runs so that ``scripts.results_table`` renders the same
page from ``quick-check.json`` in a session's folder, and so that the
judgement is tested on results shaped as a GPU run writes them.
:func:`checks` turns the results into rows (check, what was measured, verdict,
status): ``fail`` where a part of pgmo's device layer fell back to
cudaMalloc, a replay found a corrupted byte, the device reported an error, a
promise of the pool was broken, NVML could not be read or a step did not
finish; ``ok`` where such a check held; ``info`` for measurements (what a
call costs, how the driver's pool reserves, pgmo's memory against CuPy's
pool's), which settle the host model rather than pass or fail.  Every
comparison of the two pools rests on the measurement both runs share (the
device memory taken, seen from outside the pool); each pool's own count is
shown beside it, never compared.
"""

from __future__ import annotations

import statistics
from typing import NamedTuple

from pgmo.engine.own_heap import OwnHeap
from pgmo.engine.page_heap import PageHeap

from .markdown import mib, table

MiB = 2**20
#: Within this share of each other, two figures are "about the same".
SAME = 0.02
#: Device memory a dropped pool may leave behind (one driver page) before teardown fails.
LEFT_MAX = 2 * MiB
RANGE, STREAM_POOL = "reserved range", "stream-ordered pool"
#: The heaps of pgmo's own in a reserved range: the page heap (the default, ``heap="pages"``)
#: and the own heap (``heap="own"``); either says the device's virtual memory serves.
RANGE_HEAPS = (PageHeap.kind, OwnHeap.kind)
WORKLOADS = ("repeating", "variable")
POOLS = ("stock", "pgmo")


class Check(NamedTuple):
    question: str
    measured: str
    verdict: str
    status: str  # "ok", "fail" or "info"


def size_text(size: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", MiB), ("KiB", 2**10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size:,} B"


def markdown(columns, rows, text_columns: int = 2) -> list[str]:
    """A table of the report: the first ``text_columns`` columns left-aligned."""
    return table(columns, rows, text_columns)


def _result(data: dict, step: str) -> dict | None:
    return (data.get("results") or {}).get(step)


def _passed(ok: bool, good: str, bad: str) -> tuple[str, str]:
    return (f"ok: {good}", "ok") if ok else (f"FAIL: {bad}", "fail")


# ------------------------------------------------------------------ steps that did not finish
def step_checks(data: dict) -> list[Check]:
    return [Check(f"step {s['name']}", s.get("status", "?") + (f" ({s['error'][-200:]})"
                                                                if s.get("error") else ""),
                  f"FAIL: the step did not finish: {s.get('status', '?')}", "fail")
            for s in data.get("steps", []) if s.get("status") != "done"]


# ------------------------------------------------------------------ the device layer
def device_checks(data: dict) -> list[Check]:
    r = _result(data, "device")
    if r is None:
        return []
    out = []
    versions = r.get("versions") or {}
    out.append(Check("versions", ", ".join(f"{k} {v}" for k, v in versions.items()
                                           if k not in ("device", "device memory")),
                     "-", "info"))
    stats = r.get("stats") or {}
    reasons = {**(r.get("probe") or {}).get("reasons", {}), **(stats.get("device_reasons")
                                                               or {})}
    for part, key, wanted in (("arena", "arena_kind", (RANGE,)),
                              ("heap", "heap_kind", RANGE_HEAPS)):
        kind = stats.get(key) or "not reported"
        why = reasons.get(part)
        verdict, status = _passed(kind in wanted and not why,
                                  f"pgmo's {part} uses the {kind}",
                                  f"pgmo's {part} fell back to {kind}"
                                  + (f": {why}" if why else ""))
        out.append(Check(f"device layer: pgmo's {part} ({key})", kind, verdict, status))
    joins = (r.get("probe") or {}).get("joins_unmaps")
    if joins is not None:  # (not in the files of 2026-11-27 and before)
        out.append(Check("device layer: one cuMemUnmap over several adjacent mappings",
                         "accepted" if joins else "refused: one call per mapping",
                         "pgmo gives a run of adjacent pages back in one call" if joins
                         else "pgmo gives each page back in a call of its own",
                         "info"))
    others = {p: w for p, w in reasons.items() if p not in ("arena", "heap")}
    if others:
        out.append(Check("device layer: other troubles (device_reasons)",
                         "; ".join(f"{p}: {w}" for p, w in sorted(others.items())),
                         "FAIL: pgmo could not do all it should", "fail"))
    out += replay_safety("device layer: a short run's replay, pattern-checked", r.get("replay"))
    out += device_errors("device layer", r)
    return out


def device_errors(what: str, r: dict) -> list[Check]:
    """A sync that raised, ``cudaGetLastError`` not 0, a stand-in's broken rule: fail."""
    problems = []
    if r.get("sync_error"):
        problems.append(f"the device sync raised {r['sync_error']}")
    if r.get("last_error") not in (0, None):
        problems.append(f"cudaGetLastError {r['last_error']}")
    if r.get("violations"):
        problems.append(f"{len(r['violations'])} rule(s) broken: {r['violations'][0]}")
    if not problems:
        return []
    return [Check(f"{what}: device errors", "; ".join(problems),
                  "FAIL: the device reported an error", "fail")]


def replay_safety(question: str, r: dict | None) -> list[Check]:
    if not r:
        return []
    bad = r.get("corrupted", 0) + r.get("overlaps", 0)
    measured = (f"{r.get('requests', 0):,} requests, {r.get('iterations', 0)} iterations: "
                f"{r.get('corrupted', 0)} corrupted, {r.get('overlaps', 0)} overlapping")
    verdict, status = _passed(bad == 0, "every byte intact",
                              "a block was corrupted or shared its memory")
    return [Check(question, measured, verdict, status)]


# ------------------------------------------------------------------ the driver's pool
def driver_pool_checks(data: dict) -> list[Check]:
    r = _result(data, "driver-pool")
    if r is None:
        return []
    out = []
    fresh = r.get("fresh") or []
    if fresh:
        out.append(Check("driver's pool: reserved after one request on a fresh pool",
                         "; ".join(f"{size_text(row['size'])}: "
                                   f"{size_text(row['reserved'])}" for row in fresh),
                         pool_step_verdict(fresh), "info"))
    growth = r.get("one_live_per_growth")
    if growth:
        out.append(Check("driver's pool: a trim with one live block per growth",
                         f"{len(growth['growths'])} growths of "
                         f"{'/'.join(sorted({size_text(g) for g in growth['growths']}))}; "
                         f"reserved {size_text(growth['reserved_before'])} before, "
                         f"{size_text(growth['reserved_after_trim'])} after",
                         trim_verdict(growth), "info"))
    pages = r.get("cudaMalloc") or []
    if pages:
        out.append(Check("cudaMalloc: device memory used after each request (held)",
                         "; ".join(f"{size_text(row['size'])}: +{size_text(row['used_grew'])}"
                                   if row["used_grew"] else f"{size_text(row['size'])}: +0"
                                   for row in pages), "-", "info"))
    out += [Check("driver's pool", f"not measured: {why}", "-", "info")
            for why in r.get("problems", [])]
    return out


def pool_step_verdict(fresh: list[dict]) -> str:
    first = min(row["reserved"] for row in fresh)
    if all(row["reserved"] % first == 0 for row in fresh):
        return f"grows in steps of {size_text(first)}"
    return "grows by the request, rounded (no common step)"


def trim_verdict(growth: dict) -> str:
    kept = growth["kept"] or 1
    per = growth["reserved_after_trim"] / kept
    steps = growth["growths"]
    if growth["reserved_after_trim"] >= sum(steps[:kept]):
        return "trims whole growth steps only: a live block keeps its whole step"
    return f"trims below its growth step: {size_text(int(per))} stays per live block"


# ------------------------------------------------------------------ allocation costs
def waits_verdict(rows: list[dict], key: str = "waited") -> str:
    """Whether an operation waited for the queued kernels, over the sizes measured."""
    measured = [r for r in rows if key in r]
    if not measured:
        return "not measured"
    waited = [r for r in measured if r[key]]
    if not waited:
        return "never waits"
    if len(waited) == len(measured):
        return "waits at every size: it synchronizes"
    return ("waits at " + ", ".join(size_text(r["size"]) for r in waited)
            + " (not at the other sizes)")


def range_text(values: list[float]) -> str:
    if not values:
        return "-"
    lo, hi = min(values), max(values)
    return f"{lo:,.1f} us" if abs(hi - lo) < 0.05 * max(hi, 1e-9) else \
        f"{lo:,.1f}-{hi:,.1f} us"


def cost_checks(data: dict) -> list[Check]:
    costs = _result(data, "costs") or {}
    by_op: dict[tuple, list] = {}
    for row in costs.get("rows", []):
        by_op.setdefault((row["way"], row["op"]), []).append(row)
    behind = costs.get("info", {}).get("behind_ms", 5)
    out = []
    for (way, op), rows in by_op.items():
        errors = [r for r in rows if "error" in r]
        measured = (f"idle {range_text([r['idle_us'] for r in rows if 'idle_us' in r])}; "
                    f"behind {behind:g} ms of kernels "
                    f"{range_text([r['behind_us'] for r in rows if 'behind_us' in r])}, "
                    f"on another stream "
                    f"{range_text([r['other_us'] for r in rows if 'other_us' in r])}")
        if errors:
            measured += f"; failed at {', '.join(size_text(r['size']) for r in errors)} " \
                        f"({errors[0]['error']})"
        verdict = (f"its stream: {waits_verdict(rows)}; another stream: "
                   f"{waits_verdict(rows, 'other_waited')}")
        out.append(Check(f"{way}: does `{op}` wait for queued kernels?", measured, verdict,
                         "info"))
    out += [Check("allocation costs", f"not measured: {why}", "-", "info")
            for why in costs.get("problems", [])]
    return out


COST_COLUMNS = ("way", "call", "size", "idle (us)", "behind queued kernels (us)", "waited",
                "behind another stream's (us)", "waited")


def cost_rows(costs: dict) -> list[tuple]:
    rows = []
    for r in costs.get("rows", []):
        if "error" in r:
            rows.append((r["way"], f"`{r['op']}`", size_text(r["size"]), r["error"],
                         "", "", "", ""))
            continue

        def us(key: str) -> str:
            return f"{r[key]:,.1f}" if key in r else "-"

        rows.append((r["way"], f"`{r['op']}`", size_text(r["size"]), us("idle_us"),
                     us("behind_us"), ("yes " if r.get("waited") else "no ")
                     + f"({r.get('waits', '-')})", us("other_us"),
                     ("yes " if r.get("other_waited") else "no ")
                     + f"({r.get('other_waits', '-')})"))
    return rows


# ------------------------------------------------------------------ replays
def replay_key(workload: str, pool: str) -> str:
    return f"replay-{workload}-{pool}"


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


def steady_ms(laps: list[float], skip: int = 3) -> float | None:
    rest = laps[skip:]
    return statistics.median(rest) if rest else None


def replay_checks(data: dict) -> list[Check]:
    out = []
    for workload in WORKLOADS:
        runs = {pool: _result(data, replay_key(workload, pool)) for pool in POOLS}
        for pool, r in runs.items():
            if r is None:
                continue
            out += replay_safety(f"{workload} workload, {pool}: replay on the device, "
                                 f"pattern-checked", r)
            if r.get("oom"):
                out.append(Check(f"{workload} workload, {pool}", r["oom"]["error"],
                                 "FAIL: out of memory with no limit set", "fail"))
            if r.get("nvml_why"):
                out.append(Check(f"{workload} workload, {pool}: NVML",
                                 f"not read: {r['nvml_why']}",
                                 "FAIL: the process's device memory is unmeasured "
                                 "(pip install nvidia-ml-py)", "fail"))
            out += device_errors(f"{workload} workload, {pool}", r)
        stock, ours = runs["stock"], runs["pgmo"]
        if not (stock and ours):
            continue
        for reading in ("NVML", "cudaMemGetInfo"):
            a, b = (ours.get("taken") or {}).get(reading), (stock.get("taken") or {}).get(reading)
            if a is None or b is None:
                continue
            out.append(Check(f"{workload} workload: device memory taken, pgmo / stock "
                             f"({reading}, peak of the process)",
                             f"{mib(a)} / {mib(b)} MiB; the run's physical limit "
                             f"{mib(ours.get('physical_limit'))} MiB",
                             ratio_verdict(a, b), "info"))
        a, b = steady_ms(ours.get("laps_ms") or []), steady_ms(stock.get("laps_ms") or [])
        if a is not None and b is not None:
            out.append(Check(f"{workload} workload: time per iteration from the 4th on, "
                             f"pgmo / stock", f"{a:,.1f} / {b:,.1f} ms",
                             ratio_verdict(a, b, "time"), "info"))
    return out


REPLAY_COLUMNS = ("workload", "pool", "requests", "corrupted", "taken, NVML (MiB)",
                  "taken, cudaMemGetInfo (MiB)", "physical limit (MiB)", "NVML / limit",
                  "own count (MiB)", "iterations 1-3 (ms)", "steady (ms)", "pgmo: arena, heap")


def replay_rows(data: dict) -> list[tuple]:
    rows = []
    for workload in WORKLOADS:
        for pool in POOLS:
            r = _result(data, replay_key(workload, pool))
            if r is None:
                continue
            taken = r.get("taken") or {}
            limit = r.get("physical_limit")
            nvml = taken.get("NVML")
            stats = r.get("stats") or {}
            own = stats.get("peak_total_bytes") if stats else r.get("own_total_bytes")
            laps = r.get("laps_ms") or []
            steady = steady_ms(laps)
            rows.append((r.get("workload", workload), pool, f"{r.get('requests', 0):,}",
                         r.get("corrupted", "-"), mib(nvml), mib(taken.get("cudaMemGetInfo")),
                         mib(limit), f"{nvml / limit:.2f}" if nvml and limit else "-",
                         mib(own), " + ".join(f"{x:,.0f}" for x in laps[:3]) or "-",
                         "-" if steady is None else f"{steady:,.1f}",
                         f"{stats.get('arena_kind')}, {stats.get('heap_kind')}" if stats
                         else "-"))
    return rows


# ------------------------------------------------------------------ streams, limit, teardown
def stream_checks(data: dict) -> list[Check]:
    out = []
    r = _result(data, "second-stream")
    if r is not None:
        stats = r.get("stats") or {}
        out += replay_safety("second stream: requests under it, kernels there reading "
                             "dropped blocks across boundaries", r)
        out.append(Check("second stream: what it exercised",
                         f"{r.get('touches', 0)} kernels on it, still running at "
                         f"{r.get('pending_at_ends', 0)} of {r.get('iterations', 0)} "
                         f"iteration ends; {stats.get('foreign_requests', 0)} requests under "
                         f"it (served by CuPy's pool)", "-", "info"))
        out += device_errors("second stream", r)
    r = _result(data, "per-thread-stream")
    if r is not None:
        out += replay_safety("per-thread default stream: blocks dropped on another thread "
                             "while their kernels run", r)
        pending = r.get("pending_after_drops") or []
        after = r.get("pending_after_owner")
        verdict, status = _passed(r.get("stream") == 2 and after in (0, None),
                                  "frees from the other thread waited for the owner",
                                  "per-thread default stream not in use" if r.get("stream") != 2
                                  else f"{after} frees still waiting after the owner's request")
        out.append(Check("per-thread default stream: frees from another thread",
                         f"current stream handle {r.get('stream')}; "
                         f"{r.get('dropped_elsewhere', 0)} drops ({r.get('busy_at_drops', 0)} "
                         f"while the owner's kernels ran), waiting after each: {pending}; "
                         f"after the owner's next request: {after}", verdict, status))
        out += device_errors("per-thread default stream", r)
    r = _result(data, "set-limit")
    if r is not None:
        limit = r.get("physical_limit")
        for name, want_oom in (("pgmo fits", False), ("stock fits", False),
                               ("pgmo too small", True)):
            x = r.get(name)
            if not x:
                continue
            measured = (f"limit {mib(x.get('limit'))} MiB ({x.get('limit', 0) / limit:.2f}x "
                        f"the physical limit): "
                        + (f"out of memory at request {x['oom']['request']:,}" if x.get("oom")
                           else f"completed, {x.get('requests', 0):,} requests")
                        + (f", peak held {mib((x.get('stats') or {}).get('peak_total_bytes'))}"
                           " MiB" if x.get("stats") else ""))
            out += replay_safety(f"set_limit, {name}: pattern check", x)
            if name == "stock fits":
                out.append(Check(f"set_limit, {name}", measured, "-", "info"))
            elif want_oom:
                ok = bool(x.get("oom")) and x.get("serves_after") is True
                out.append(Check(f"set_limit, {name}", measured, *_passed(
                    ok, "a clean OutOfMemoryError, and the pool serves again",
                    "no OutOfMemoryError" if not x.get("oom")
                    else f"the pool did not serve again: {x.get('serves_after')}")))
            else:  # a limit is a promise never to hold more; completing under it is a figure
                peak = (x.get("stats") or {}).get("peak_total_bytes", 0)
                if peak > x.get("limit", 0):
                    out.append(Check(f"set_limit, {name}", measured,
                                     "FAIL: pgmo held more than its limit", "fail"))
                else:
                    out.append(Check(f"set_limit, {name}", measured,
                                     "ran out of memory under 1.25x the run's physical limit "
                                     "(CuPy's pool: the next row)" if x.get("oom")
                                     else "completed within its limit", "info"))
        out += device_errors("set_limit", r)
    r = _result(data, "teardown")
    if r is not None:
        out += replay_safety("teardown: the run before the drop", r)
        left = r.get("left_bytes")
        measured = (f"kernels still running at the last boundary: "
                    f"{'yes' if r.get('pending_at_boundary') else 'no'}, at the drop: "
                    f"{'yes' if r.get('pending_at_drop') else 'no'}; drop took "
                    f"{r.get('drop_ms', 0):,.1f} ms; device sync: "
                    f"{r.get('sync_error') or 'ok'}; cudaGetLastError {r.get('last_error')}; "
                    f"left on the device after the drop: {mib(left)} MiB")
        ok = not r.get("sync_error") and r.get("last_error") in (0, None) \
            and not r.get("violations") and left is not None and left <= LEFT_MAX
        out.append(Check("teardown: the pool dropped while kernels use its memory", measured,
                         *_passed(ok, "no error, its memory given back",
                                  "an error, or memory left behind")))
    return out


# ------------------------------------------------------------------ the page
def checks(data: dict) -> list[Check]:
    """Every row of the verdict table, in the order of the steps."""
    return (step_checks(data) + device_checks(data) + driver_pool_checks(data)
            + cost_checks(data) + replay_checks(data) + stream_checks(data))


def verdict(data: dict) -> tuple[bool, str]:
    """(passed, the verdict line): FAIL naming every failed check, else PASS."""
    failed = [c for c in checks(data) if c.status == "fail"]
    label = " (stand-ins)" if data.get("dry_run") else ""
    if not data.get("steps"):
        return False, f"quick check: FAIL{label}: nothing was measured"
    if failed:
        return False, (f"quick check: FAIL{label}: {len(failed)} check(s) failed: "
                       + "; ".join(f"{c.question}: {c.verdict[len('FAIL: '):]}"
                                   for c in failed))
    return True, f"quick check: PASS{label}: every check held"


def _section(title: str, lines: list[str]) -> list[str]:
    return [title, "", *lines, ""]


def render(data: dict, heading: str = "#") -> str:
    """The whole report; ``heading`` is the level of its title ("##" inside another page)."""
    sub = heading + "#"
    out = [f"{heading} pgmo quick GPU check", ""]
    if data.get("dry_run"):
        out += ["**DRY RUN on the CPU**: stand-in modules for `cupy.cuda.runtime`, NVML and "
                "`cuda.bindings.driver` over host memory, small workloads: every number "
                "below is a stand-in's, not a measurement.", ""]
    passed, line = verdict(data)
    out += [f"**{line}**", ""]
    env = data.get("environment", {})
    out += [f"- command: `{data.get('command', '?')}`",
            f"- device: {env.get('device', 'unknown')}"
            + (f" ({env['device memory']})" if env.get("device memory") else ""),
            "- versions: " + (", ".join(f"{k} {v}" for k, v in env.items()
                                        if k not in ("device", "device memory"))
                              or "unknown"),
            f"- date: {data.get('date', '?')}",
            "- steps (limit, time): " + "; ".join(
                f"{s['name']} {s.get('status', 'no status')} ({s.get('limit_s', 0):.0f} s, "
                f"{s.get('seconds', 0):.0f} s)"
                for s in data.get("steps", [])),
            ""]
    rows = [(c.question, c.measured, c.verdict) for c in checks(data)]
    out += _section(f"{sub} Verdicts", markdown(("check", "measured", "verdict"), rows, 3))
    device = _result(data, "device")
    if device:
        out += _section(f"{sub} 1. The device layer pgmo chose",
                        ["What `pgmo.device.cuda.device_layer` probed (two granules: reserve, "
                         "create, map, set access, one unmap over both, free; a pool: create, malloc, free, "
                         "trim) and a pgmo pool's `memory_summary()` after a short run:", "",
                         "```", device.get("summary", "(no summary)"), "```"])
    pool = _result(data, "driver-pool")
    if pool:
        out += _section(f"{sub} 2. How the driver's stream-ordered pool reserves",
                        driver_pool_lines(pool))
    costs = _result(data, "costs")
    if costs:
        info = costs.get("info", {})
        out += _section(
            f"{sub} 3. What taking and giving back device memory costs",
            [f"Each call timed on the host, the median of {info.get('repeats', '?')} tries "
             f"(fewer at 1 GiB and more), idle, right after {info.get('behind_ms', 5):g} ms of "
             f"kernels were queued ({info.get('kernels', 5)} spin kernels) on the stream the "
             "calls use, and right after they were queued on another stream; *waited*: the "
             "call returned only once the queue was empty and took at least half that time."
             "  Virtual memory maps whole granules"
             + (f" of {size_text(info['granularity'])}" if info.get("granularity") else "")
             + ": smaller sizes are rounded up.  *cuMemUnmap (a run of granules)*: one "
             "call over the size mapped as one mapping per granule, side by side (as pgmo's "
             "heap gives its pages back at a boundary); up to one granule that is a single "
             "mapping.", "",
             *markdown(COST_COLUMNS, cost_rows(costs), 3)])
    replays = replay_rows(data)
    if replays:
        out += _section(
            f"{sub} 4. Replays on the device, the same measurement for both pools",
            ["Each run a fresh process replaying a whole run through the pool named, every "
             "block pattern-checked at its free.  *Taken*: the peak of NVML's count for the "
             "process, or of the device's used bytes (`cudaMemGetInfo`), sampled every 5 ms "
             "and at each iteration's end, less the baseline once the CUDA context existed; "
             "*physical limit*: the most bytes the run has live at once; *own count*: what "
             "the pool says it held at its peak (pgmo) or at the end (CuPy), never compared.",
             "", *markdown(REPLAY_COLUMNS, replays)])
    return "\n".join(out)


def driver_pool_lines(pool: dict) -> list[str]:
    lines = ["`cudaMemPoolAttrReservedMemCurrent` of a private pool (release threshold at "
             "its maximum) after each request, each on a fresh pool, then after its free and "
             "a trim:", ""]
    lines += markdown(("request", "reserved", "used", "after its free", "after a trim"),
                      [(size_text(r["size"]), size_text(r["reserved"]), size_text(r["used"]),
                        size_text(r["reserved_after_free"]), size_text(r["reserved_after_trim"]))
                       for r in pool.get("fresh") or []], 1)
    turn = pool.get("in_turn")
    if turn:
        lines += ["", "The same requests in turn on one pool (all held):", ""]
        lines += markdown(("request", "reserved", "used"),
                          [(size_text(r["size"]), size_text(r["reserved"]), size_text(r["used"]))
                           for r in turn["requests"]], 1)
        lines += ["", f"All freed and trimmed: {size_text(turn['reserved_after_trim'])} "
                      "reserved."]
    growth = pool.get("one_live_per_growth")
    if growth:
        lines += ["", f"{growth['blocks']} blocks of {size_text(growth['block'])} on one pool: "
                      f"the reservation grew {len(growth['growths'])} times "
                      f"({', '.join(size_text(g) for g in growth['growths'][:8])}"
                      f"{', ...' if len(growth['growths']) > 8 else ''}); with the first "
                      f"block of each growth live and the others freed, a trim left "
                      f"{size_text(growth['reserved_after_trim'])} reserved "
                      f"({size_text(growth['used_after_trim'])} used): "
                      f"{trim_verdict(growth)}."]
    pages = pool.get("cudaMalloc")
    if pages:
        lines += ["", "cudaMalloc, each request held: the device's used bytes grew by "
                  + ", ".join(f"{size_text(r['used_grew']) if r['used_grew'] else '0'} "
                              f"({size_text(r['size'])})" for r in pages) + "."]
    return lines
