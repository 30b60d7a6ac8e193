"""The paper's best-fit heuristic alone, timed: ``python -m scripts.bench_solver --bestfit-timing``.

Each row is one trace: n, lower bound (LB), the peak of
:func:`pgmo.solver.bestfit.bestfit_offsets`, peak/LB, and its wall time in
seconds (best of ``--repeat`` runs; reading the trace is not timed).

Random traces come from :func:`scripts.dsa_instances.random_trace` with fixed
seeds (:func:`seed_for`), so rows are comparable between runs and machines:

* ``short``: lifetimes uniform in 1..50 ticks, starts uniform over a horizon
  of 2n ticks (many small, local problems: the common real-trace shape);
* ``long``: lower and upper both uniform over the whole horizon of 2n ticks
  (most blocks live long and overlap; the hard case for the fit query).

Sizes are uniform in 1..1024 in both.  Trace files and folders given as
arguments are found as ``bench_solver`` finds them (CSV files, ``solutions/``
skipped); files matching ``--inclusive`` (default ``*/iree/*``) have
inclusive lifetimes.

The last line checks the speed targets: every row with 10,000 to 10,999
blocks within 1 s, and the ``Y_1`` trace (when given) within 15 s.
"""

from __future__ import annotations

import fnmatch
import sys
import time

import pgmo
from pgmo.solver.bestfit import bestfit_offsets
from pgmo.trace import max_load

from .dsa_instances import DISTRIBUTIONS, find_instances, random_trace

#: Random trace sizes when none is asked for.
DEFAULT_SIZES = (1000, 10000, 30000)
TARGET_10K_S = 1.0
TARGET_Y1_S = 15.0


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


def run(inputs: list[str], sizes, dists: list[str], repeat: int, inclusive_glob: str) -> int:
    """Print the table of best-fit's times and the targets' verdict."""
    files = []  # read first: a file that is no trace stops the run before any timing
    for path in find_instances(inputs) if inputs else []:
        inclusive = fnmatch.fnmatch(path.as_posix(), inclusive_glob)
        trace = pgmo.read_trace(path, inclusive=inclusive)
        files.append((path.parent.name + "/" + path.stem + (" (incl.)" if inclusive else ""),
                      trace.columns()))
    print(f"bestfit wall time, best of {repeat}; Python {sys.version.split()[0]}")
    print()
    print("| trace | n | LB | peak | peak/LB | seconds |")
    print("|---|---|---|---|---|---|")
    rows = []  # (name, n, seconds)

    def report(name, cols):
        lb = max_load(*cols)
        seconds, peak = time_bestfit(cols, repeat)
        rows.append((name, len(cols[2]), seconds))
        print(f"| {name} | {len(cols[2])} | {lb} | {peak} | {peak / lb:.4f} | {seconds:.3f} |",
              flush=True)

    for n in sizes:
        for dist in dists:
            seed = seed_for(n, dist)
            report(f"random-{dist} (seed {seed})", random_trace(n, dist, seed))
    for name, cols in files:
        report(name, cols)

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
