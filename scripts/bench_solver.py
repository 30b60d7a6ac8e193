"""Benchmark pgmo's packing methods on DSA instances; print Markdown tables.

Usage::

    python -m scripts.bench_solver tests/data/dsa-benchmarks --bundled -o table.md   # 1 s and 10 s
    python -m scripts.bench_solver tests/data/dsa-benchmarks --time-limit 10         # one limit
    python -m scripts.bench_solver --bestfit-timing                    # best-fit alone, timed
    python -m scripts.bench_solver --bestfit-timing --n 10000 --repeat 5 some/folder

The public instances are kept in the repository, in ``tests/data/dsa-benchmarks``
(``PROVENANCE.md`` there says where each comes from); they are the default
when nothing else is asked for.

For every instance CSV found (``solutions/`` folders are skipped), with
``--bundled`` for pgmo's bundled traces and with ``--random N`` for two
random traces of N blocks (``long`` and ``short`` lifetimes,
:mod:`scripts.dsa_instances`), it solves with each method through
:func:`pgmo.solve` and prints one table
per folder: n, lower bound (LB), best known peak, then per method (and per
time limit, side by side: ``--time-limit`` takes several, by default 1 s and
the default 10 s; ``bestfit`` ignores limits and runs once) the peak,
the seconds, the overrun past the time limit (seconds; negative: it returned
early; ``LATE`` past the promise, limit x 1.05 + 0.1 s), the ratios peak/LB
and peak/best-known, and the 1-minute load average when it ended.  Summary
lines give the mean ratios per method for each folder and over all
instances, then the targets: mean and max peak/best-known on the MiniMalloc
"challenging" suite, max peak/LB on the real traces (and whether each trace
with a known packing at LB is packed at LB), and each method's worst
overrun and late instances.  ``--busy-core`` keeps one core busy with
another process for the whole run (the machine as a user shares it).

Best known peaks come from ``--best-known`` CSVs (``instance,peak``; the
instance is matched against the end of the file path without ``.csv``; the
bundled ``scripts/best_known_peaks.csv`` is always read) and from
MiniMalloc-style ``solutions/NAME.peakN.csv`` files next to the instances;
the lowest of them counts.
Files matching ``--inclusive`` (default ``*/iree/*``) have inclusive
lifetimes.  ``exact`` only runs on instances with at most ``--exact-max-n``
blocks, and a missing or failing exact solver is reported, not fatal.

``--bestfit-timing`` times the paper's best-fit heuristic alone instead
(:mod:`scripts.bestfit_timing`): random traces of ``--n`` blocks (default
1000, 10000 and 30000) with ``--dist`` lifetimes, then the trace files
given, best of ``--repeat`` runs each, and its speed targets.
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

import pgmo
from pgmo import programs
from pgmo.solver.options import argument_type

from . import bestfit_timing
from .children import busy_core
from .dsa_instances import (BUNDLED_BEST_KNOWN, DISTRIBUTIONS, PUBLIC_INSTANCES, best_known_for,
                            find_instances, random_traces, read_best_known)

#: The time limit's promise: every method returns within limit x LATE_FACTOR + LATE_SLACK s.
LATE_FACTOR, LATE_SLACK = 1.05, 0.1
CHALLENGING_MEAN, CHALLENGING_MAX, REAL_MAX = 1.005, 1.02, 1.002


def load_average() -> str:
    return "{:.2f}".format(os.getloadavg()[0]) if hasattr(os, "getloadavg") else "-"


def run_method(trace, method: str, time_limit: float, exact_max_n: int, budget=None):
    """(peak, seconds, note) for one method; never raises."""
    if method == "exact" and len(trace) > exact_max_n:
        return None, None, f"skipped: n > {exact_max_n}"
    start = time.perf_counter()
    try:
        plan = pgmo.solve(trace, method=method, time_limit=time_limit, budget=budget)
    except (ImportError, NotImplementedError) as exc:
        return None, None, f"unavailable: {exc}"
    except Exception as exc:  # a failing method must not stop the benchmark
        return None, time.perf_counter() - start, f"error: {type(exc).__name__}: {exc}"
    note = "optimal" if plan.optimal else ""
    return plan.peak, time.perf_counter() - start, note


#: One time limit, checked as ``pgmo solve --time-limit`` checks it.
_seconds = argument_type("time_limit")


def _limits(text: str) -> list[float | None]:
    """``--time-limit``: seconds, or several separated by commas (each gets its columns)."""
    limits = [_seconds(part) for part in text.split(",") if part.strip()]
    if not limits or (None in limits and len(limits) > 1):
        raise argparse.ArgumentTypeError(f"expects seconds, 'none', or several seconds "
                                         f"separated by commas, got {text!r}")
    return sorted(limits, key=lambda x: -1.0 if x is None else x)


def columns_for(methods: list[str], limits: list[float | None]) -> list[tuple[str, str, float | None]]:
    """(label, method, time limit) per group of columns: each method at each limit, but
    ``bestfit`` once (it ignores the limit; its overrun is against the first)."""
    if len(limits) == 1:
        return [(m, m, limits[0]) for m in methods]
    return [(m, m, limits[0]) if m == "bestfit" else (f"{m} {lim:g}s", m, lim)
            for m in methods for lim in (limits[:1] if m == "bestfit" else limits)]


def fmt_ratio(peak, ref):
    return f"{peak / ref:.4f}" if peak is not None and ref else "-"


def parse_args(argv=None) -> argparse.Namespace:
    ap = programs.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("inputs", nargs="*", type=programs.existing_path(), help="instance CSV files or folders of them "
                    "(default, without --bundled or --random: the public instances in "
                    "tests/data/dsa-benchmarks; with --bestfit-timing: none)")
    ap.add_argument("--methods", default="bestfit,best",
                    help="comma-separated methods (bestfit,best,exact); default bestfit,best")
    ap.add_argument("--time-limit", type=_limits, default=[1.0, pgmo.SolverOptions().time_limit],
                    help="seconds per instance for best/exact, or several separated by "
                         "commas, each in columns of its own side by side ('none': no limit; "
                         "best then needs --budget; default: 1 and the default limit, "
                         f"{pgmo.SolverOptions().time_limit:g})")
    ap.add_argument("--best-known", action="append", default=[],
                    type=programs.existing_path("file"),
                    help="CSV 'instance,peak' of best known peaks (repeatable)")
    ap.add_argument("--inclusive", default="*/iree/*",
                    help="glob of files whose lifetimes are inclusive at both ends")
    ap.add_argument("--exact-max-n", type=programs.integer(0), default=60, help="run exact only up to this many blocks")
    ap.add_argument("--budget", type=argument_type("budget"), default=None,
                    help="search steps for 'best' (default: none, only the time limit)")
    ap.add_argument("--bundled", action="store_true", help="also solve pgmo's bundled traces")
    ap.add_argument("--random", type=programs.integer(1), action="append", default=[],
                    metavar="N",
                    help="also solve two random traces of N blocks (repeatable)")
    ap.add_argument("--busy-core", action="store_true",
                    help="keep one core busy with another process during the run")
    ap.add_argument("-o", "--output", type=programs.output_file,
                    help="also write the tables to this Markdown file")
    timing = ap.add_argument_group(
        "best-fit timing", "--bestfit-timing: time the paper's best-fit heuristic alone on "
        "random traces and the trace files given (the options above but --inclusive do not "
        "apply)")
    timing.add_argument("--bestfit-timing", action="store_true",
                        help="print best-fit's times and its speed targets instead")
    timing.add_argument("--n", type=programs.integer(1), action="append",
                        help="random trace size (repeatable); default 1000, 10000, 30000")
    timing.add_argument("--dist", default=None,
                        help="comma-separated random lifetime distributions (default "
                             f"{','.join(DISTRIBUTIONS)})")
    timing.add_argument("--repeat", type=programs.integer(1), default=None,
                        help="runs per trace; the best is shown (default 3)")
    args = ap.parse_args(argv)
    if not args.bestfit_timing:
        given = [f"--{name}" for name in ("n", "dist", "repeat")
                 if getattr(args, name) is not None]
        if given:
            ap.error(f"{', '.join(given)}: only with --bestfit-timing")
        args.methods = [m.strip() for m in args.methods.split(",") if m.strip()]
        for m in args.methods:
            if m not in pgmo.METHODS:
                ap.error(f"unknown method {m!r}; choose from {', '.join(pgmo.METHODS)}")
        return args
    args.dist = [d.strip() for d in (args.dist or ",".join(DISTRIBUTIONS)).split(",")
                 if d.strip()]
    for d in args.dist:
        if d not in DISTRIBUTIONS:
            ap.error(f"unknown distribution {d!r}; choose from {', '.join(DISTRIBUTIONS)}")
    args.repeat = 3 if args.repeat is None else args.repeat
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.bestfit_timing:
        return bestfit_timing.run(args.inputs, args.n or bestfit_timing.DEFAULT_SIZES,
                                  args.dist, args.repeat, args.inclusive)
    methods = args.methods
    known_files = ([BUNDLED_BEST_KNOWN] if BUNDLED_BEST_KNOWN.exists() else []) + args.best_known
    known = read_best_known(known_files)
    inputs = args.inputs or ([] if args.bundled or args.random
                             else [os.path.relpath(PUBLIC_INSTANCES)])
    instances = [(p, p.parent.as_posix()) for p in find_instances(inputs)]
    if args.bundled:
        instances += [(name, "pgmo bundled traces") for name in pgmo.bundled.names()]
    for n in args.random:
        instances += [(item, "random traces") for item in random_traces(n)]
    if not instances:
        raise SystemExit("bench_solver: no instance CSV files found")
    with busy_core(args.busy_core):
        return _bench(args, methods, known, instances, args.busy_core)


def _bench(args, methods, known, instances, busy: bool) -> int:

    lines: list[str] = []

    def summary_line(by_lb, by_best):
        parts = []
        for m in labels:
            part = [f"**{m}**"]
            if by_lb[m]:
                part.append(f"peak/LB {sum(by_lb[m]) / len(by_lb[m]):.4f} (n={len(by_lb[m])})")
            if by_best[m]:
                part.append(f"peak/best-known {sum(by_best[m]) / len(by_best[m]):.4f} "
                            f"(n={len(by_best[m])})")
            if len(part) == 1:
                part.append("no results")
            parts.append(" ".join(part))
        return "; ".join(parts)

    def emit(line=""):
        print(line, flush=True)
        lines.append(line)

    emit(f"Load average at the start: {load_average()}; another process keeps one core "
         f"busy: {'yes' if busy else 'no'}; {os.cpu_count()} cores")
    columns = columns_for(methods, args.time_limit)
    labels = [label for label, _, _ in columns]
    header = ["instance", "n", "LB", "best known"]
    for label in labels:
        header += [f"{label} peak", f"{label} s", f"{label} over", f"{label} /LB",
                   f"{label} /best"]
    header.append("load")
    ratios_lb: dict[str, list[float]] = defaultdict(list)
    ratios_best: dict[str, list[float]] = defaultdict(list)
    folder_lb: dict[str, list[float]] = defaultdict(list)
    folder_best: dict[str, list[float]] = defaultdict(list)
    notes: list[str] = []
    current_folder = None
    overruns: dict[str, list[tuple[float, str]]] = defaultdict(list)
    late: dict[str, list[str]] = defaultdict(list)
    challenging: dict[str, list[float]] = defaultdict(list)
    real_lb: dict[str, list[float]] = defaultdict(list)
    at_known_lb: dict[str, list[bool]] = defaultdict(list)
    at_best: dict[str, list[bool]] = defaultdict(list)
    limit_of = {label: limit for label, _, limit in columns}

    def folder_summary():
        if current_folder is not None:
            emit()
            emit("Folder means: " + summary_line(folder_lb, folder_best))
            folder_lb.clear()
            folder_best.clear()

    for path, folder in instances:
        if folder != current_folder:
            folder_summary()
            current_folder = folder
            emit()
            emit(f"### {folder}")
            emit()
            emit("| " + " | ".join(header) + " |")
            emit("|" + "---|" * len(header))
        if isinstance(path, tuple):  # a generated trace
            (name, trace), inclusive, best = path, False, None
        elif isinstance(path, str):  # a bundled trace
            trace, name, inclusive, best = pgmo.bundled.load(path), path, False, None
        else:
            inclusive = fnmatch.fnmatch(path.as_posix(), args.inclusive)
            trace, name = pgmo.read_trace(path, inclusive=inclusive), path.stem
            best = best_known_for(path, known)
        lb = trace.lower_bound()
        row = [name + (" (incl.)" if inclusive else ""), str(len(trace)), str(lb),
               str(best) if best is not None else "-"]
        for label, m, limit in columns:
            peak, seconds, note = run_method(trace, m, limit, args.exact_max_n,
                                             args.budget if m == "best" else None)
            if note and note != "optimal":
                notes.append(f"{name} {label}: {note}")
            m = label
            over = "-"
            if seconds is not None and limit:
                past = seconds - limit
                overruns[m].append((past, name))
                over = f"{past:+.2f}"
                if seconds > limit * LATE_FACTOR + LATE_SLACK:
                    late[m].append(name)
                    over += " LATE"
            if peak is None:
                row += ["-", f"{seconds:.2f}" if seconds is not None else "-", over, "-", "-"]
                continue
            ratios_lb[m].append(peak / lb)
            folder_lb[m].append(peak / lb)
            if best:
                ratios_best[m].append(peak / best)
                folder_best[m].append(peak / best)
            if "challenging" in folder and best:
                challenging[m].append(peak / best)
            if "idealloc" in folder:
                real_lb[m].append(peak / lb)
                if best == lb:
                    at_known_lb[m].append(peak == lb)
                if best:
                    at_best[m].append(peak <= best)
            row += [str(peak), f"{seconds:.2f}", over, fmt_ratio(peak, lb), fmt_ratio(peak, best)]
        row.append(load_average())
        emit("| " + " | ".join(row) + " |")

    folder_summary()
    emit()
    emit("Summary (all instances): " + summary_line(ratios_lb, ratios_best))
    emit()
    emit("Targets:")
    emit()
    for m in labels:
        if challenging[m]:
            r = challenging[m]
            emit(f"- **{m}** MiniMalloc challenging: mean peak/best-known {sum(r) / len(r):.4f} "
                 f"(target <= {CHALLENGING_MEAN}), max {max(r):.4f} (target <= "
                 f"{CHALLENGING_MAX}), n={len(r)}")
        if real_lb[m]:
            hit = at_known_lb[m]
            emit(f"- **{m}** real traces: max peak/LB {max(real_lb[m]):.4f} (target <= "
                 f"{REAL_MAX}); at LB where a packing at LB is known: {sum(hit)}/{len(hit)}; "
                 f"at the best known packing: {sum(at_best[m])}/{len(at_best[m])}")
        if overruns[m]:
            worst, where = max(overruns[m])
            limit = limit_of[m]
            assert limit is not None  # overruns are kept against a limit only
            allowed = limit * LATE_FACTOR + LATE_SLACK
            emit(f"- **{m}** worst overrun past the {limit:g} s limit: {worst:+.2f} s "
                 f"({where}); returned after {allowed:g} s (limit x {LATE_FACTOR} + "
                 f"{LATE_SLACK} s): {len(late[m])} of {len(overruns[m])}"
                 + (f" ({', '.join(late[m])})" if late[m] else ""))
    for note in notes:
        emit(f"- {note}")
    emit()
    emit(f"Load average at the end: {load_average()}")
    if args.output:
        args.output.write_text("\n".join(lines).lstrip("\n") + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(programs.run(main))
