"""Import and analyze a generated 100,000-event PyTorch snapshot; print a Markdown table.

Usage::

    python -m scripts.bench_import                 # 100,000 events, best within 10 s
    python -m scripts.bench_import --events 300000 --time-limit 5

The snapshot is *synthetic* (:mod:`pgmo.synth_logs`): a bundled trace
repeated for as many iterations as needed, addresses from a model of
PyTorch's caching allocator, a 16-frame stack on every event (shared
tracebacks, as PyTorch shares them), 256 MiB of weights allocated before
recording, and only the last ``--events`` entries kept, as
``torch.cuda.memory._record_memory_history(max_entries=...)`` keeps them
(so the first blocks are freed with no alloc).  An RMM log of the same run is
timed too, for comparison.

Timed steps (wall seconds, best of ``--repeat``): reading the file (unpickle
and convert to a trace), the lower bound at pgmo's 512 B granularity, the
paper's best-fit plan.  The goal: their sum under 5 s.  ``pgmo analyze``
end to end (which adds ``best`` within ``--time-limit``) is timed once, apart.
"""

from __future__ import annotations

import pickle
import sys
import tempfile
import time
from pathlib import Path

from pgmo import programs

programs.start(__name__)  # Ctrl-C from here on: one line, exit status 130

import pgmo  # noqa: E402
from pgmo import bundled  # noqa: E402
from pgmo.measure.analysis import at_granularity  # noqa: E402
from pgmo.synth_logs import pytorch_snapshot, rmm_logs  # noqa: E402
from pgmo.units import ALIGNMENT  # noqa: E402

GOAL_S = 5.0
WEIGHTS = 256 << 20


def best_of(repeat: int, fn):
    """(seconds of the fastest run, its result)."""
    best, result = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def main(argv=None) -> int:
    parser = programs.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=100_000,
                        help="events in the generated snapshot")
    parser.add_argument("--trace", default="synthetic-resnet50-train-b32", metavar="NAME",
                        help="the bundled trace repeated in the snapshot")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each step; the best counts")
    parser.add_argument("--frames", type=int, default=16,
                        help="stack frames per event, from 64 shared tracebacks (default: 16)")
    parser.add_argument("--time-limit", type=programs.non_negative_float, default=None,
                        help="for 'best' in the end-to-end run (default: pgmo's)")
    args = parser.parse_args(argv)
    for name in ("events", "repeat", "frames"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    if args.trace not in bundled.names():
        parser.error(str(programs.unknown_name("bundled trace", args.trace, bundled.names(),
                                               "`pgmo traces`")))

    trace = bundled.load(args.trace)
    per_iteration = 3 * len(trace)  # alloc, free_requested, free_completed
    iterations = -(-args.events // per_iteration) + 1
    snap = pytorch_snapshot(trace, iterations, before=[WEIGHTS], max_entries=args.events,
                            frames=args.frames)
    events = len(snap["device_traces"][0])
    requests_log, _ = rmm_logs(trace, -(-args.events // (2 * len(trace))))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "snapshot.pickle"
        path.write_bytes(pickle.dumps(snap, protocol=4))
        rmm_path = Path(tmp) / "rmm.csv"
        rmm_path.write_text(requests_log)
        mib = path.stat().st_size / 2**20

        t_read, imported = best_of(args.repeat, lambda: pgmo.read_trace(path))
        t_lb, lb = best_of(args.repeat,
                           lambda: at_granularity(imported, ALIGNMENT).lower_bound())
        rounded = at_granularity(imported, ALIGNMENT)
        t_fit, plan = best_of(args.repeat, lambda: pgmo.solve(rounded, method="bestfit"))
        t_rmm, rmm_trace = best_of(args.repeat, lambda: pgmo.read_trace(rmm_path))
        start = time.perf_counter()
        changes = {} if args.time_limit is None else {"time_limit": args.time_limit}
        result = pgmo.analyze(path, **changes)
        t_all = time.perf_counter() - start

    total = t_read + t_lb + t_fit
    rep = imported.metadata["import"]
    print(f"synthetic PyTorch snapshot: {events:,} events ({mib:.1f} MiB pickle), "
          f"{len(imported):,} requests ({rep['before_freed']['count']} freed before their "
          f"alloc was recorded, {rep['before_live']['count']} live from before); "
          f"Python {sys.version.split()[0]}, best of {args.repeat}\n")
    print("| step | seconds | result |")
    print("|---|---:|---|")
    print(f"| read snapshot (unpickle + convert) | {t_read:.3f} | {len(imported):,} blocks |")
    print(f"| lower bound (512 B granularity) | {t_lb:.3f} | {lb:,} B |")
    print(f"| bestfit plan | {t_fit:.3f} | peak {plan.peak:,} B = {plan.ratio:.4f} x LB |")
    print(f"| **import + lower bound + bestfit** | **{total:.3f}** | goal < {GOAL_S:g} s: "
          f"{'met' if total < GOAL_S else 'MISSED'} |")
    print(f"| read RMM log ({rmm_trace.metadata['import']['events']:,} events) | {t_rmm:.3f} | "
          f"{len(rmm_trace):,} blocks |")
    best = result.plans.get("best", {})
    print(f"| `pgmo analyze` end to end (once) | {t_all:.3f} | best peak "
          f"{best.get('peak', 0):,} B, reserved {result.reserved:,} B, saving "
          f"{result.saving(best.get('peak'))[1]:.1f} % |")
    return 0 if total < GOAL_S else 1


if __name__ == "__main__":
    sys.exit(programs.run(main))
