"""Write ``docs/results.md`` from a GPU session's output folder: the paper's Figures 2 and 3
as measured, and everything else the session measured, with where pgmo loses.

    python -m scripts.results_table tests/data/gpu-evidence/2026-11-25-h100 -o docs/results.md
    python -m scripts.results_table results-gpu/ -o docs/results.md     # after the next run

The folder is what ``scripts/gpu_session.sh`` (all steps, ``bench`` included)
leaves in ``$OUT``; :mod:`scripts.evidence` reads it.  Every number comes
from those files, with the file named beside its table; what the folder
lacks reads as "not measured".  Nothing is typed in by hand, so after the
next GPU run the same command rewrites the page.  ``--check`` compares the
page with what the folder gives and fails when they differ.
"""

from __future__ import annotations

import re
import sys

from pgmo import programs

programs.start(__name__)  # Ctrl-C from here on: one line, exit status 130

from . import markdown, quick_check_report  # noqa: E402
from .evidence import Session, find  # noqa: E402
from .markdown import number, rows_under  # noqa: E402

MISSING = "not measured"
TASKS = {"train": "train", "inference": "inference"}
#: nvml-process-peaks.md names inference runs "<model> infer".
PROBE_MODEL = re.compile(r"^(?P<model>[\w-]+?)(?P<infer> infer)?$")


def mib(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def md(columns, rows) -> list[str]:
    """A table of this page: model, task and batch (or the like) left-aligned."""
    return markdown.table(columns, rows, text_columns=3)


# ----------------------------------------------------------------- the data
#: The columns of bench_memory's report measured from outside the pool (today's format).
TAKEN, TAKEN_NVML = "taken, cudaMemGetInfo (MiB)", "taken, NVML (MiB)"


def cnn_rows(session: Session) -> list[dict]:
    """One dict per CNN configuration with both pools' numbers (bench_memory, NVML probe).

    Each pool's ``outside`` is its one figure measured from outside the pool,
    the same way for both pools over the whole run: bench_memory's *taken*
    (``cudaMemGetInfo``) where the report has it, else the outside probe's
    NVML peak (2026-11-25).  Every comparison of the pools uses it and only it;
    the pools' own counts and the 2026-11-25 report's iteration-end readings
    are kept to be shown, labelled, never compared.
    """
    per_run = rows_under(session.results, "Memory and time per iteration")
    side = {(r["model"], r["task"], r["batch"]): r
            for r in rows_under(session.results, "Stock pool and pgmo side by side")}
    probe = nvml_probe_peaks(session)
    rows: dict[tuple, dict] = {}
    for r in per_run:
        key = (r["model"], r["task"], r["batch"])
        row = rows.setdefault(key, {"model": key[0], "task": key[1], "batch": key[2]})
        pool = r["pool"]
        today = TAKEN in r
        nvml = number(r.get(TAKEN_NVML)) if today else probe.get((*key, pool))
        row[pool] = {
            "outside": number(r.get(TAKEN)) if today else nvml,
            "nvml": nvml,
            "live": number(r.get("live bytes, peak (MiB)")),
            "own": number(r.get("pool's own count, peak (MiB)")),
            # 2026-11-25's format: read at iteration ends, pgmo's only once it had its plan
            "pool_total_at_ends": None if today else number(r.get("peak pool total (MiB)")),
            "device_at_ends": None if today else number(r.get("peak device in use (MiB)")),
            "ms": r.get("ms/iter", "-"),
            "planned": number(r.get("planned peak (MiB)")),
            "bound": number(r.get("lower bound (MiB)")),
            "ratio": number(r.get("planned / bound")),
        }
        row["today"] = today
        row["time_ratio"] = side.get(key, {}).get("time pgmo / stock", "-")
    return list(rows.values())


def nvml_probe_peaks(session: Session) -> dict[tuple, float]:
    """(model, task, batch, pool) -> MiB from the outside probe's table, if there is one."""
    out = {}
    for r in rows_under(session.nvml_probe, ""):
        m = PROBE_MODEL.match(r.get("model", ""))
        peak = next((v for k, v in r.items() if k.startswith("peak device MiB")), None)
        if m and peak is not None and r.get("rc") == "0":
            task = "inference" if m["infer"] else "train"
            out[(m["model"], task, r["batch"], r["pool"])] = number(peak)
    return out


def probe_rows(session: Session) -> list[dict[str, str]]:
    return rows_under(session.nvml_probe, "")


def worse(row: dict, field: str = "outside") -> float | None:
    """pgmo / stock for one field of a CNN row; None when either is missing."""
    stock, ours = row.get("stock", {}).get(field), row.get("pgmo", {}).get(field)
    return ours / stock if stock and ours is not None else None


def outside_source(session: Session, rows: list[dict]) -> str:
    """How the figure every comparison uses was measured, in the page's words."""
    if any(r.get("today") for r in rows):
        return ("the device memory each run took, `cudaMemGetInfo` sampled every 5 ms inside "
                "iterations and at their ends, peak over the whole run less the baseline once "
                "the CUDA context existed")
    return ("the process's device memory over its whole life, NVML every 10 ms, peak over "
            "the device's idle use, one process per pool")


def seq2seq_outside(session: Session) -> tuple[dict, dict] | None:
    """(stock, pgmo) rows of seq2seq measured from outside, today's bench_memory or the probe."""
    seq = {r["pool"]: r for r in rows_under(session.results, "seq2seq")}
    if "stock" in seq and "pgmo" in seq and TAKEN in seq["stock"]:
        return ({"mib": number(seq["stock"].get(TAKEN)), "done": True},
                {"mib": number(seq["pgmo"].get(TAKEN)), "done": True})
    probe = {r["pool"]: r for r in probe_rows(session) if r.get("model") == "seq2seq"}
    if "stock" in probe and "pgmo" in probe:
        def get(r):
            peak = next((v for k, v in r.items() if k.startswith("peak device MiB")), None)
            return {"mib": number(peak), "done": r.get("rc") == "0",
                    "wall": r.get("wall s")}
        return get(probe["stock"]), get(probe["pgmo"])
    return None


def seq2seq_text(session: Session) -> tuple[str, str] | None:
    """seq2seq's memory, pgmo against the stock pool, from outside the pool only:
    (the ratio, "at least 7.5x" when pgmo's run was stopped; the figures behind it)."""
    both = seq2seq_outside(session)
    if not both or not both[0]["mib"] or both[1]["mib"] is None:
        return None
    stock, ours = both
    ratio = ours["mib"] / stock["mib"]
    if ours["done"]:
        return f"{ratio:.2f}x", f"{mib(ours['mib'], 0)} vs {mib(stock['mib'], 0)} MiB"
    stopped = f" at {ours['wall']} s" if ours.get("wall") else ""
    return (f"at least {ratio:.1f}x", f"{mib(ours['mib'], 0)} MiB when stopped at its time "
            f"limit{stopped}, its batches not finished, against {mib(stock['mib'], 0)} MiB for "
            "the stock pool's whole run")


# ----------------------------------------------------------------- the page
def headline(session: Session, rows: list[dict]) -> str:
    setup = session.setup()
    both = [r for r in rows if worse(r) is not None]
    planned = [r for r in rows if r.get("pgmo", {}).get("ratio") is not None]
    at_bound = [r for r in planned if r["pgmo"]["ratio"] <= 1.0]
    if not both:
        return (f"No memory measured from outside the pool in {session.folder.name}: nothing "
                "to compare yet.")
    losing = [r for r in both if worse(r) > 1]
    top = max(both, key=worse)
    where = (f"On one {setup.get('device', 'GPU')} ({setup.get('date', 'date unknown')}), "
             "measured from outside the pool the same way for both pools over the whole "
             + ("run (`cudaMemGetInfo`)" if any(r.get("today") for r in rows)
                else "process (NVML, one process per pool)"))
    if not losing:
        verdict = (f"pgmo took no more device memory than CuPy's stock pool in any of "
                   f"{len(both)} CNN configurations (at most {worse(top):.2f}x)")
    else:
        verdict = (f"pgmo took more device memory than CuPy's stock pool in {len(losing)} of "
                   f"{len(both)} CNN configurations (up to {worse(top):.2f}x, {top['model']} "
                   f"{top['task']} b{top['batch']}: {mib(top['pgmo']['outside'], 0)} vs "
                   f"{mib(top['stock']['outside'], 0)} MiB)")
    seq = seq2seq_text(session)
    plans = (f"{', though' if losing else ';'} its plans reached the lower bound in "
             f"{len(at_bound)} of {len(planned)}" if planned else "")
    tail = ": today pgmo loses on memory." if losing else "."
    return (where + ", " + verdict + (f" and in seq2seq {seq[0]}" if seq else "")
            + plans + tail)


def losses(session: Session, rows: list[dict]) -> list[str]:
    """Where pgmo loses, each from the data; memory only from outside the pool."""
    out = []
    both = [r for r in rows if worse(r) is not None]
    bad = sorted((r for r in both if worse(r) > 1), key=lambda r: -worse(r))
    if bad:
        same = [r for r in both if worse(r) == 1]
        ratios = sorted(worse(r) for r in bad)
        out.append(f"**Device memory, seen from outside the pool.**  Measured the same way for "
                   f"both pools ({outside_source(session, rows)}): pgmo took more in "
                   f"{len(bad)} of {len(both)} CNN configurations, {ratios[0]:.2f}x to "
                   f"{ratios[-1]:.2f}x the stock pool's ({describe(bad[0])}: "
                   f"{mib(bad[0]['pgmo']['outside'], 0)} vs "
                   f"{mib(bad[0]['stock']['outside'], 0)} MiB)"
                   + (f"; the same in {', '.join(describe(r) for r in same)}" if same else "")
                   + ".  Its plans need about the lower bound: the excess is what it takes "
                   "before and beside the plan (warm-up, profiling, the arena taken while the "
                   "profiled iteration's memory is still held).")
    seq = seq2seq_text(session)
    rest = {r["pool"]: r for r in rows_under(session.results, "seq2seq")}
    if seq or ("stock" in rest and "pgmo" in rest):
        text = "**Variable-length batches (seq2seq).**  "
        if seq:
            text += (f"Seen from outside the pool the same way for both, pgmo's process took "
                     f"{seq[0]} the stock pool's device memory ({seq[1]}).  ")
        if "stock" in rest and "pgmo" in rest:
            s, p = rest["stock"], rest["pgmo"]
            text += (f"In bench_memory's {p.get('iterations')} batches pgmo re-planned "
                     f"{p.get('re-optimizations')} times and served {p.get('fallback reqs')} "
                     f"requests outside the plan, at {number(p.get('ms/iter')) or 0:.0f} "
                     f"against {number(s.get('ms/iter')) or 0:.0f} ms per iteration.")
        out.append(text.rstrip())
    search = {r["pool"]: r["largest batch that fits"]
              for r in rows_under(session.results, "Largest training batch")}
    if search:
        model = rows_under(session.results, "Largest training batch")[0]["model"]
        out.append(f"**Largest batch.**  Under a memory limit the largest {model} training "
                   f"batch was {search.get('stock', '-')} with the stock pool and "
                   f"{search.get('pgmo', '-')} with pgmo"
                   + (" (pgmo judged once it had a plan, the stock pool from the start: see "
                      "below)." if "profiles its first iterations" in session.results
                      else " (the limit set from the start for both)."))
    slow = [r for r in rows if ratio_value(r) and ratio_value(r) > 1.1]
    if slow:
        once = all(" runs)" not in str(r.get("stock", {}).get("ms")) for r in slow)
        probe = probe_times(session)
        elsewhere = [f"{describe(r)} {probe[key(r)][0]:.1f} ms with the stock pool and "
                     f"{probe[key(r)][1]:.1f} ms with pgmo" for r in slow if key(r) in probe]
        out.append("**Time.**  pgmo was more than 10 % slower per iteration in "
                   + ", ".join(f"{describe(r)} ({ratio_value(r):.2f}x)" for r in slow) + "."
                   + ("  Each configuration ran once, so a single run decides each ratio"
                      + (f"; the outside probe's separate runs measured {'; '.join(elsewhere)}"
                         if elsewhere else "")
                      + " (`bench_memory.py --repeats` now gives the median and range of "
                        "several runs)." if once else ""))
    malloc = {(r.get("workload"), r.get("path")): r for r in malloc_rows(session)}
    pairs = malloc.get(("pairs", "pgmo optimized"))
    if pairs and number(pairs.get("x cupy MemoryPool")) and \
            number(pairs["x cupy MemoryPool"]) > 1:
        out.append(f"**malloc+free.**  A planned malloc+free cost "
                   f"{pairs['us / malloc+free']} us, {pairs['x cupy MemoryPool']}x CuPy's "
                   "pool, on the `pairs` workload.")
    failures = session.pytest_failures()
    failed = session.failed_workloads()
    if failures or failed:
        errors = [f for f in failed if f[0]]
        out.append(f"**Failures.**  {len(failures)} GPU test(s) failed "
                   f"({', '.join(f'`{f}`' for f in failures)}); in step traces "
                   f"{len(errors)} workload(s) could not be recorded under pgmo's profiling "
                   f"mode (\"{errors[0][1]}\") and {len(failed) - len(errors)} ran out of "
                   "memory." if errors else "")
    return out


def key(row: dict) -> tuple:
    return row["model"], row["task"], row["batch"]


def probe_times(session: Session) -> dict[tuple, tuple[float, float]]:
    """(model, task, batch) -> (stock, pgmo) ms/iter of the outside probe's runs."""
    times: dict[tuple, dict] = {}
    for r in probe_rows(session):
        m = PROBE_MODEL.match(r.get("model", ""))
        ms = number(r.get("ms/iter (median)"))
        if m and ms is not None:
            task = "inference" if m["infer"] else "train"
            times.setdefault((m["model"], task, r["batch"]), {})[r["pool"]] = ms
    return {k: (v["stock"], v["pgmo"]) for k, v in times.items() if len(v) == 2}


def ratio_value(row: dict) -> float | None:
    return number(row.get("time_ratio"))


def describe(row: dict) -> str:
    task = "inference" if row["task"] == "inference" else "training"
    return f"{row['model']} {task} b{row['batch']}"


def malloc_rows(session: Session) -> list[dict[str, str]]:
    return rows_under(session.malloc, "")


def ratio_cell(row: dict, field: str = "outside") -> str:
    value = worse(row, field)
    return "-" if value is None else f"{value:.2f}x"


def figures_section(session: Session, rows: list[dict]) -> list[str]:
    """Figures 2 and 3: the pools compared on the outside measurement only; their own counts
    (and, for 2026-11-25, the readings at iteration ends) beside it, labelled."""
    today = any(r.get("today") for r in rows)
    if today:
        compared = ("device memory taken, whole run, stock / pgmo (MiB)", "pgmo / stock",
                    "NVML taken, stock / pgmo (MiB)", "live bytes, peak, stock / pgmo (MiB)")
        shown = ("pool's own count, peak, stock / pgmo (MiB): reported, not compared",)
    else:
        compared = ("NVML process peak, whole process, stock / pgmo (MiB)", "pgmo / stock")
        shown = ("not comparable: pool total at iteration ends, stock every iteration / "
                 "pgmo planned ones only (MiB)",
                 "not comparable: device in use at iteration ends, stock every iteration / "
                 "pgmo planned ones only (MiB)")
    columns = ("model", "task", "batch", *compared, "lower bound (MiB)", "plan / bound",
               "ms/iter stock / pgmo", "time pgmo / stock", *shown)
    body = []
    for r in rows:
        s, p = r.get("stock", {}), r.get("pgmo", {})

        def both(field, digits=1):
            return f"{mib(s.get(field), digits)} / {mib(p.get(field), digits)}"

        if today:
            memory = (both("outside"), ratio_cell(r), both("nvml"), both("live"))
            labelled = (both("own"),)
        else:
            memory = (both("outside", 0), ratio_cell(r))
            labelled = (both("pool_total_at_ends"), both("device_at_ends"))
        body.append((r["model"], r["task"], r["batch"], *memory, mib(p.get("bound")),
                     mib(p.get("ratio"), 3), f"{s.get('ms', '-')} / {p.get('ms', '-')}",
                     r.get("time_ratio", "-"), *labelled))
    if today:
        notes = [
            "- *device memory taken*: the peak of the device's used bytes (`cudaMemGetInfo`, "
            "sampled every 5 ms inside iterations and at their ends) over the whole run "
            "(building the model, warm-up, profiling, the switch to the plan and re-plans "
            "included), less the baseline once the CUDA context existed: measured the same "
            "way for both pools, the basis of *pgmo / stock*.",
            "- *NVML taken*: the same through NVML's count for the process (`-` without "
            "`nvidia-ml-py`).",
            "- *live bytes*: the most bytes in live blocks at once, counted by a CuPy memory "
            "hook under both pools (requests rounded to 512 B): no pool can hold less.",
            "- *pool's own count*: what the pools say they held at their peak (pgmo: its "
            "`peak_total_bytes`); their own bookkeeping, shown, never compared."]
    else:
        notes = [
            "- *NVML process peak*: the device memory the driver gave the process, sampled "
            "every 10 ms through NVML over the whole process, from before CUDA started to "
            "its end (warm-up, profiling and re-plans included), over the device's idle use, "
            "one process per pool (the outside probe's separate runs, "
            "`examples/train_imagenet.py`): measured the same way for both pools, the basis "
            "of *pgmo / stock*; `-` where it was not measured.",
            "- *not comparable* (as `bench_memory.py` measured them that day, kept for the "
            "record): the pools' own count of what they held from `cudaMalloc` and the "
            "device in use (`cudaMemGetInfo`), both read at iteration ends only, for the "
            "stock pool at every iteration (its cache makes the end its peak) but for pgmo "
            "only once it answered from its plan, so its warm-up, profiling and the "
            "arena taken while its profiled iteration's memory was held are not in them.  "
            "No ratio on this page uses them."]
    return [
        "## Figures 2 and 3: memory and time per iteration", "",
        f"Source: `{results_name(session)}` (`scripts/bench_memory.py`)"
        + ("" if today else f"; the compared memory column: {nvml_source(session)}") + ".",
        "", *md(columns, body), "",
        "How each column was measured:", "", *notes,
        "- *lower bound*: the most bytes live at once in pgmo's profiled iteration, sizes "
        "rounded to 512 B: no pool can serve that iteration in less.",
        "- *plan / bound*: the peak of pgmo's plan (`best`, 2 s) over the lower bound: pgmo's "
        "own counters.",
        "- *ms/iter*: the median time per iteration after the first two (pgmo's warm-up "
        "and profiled ones), each configuration a fresh process; with several runs, the "
        "median of their medians and their range.",
        "- *time pgmo / stock*: the ratio of the two medians.", ""]


def results_name(session: Session) -> str:
    path = find(session.folder, "results")
    return path.name if path else MISSING


def nvml_source(session: Session) -> str:
    if session.nvml_probe:
        return ("`nvml-process-peaks.md`, an outside probe's separate runs (one process per "
                "pool, `examples/train_imagenet.py`)")
    return f"`{results_name(session)}`"


def copied_table(title: str, source: str, rows: list[dict[str, str]], notes: list[str],
                 columns: tuple | None = None) -> list[str]:
    """A table of the session's own, as written, under a title and how it was measured."""
    if not rows:
        return [f"## {title}", "", f"{MISSING} ({source} has no such table).", ""]
    columns = columns or tuple(rows[0])
    return [f"## {title}", "", f"Source: {source}.", "",
            *md(columns, [[r.get(c, "") for c in columns] for r in rows]), "",
            *notes, ""]


def page(session: Session) -> str:
    setup = session.setup()
    rows = cnn_rows(session)
    steps = session.steps()
    out = [
        "# pgmo on a GPU: measured results", "",
        f"<!-- Generated by python -m scripts.results_table from {session.folder.name}/; "
        "do not edit: run it again. -->", "",
        f"Measured on {setup.get('date', 'an unknown date')} on one "
        f"{setup.get('device', 'GPU')} (driver {setup.get('driver', '?')}, CUDA runtime "
        f"{setup.get('cuda_runtime', '?')}): Python {setup.get('python', '?')}, NumPy "
        f"{setup.get('numpy', '?')}, CuPy {setup.get('cupy', '?')}, Chainer "
        f"{setup.get('chainer', '?')}, pgmo {setup.get('pgmo', '?')}"
        + (f" at commit {setup['commit']}" if "commit" in setup else "")
        + f", hot path {setup.get('hot_path', '?')}.  Source: the session's output folder "
          f"`{session.folder.name}/` (each table names its file).", "",
        f"**Headline.**  {headline(session, rows)}", "",
        "## Where pgmo loses today", "", *[f"- {line}" for line in losses(session, rows)], "",
        *figures_section(session, rows),
    ]
    if session.quick_check:
        out += [quick_check_report.render(session.quick_check, "##"),
                "Source: `quick-check.json` (`scripts/gpu_quick_check.py`, step quick).", ""]
    out += copied_table(
        "Largest batch under a memory limit", f"`{results_name(session)}`",
        rows_under(session.results, "Largest training batch"),
        ["- *largest batch that fits*: batch sizes bisected, each a fresh process under "
         "`set_limit` on the pool under test; in this session pgmo's limit was set once it "
         "had a plan and it was judged on its total bytes after that, the stock pool on not "
         "running out of memory (since then `bench_memory.py` sets the limit from the start "
         "for both, one criterion)." if "profiles its first iterations" in session.results
         else "- *largest batch that fits*: batch sizes bisected, each a fresh process with "
              "`set_limit` on the pool under test from its start: a batch fits when every "
              "iteration runs under the limit, for both pools."])
    out += copied_table(
        "seq2seq: variable-length batches", f"`{results_name(session)}`",
        rows_under(session.results, "seq2seq"),
        [("- *pool total after* and *device in use after*: read once, after the last batch "
          "(not a peak over the run; the pool total is each pool's own count): not "
          "compared on this page; "
          if "pool total after (MiB)" in session.results else
          "- memory as in the Figures' table, over all the batches; ")
         + "*re-optimizations*: re-plans after a departure; *fallback reqs*: requests served "
         "outside the plan; *departures*: iterations that left the plan."])
    probe = [r for r in probe_rows(session) if r.get("model") == "seq2seq"]
    if probe:
        out += copied_table(
            "seq2seq seen by NVML", "`nvml-process-peaks.md` (outside probe, 60 batches)",
            probe, ["- *peak device MiB over idle*: NVML every 10 ms over the whole process; "
                    "*rc* 124: the run was stopped at its time limit."])
    out += copied_table(
        "DenseNet-BC with recomputation", f"`{results_name(session)}`, its last section",
        rows_under(session.results, "DenseNet-BC"),
        ["- One training iteration of DenseNet-BC-100 (k=12) at batch 64 recorded under "
         "CuPy's stock pool (`pgmo.TraceRecorder`); *lower bound* and the plans as "
         "`pgmo analyze` makes them; *stock pool reserved*: what that pool held."])
    out += densenet_traces(session)
    out += copied_table(
        "malloc+free against CuPy's pool", "`bench_malloc.txt` "
        f"(`{steps.get('malloc', {}).get('command', 'python -m scripts.bench_malloc --gpu')}`)",
        malloc_rows(session),
        ["- microseconds per malloc+free pair, best of 5 runs of 20 iterations of 2,000 "
         "requests; *pairs*: each block freed at once, *stack*: 32 allocations freed in "
         "reverse; ratios to CuPy's `MemoryPool` and to pgmo's optimized path."])
    out += chainermn_section(session, steps)
    out += sanitizer_section(session, steps)
    out += tests_section(session, steps)
    return "\n".join(out).rstrip() + "\n"


def densenet_traces(session: Session) -> list[str]:
    rows = []
    for name, meta in sorted(session.traces.items()):
        if "densenet" in name and meta.get("reserved_peak"):
            rows.append((f"`h100-{name[:-len('.json.gz')]}`" if "H100" in
                         str(meta.get("device")) else name,
                         "on" if meta.get("recompute") else "off", meta.get("requests"),
                         mib(meta["lower_bound"] / 2**20), mib(meta["reserved_peak"] / 2**20)))
    if not rows:
        return []
    return ["The session's traces step recorded the same two iterations separately "
            "(bundled with pgmo under these names):", "",
            *md(("trace", "recompute", "requests", "lower bound, as requested (MiB)",
                 "stock pool reserved (MiB)"), rows), ""]


def chainermn_section(session: Session, steps: dict) -> list[str]:
    rows, summary = session.chainermn()
    command = steps.get("mn", {}).get("command", "")
    if not rows:
        return ["## ChainerMN: two ranks", "", f"{MISSING} (no step mn in session.log).", ""]
    columns = tuple(rows[0])
    return ["## ChainerMN: two ranks", "",
            f"Source: `session.log`, step mn: `{command}`.", "",
            *md(columns, [[r[c] for c in columns] for r in rows]), "",
            *[f"- {line}" for line in summary],
            "- *planned*: requests served from the plan; *fallback*: requests the plan placed "
            "but the stock pool served; *pinned*: blocks that outlive their iteration, "
            "planned to the stock pool; *held, peak*: the most the rank's pool held; the "
            "digests show each rank's parameters, identical at the end.", ""]


def sanitizer_section(session: Session, steps: dict) -> list[str]:
    summaries = session.sanitizer_summaries()
    runs = [(name, steps[name].get("command", "")) for name in steps
            if name.startswith("sanitizer")]
    if not runs:
        return ["## compute-sanitizer", "", f"{MISSING}.", ""]
    rows = [(name.split("-", 1)[-1], f"`{command.split(' --leak-check no ')[-1]}`",
             summaries[k] if k < len(summaries) else MISSING)
            for k, (name, command) in enumerate(runs)]
    return ["## compute-sanitizer", "", "Source: `sanitizer.log` and `session.log`.", "",
            *md(("run", "program", "memcheck's ERROR SUMMARY"), rows), "",
            "- `compute-sanitizer --tool memcheck --leak-check no`: every device access "
            "checked against what was allocated, with pgmo's pool serving.", ""]


def tests_section(session: Session, steps: dict) -> list[str]:
    line = session.summary_line("pytest") or MISSING
    failures = session.pytest_failures()
    failed = session.failed_workloads()
    out = ["## Tests and recordings on the GPU", "",
           f"- `pytest -m gpu` (`pytest-gpu.log`): {line}."]
    out += [f"  - failed: `{name}`" for name in failures]
    traces = steps.get("traces")
    if traces:
        out.append(f"- step traces (`{traces['command'].split(' --out-dir')[0]} ...`): exit "
                   f"{traces.get('exit', '?')}, {len(session.traces)} trace(s) written, "
                   f"{len(failed)} workload(s) failed.")
    return out + [""]


# ------------------------------------------------------------------ command line
def main(argv=None) -> int:
    parser = programs.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=programs.existing_path("folder"),
                        help="a GPU session's output folder ($OUT)")
    parser.add_argument("-o", "--output", type=programs.output_file,
                        help="write here (default: stdout)")
    parser.add_argument("--check", action="store_true",
                        help="fail if --output differs from what the folder gives")
    args = parser.parse_args(argv)
    try:
        text = page(Session.read(args.folder))
    except FileNotFoundError as error:
        print(f"results_table: {error}", file=sys.stderr)
        return 2
    if args.check:
        if args.output is None or not args.output.exists() or args.output.read_text() != text:
            print(f"results_table: {args.output} is not what {args.folder} gives: run "
                  "without --check to write it", file=sys.stderr)
            return 1
        return 0
    if args.output is None:
        sys.stdout.write(text)
    else:
        args.output.write_text(text)
        print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(programs.run(main))
