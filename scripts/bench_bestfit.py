#!/usr/bin/env python
"""Benchmark the paper's best-fit heuristic alone; print a Markdown table.

Usage::

    python scripts/bench_bestfit.py                       # random traces only
    python scripts/bench_bestfit.py tests/data/dsa-benchmarks/idealloc/iopddl/Y_1.csv
    python scripts/bench_bestfit.py --n 10000 --repeat 5 some/folder

Each row is one trace: n, lower bound (LB), the peak of
:func:`pgmo.solver.bestfit.bestfit_offsets`, peak/LB, and its wall time in
seconds (best of ``--repeat`` runs; reading the trace is not timed).

Random traces come from :func:`random_trace` with fixed seeds, so rows are
comparable between runs and machines:

* ``short``: lifetimes uniform in 1..50 ticks, starts uniform over a horizon
  of 2n ticks (many small, local problems: the common real-trace shape);
* ``long``: lower and upper both uniform over the whole horizon of 2n ticks
  (most blocks live long and overlap; the hard case for the fit query).

Sizes are uniform in 1..1024 in both.  Trace files and folders given as
arguments are found like ``scripts/bench_solver.py`` finds them (CSV files,
``solutions/`` skipped); files matching ``--inclusive`` (default
``*/iree/*``) have inclusive lifetimes.

The last line checks the speed targets: every row with 10,000 to 10,999
blocks within 1 s, and the ``Y_1`` trace (when given) within 15 s.
"""

from __future__ import annotations

import argparse
import fnmatch
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import pgmo  # noqa: E402
from bench_solver import find_instances  # noqa: E402
from pgmo.solver.bestfit import bestfit_offsets  # noqa: E402
from pgmo.trace import max_load  # noqa: E402

DISTRIBUTIONS = ("short", "long")
MAX_SHORT_LIFETIME = 50
MAX_SIZE = 1024
TARGET_10K_S = 1.0
TARGET_Y1_S = 15.0


def random_trace(n: int, dist: str, seed: int) -> tuple[list[int], list[int], list[int]]:
    """``(lowers, uppers, sizes)`` of ``n`` random blocks over a horizon of 2n ticks.

    ``short``: lifetime uniform in 1..50, lower uniform in [0, 2n - lifetime].
    ``long``: two distinct ticks uniform in [0, 2n]; the smaller is lower.
    Sizes are uniform in 1..1024.
    """
    rng = random.Random(seed)
    horizon = 2 * n
    lowers, uppers, sizes = [], [], []
    for _ in range(n):
        if dist == "short":
            life = rng.randint(1, MAX_SHORT_LIFETIME)
            lo = rng.randint(0, max(0, horizon - life))
            up = lo + life
        elif dist == "long":
            a, b = rng.randint(0, horizon), rng.randint(0, horizon)
            while a == b:
                b = rng.randint(0, horizon)
            lo, up = min(a, b), max(a, b)
        else:
            raise ValueError(f"unknown distribution {dist!r}")
        lowers.append(lo)
        uppers.append(up)
        sizes.append(rng.randint(1, MAX_SIZE))
    return lowers, uppers, sizes


def seed_for(n: int, dist: str) -> int:
    """Fixed seed per (n, distribution)."""
    return 1000 * n + DISTRIBUTIONS.index(dist)


def time_bestfit(cols, repeat: int) -> tuple[float, int]:
    """(best wall seconds over ``repeat`` runs, peak)."""
    best = float("inf")
    offsets = None
    for _ in range(repeat):
        start = time.perf_counter()
        offsets = bestfit_offsets(*cols)
        best = min(best, time.perf_counter() - start)
    peak = max(o + s for o, s in zip(offsets, cols[2]))
    return best, peak


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("inputs", nargs="*", help="trace CSV files or folders of them")
    ap.add_argument("--n", type=int, action="append",
                    help="random trace size (repeatable); default 1000, 10000, 30000")
    ap.add_argument("--dist", default=",".join(DISTRIBUTIONS),
                    help="comma-separated random lifetime distributions (short,long)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per trace; the best is shown")
    ap.add_argument("--inclusive", default="*/iree/*",
                    help="glob of files whose lifetimes are inclusive at both ends")
    args = ap.parse_args(argv)
    sizes = args.n or [1000, 10000, 30000]
    dists = [d.strip() for d in args.dist.split(",") if d.strip()]
    for d in dists:
        if d not in DISTRIBUTIONS:
            ap.error(f"unknown distribution {d!r}; choose from {', '.join(DISTRIBUTIONS)}")
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")

    print(f"bestfit wall time, best of {args.repeat}; Python {sys.version.split()[0]}")
    print()
    print("| trace | n | LB | peak | peak/LB | seconds |")
    print("|---|---|---|---|---|---|")
    rows = []  # (name, n, seconds)

    def report(name, cols):
        lb = max_load(*cols)
        seconds, peak = time_bestfit(cols, args.repeat)
        rows.append((name, len(cols[2]), seconds))
        print(f"| {name} | {len(cols[2])} | {lb} | {peak} | {peak / lb:.4f} | {seconds:.3f} |",
              flush=True)

    for n in sizes:
        for dist in dists:
            seed = seed_for(n, dist)
            report(f"random-{dist} (seed {seed})", random_trace(n, dist, seed))
    for path in find_instances(args.inputs) if args.inputs else []:
        inclusive = fnmatch.fnmatch(path.as_posix(), args.inclusive)
        trace = pgmo.read_trace(path, inclusive=inclusive)
        name = path.parent.name + "/" + path.stem + (" (incl.)" if inclusive else "")
        report(name, trace.columns())

    print()
    ten_k = [(name, s) for name, n, s in rows if 10_000 <= n < 11_000]
    y1 = [(name, s) for name, n, s in rows if name.split("/")[-1] == "Y_1"]
    parts = []
    if ten_k:
        slow = [name for name, s in ten_k if s > TARGET_10K_S]
        parts.append(f"10k-block rows <= {TARGET_10K_S:g} s: "
                     + ("yes" if not slow else "NO (" + ", ".join(slow) + ")")
                     + f" (max {max(s for _, s in ten_k):.3f} s over {len(ten_k)} rows)")
    else:
        parts.append("10k-block rows: none")
    if y1:
        worst = max(s for _, s in y1)
        parts.append(f"Y_1 <= {TARGET_Y1_S:g} s: " + ("yes" if worst <= TARGET_Y1_S else "NO")
                     + f" ({worst:.3f} s)")
    else:
        parts.append("Y_1: not given")
    print("Targets: " + "; ".join(parts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
