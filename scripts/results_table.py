#!/usr/bin/env python
"""Write ``docs/results.md`` from a GPU session's output folder: the paper's Figures 2 and 3
as measured, and everything else the session measured, with where pgmo loses.

    python scripts/results_table.py tests/data/gpu-evidence/2026-11-25-h100 -o docs/results.md
    python scripts/results_table.py results-gpu/ -o docs/results.md     # after the next run

The folder is what ``scripts/gpu_session.sh`` (all steps, ``bench`` included)
leaves in ``$OUT``; ``scripts/evidence.py`` reads it.  Every number comes
from those files, with the file named beside its table; what the folder
lacks reads as "not measured".  Nothing is typed in by hand, so after the
next GPU run the same command rewrites the page.  ``--check`` compares the
page with what the folder gives and fails when they differ.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from evidence import Session, number, pair, table  # noqa: E402

MISSING = "not measured"
TASKS = {"train": "train", "inference": "inference"}
#: nvml-process-peaks.md names inference runs "<model> infer".
PROBE_MODEL = re.compile(r"^(?P<model>[\w-]+?)(?P<infer> infer)?$")


def mib(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def md(columns, rows) -> list[str]:
    out = ["| " + " | ".join(columns) + " |",
           "|" + "|".join("---" if i < 3 else "---:" for i in range(len(columns))) + "|"]
    return out + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]


# ----------------------------------------------------------------- the data
def cnn_rows(session: Session) -> list[dict]:
    """One dict per CNN configuration with both pools' numbers (bench_memory, NVML probe)."""
    per_run = table(session.results, "Memory and time per iteration")
    side = {(r["model"], r["task"], r["batch"]): r
            for r in table(session.results, "Stock pool and pgmo side by side")}
    probe = nvml_probe_peaks(session)
    rows: dict[tuple, dict] = {}
    for r in per_run:
        key = (r["model"], r["task"], r["batch"])
        row = rows.setdefault(key, {"model": key[0], "task": key[1], "batch": key[2]})
        pool = r["pool"]
        row[pool] = {
            "pool_total": number(r.get("peak pool total (MiB)")),
            "device": number(r.get("peak device in use (MiB)")),
            "whole_run": number(r.get("whole-run pool peak (MiB)")),
            "nvml": number(r.get("NVML process peak (MiB)")) or probe.get((*key, pool)),
            "ms": r.get("ms/iter", "-"),
            "planned": number(r.get("planned peak (MiB)")),
            "bound": number(r.get("lower bound (MiB)")),
            "ratio": number(r.get("planned / bound")),
            "failed": None if number(r.get("peak pool total (MiB)")) is not None
            else r.get("peak device in use (MiB)"),
        }
        row["time_ratio"] = side.get(key, {}).get("time pgmo / stock", "-")
    return list(rows.values())


def nvml_probe_peaks(session: Session) -> dict[tuple, float]:
    """(model, task, batch, pool) -> MiB from the outside probe's table, if there is one."""
    out = {}
    for r in table(session.nvml_probe, ""):
        m = PROBE_MODEL.match(r.get("model", ""))
        peak = next((v for k, v in r.items() if k.startswith("peak device MiB")), None)
        if m and peak is not None and r.get("rc") == "0":
            task = "inference" if m["infer"] else "train"
            out[(m["model"], task, r["batch"], r["pool"])] = number(peak)
    return out


def probe_rows(session: Session) -> list[dict[str, str]]:
    return table(session.nvml_probe, "")


def worse(row: dict, field: str) -> float | None:
    """pgmo / stock for one field of a CNN row; None when either is missing."""
    stock, ours = row.get("stock", {}).get(field), row.get("pgmo", {}).get(field)
    return ours / stock if stock and ours is not None else None


# ----------------------------------------------------------------- the page
def headline(session: Session, rows: list[dict]) -> str:
    setup = session.setup()
    both = [r for r in rows if worse(r, "pool_total") is not None]
    at_bound = [r for r in both if r["pgmo"]["ratio"] is not None and r["pgmo"]["ratio"] <= 1.0]
    losing = [r for r in both if worse(r, "pool_total") > 1]
    if not both:
        return f"No memory table in {session.folder.name}: nothing to report yet."
    top = max(both, key=lambda r: worse(r, "pool_total"))
    return (f"On one {setup.get('device', 'GPU')} ({setup.get('date', 'date unknown')}), "
            f"pgmo's plans reached the lower bound in {len(at_bound)} of {len(both)} CNN "
            f"configurations, yet pgmo held more device memory than CuPy's stock pool in "
            f"{len(losing)} of {len(both)} (up to {worse(top, 'pool_total'):.2f}x, "
            f"{top['model']} {top['task']} b{top['batch']}): today pgmo loses on memory.")


def losses(session: Session, rows: list[dict]) -> list[str]:
    """Where pgmo loses, each from the data."""
    out = []
    both = [r for r in rows if worse(r, "pool_total") is not None]
    bad = sorted((r for r in both if worse(r, "pool_total") > 1),
                 key=lambda r: -worse(r, "pool_total"))
    if bad:
        out.append(f"**Pool memory.**  pgmo's peak pool total exceeds the stock pool's in "
                   f"{len(bad)} of {len(both)} CNN configurations, by up to "
                   f"{worse(bad[0], 'pool_total'):.2f}x ({describe(bad[0])}).  Its plans "
                   "need about the lower bound, but the memory it takes before and beside "
                   "the plan (warm-up, profiling, the arena taken while the profiled "
                   "iteration's memory is still held) is not given back in time.")
    nvml = [r for r in rows if worse(r, "nvml") is not None and r["task"] == "train"]
    nvml_bad = [r for r in nvml if worse(r, "nvml") > 1]
    if nvml:
        ratios = sorted(worse(r, "nvml") for r in nvml_bad) or [1.0]
        out.append(f"**Process memory (NVML).**  Over its whole life a training process held "
                   f"more device memory with pgmo in {len(nvml_bad)} of {len(nvml)} trainings "
                   f"measured, {ratios[0]:.2f}x to {ratios[-1]:.2f}x the stock pool's.")
    search = {r["pool"]: r["largest batch that fits"]
              for r in table(session.results, "Largest training batch")}
    if search:
        model = table(session.results, "Largest training batch")[0]["model"]
        out.append(f"**Largest batch.**  Under the same memory limit the largest {model} "
                   f"training batch was {search.get('stock', '-')} with the stock pool and "
                   f"{search.get('pgmo', '-')} with pgmo.")
    seq = {r["pool"]: r for r in table(session.results, "seq2seq")}
    if "stock" in seq and "pgmo" in seq:
        s, p = seq["stock"], seq["pgmo"]
        out.append(f"**Variable-length batches (seq2seq).**  After "
                   f"{p.get('iterations')} batches pgmo's pools held "
                   f"{mib(number(p.get('pool total after (MiB)')))} MiB against "
                   f"{mib(number(s.get('pool total after (MiB)')))} MiB, after "
                   f"{p.get('re-optimizations')} re-plans and {p.get('fallback reqs')} "
                   f"requests served outside the plan, at {number(p.get('ms/iter')) or 0:.0f} "
                   f"against {number(s.get('ms/iter')) or 0:.0f} ms per iteration.")
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
    return table(session.malloc, "")


def figures_section(session: Session, rows: list[dict]) -> list[str]:
    columns = ("model", "task", "batch", "pool total stock / pgmo (MiB)",
               "device in use stock / pgmo (MiB)", "NVML process peak stock / pgmo (MiB)",
               "lower bound (MiB)", "plan / bound", "ms/iter stock / pgmo", "time pgmo / stock")
    body = []
    for r in rows:
        s, p = r.get("stock", {}), r.get("pgmo", {})
        body.append((r["model"], r["task"], r["batch"],
                     f"{mib(s.get('pool_total'))} / {mib(p.get('pool_total'))}",
                     f"{mib(s.get('device'))} / {mib(p.get('device'))}",
                     f"{mib(s.get('nvml'), 0)} / {mib(p.get('nvml'), 0)}",
                     mib(p.get("bound")), mib(p.get("ratio"), 3),
                     f"{s.get('ms', '-')} / {p.get('ms', '-')}", r.get("time_ratio", "-")))
    return [
        "## Figures 2 and 3: memory and time per iteration", "",
        f"Source: `{results_name(session)}` (`scripts/bench_memory.py`), NVML column: "
        f"{nvml_source(session)}.", "", *md(columns, body), "",
        "How each column was measured:", "",
        "- *pool total*: the most bytes the pools held from `cudaMalloc` at an iteration's "
        "end, for pgmo once it answered from its plan (CuPy's default pool, which holds "
        "what was allocated before pgmo was installed, included).",
        "- *device in use*: total minus free device memory (`cudaMemGetInfo`) at the same "
        "moments: the CUDA context, cuBLAS and every pool included.",
        "- *NVML process peak*: the device memory the driver gave the process, sampled every "
        "10 ms through NVML over the whole process (warm-up, profiling and re-plans "
        "included); `-` where it was not measured.",
        "- *lower bound*: the most bytes live at once in pgmo's profiled iteration, sizes "
        "rounded to 512 B: no pool can serve that iteration in less.",
        "- *plan / bound*: the peak of pgmo's plan (`best`, 2 s) over the lower bound.",
        "- *ms/iter*: the median time per iteration after the first two (pgmo's warm-up "
        "and profiled ones), each configuration a fresh process; with several runs, the "
        "median of their medians and their range.",
        "- *time pgmo / stock*: the ratio of the two medians.", ""]


def results_name(session: Session) -> str:
    from evidence import find

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
        f"<!-- Generated by scripts/results_table.py from {session.folder.name}/; "
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
    out += copied_table(
        "Largest batch under a memory limit", f"`{results_name(session)}`",
        table(session.results, "Largest training batch"),
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
        table(session.results, "seq2seq"),
        ["- *pool total after* and *device in use after*: after the last batch; "
         "*re-optimizations*: re-plans after a departure; *fallback reqs*: requests served "
         "outside the plan; *departures*: iterations that left the plan."])
    probe = [r for r in probe_rows(session) if r.get("model") == "seq2seq"]
    if probe:
        out += copied_table(
            "seq2seq seen by NVML", "`nvml-process-peaks.md` (outside probe, 60 batches)",
            probe, ["- *peak device MiB over idle*: NVML every 10 ms over the whole process; "
                    "*rc* 124: the run was stopped at its time limit."])
    out += copied_table(
        "DenseNet-BC with recomputation", f"`{results_name(session)}`, its last section",
        table(session.results, "DenseNet-BC"),
        ["- One training iteration of DenseNet-BC-100 (k=12) at batch 64 recorded under "
         "CuPy's stock pool (`pgmo.TraceRecorder`); *lower bound* and the plans as "
         "`pgmo analyze` makes them; *stock pool reserved*: what that pool held."])
    out += densenet_traces(session)
    out += copied_table(
        "malloc+free against CuPy's pool", "`bench_malloc.txt` "
        f"(`{steps.get('malloc', {}).get('command', 'scripts/bench_malloc.py --gpu')}`)",
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
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="a GPU session's output folder ($OUT)")
    parser.add_argument("-o", "--output", type=Path, help="write here (default: stdout)")
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
    sys.exit(main())
