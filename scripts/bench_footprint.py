#!/usr/bin/env python
"""Device memory held over whole runs: pgmo against CuPy's stock pool and the physical limit.

Each workload is a whole run (:mod:`pgmo.runs`): weights, gradients and
optimizer state created in the first iteration and kept, then the same
recorded iteration again and again (the real H100 traces of 2026-11-25), or
a recorded whole run (``--runs``: ResNet-50 and variable-length seq2seq,
recorded on the CPU).  Each is replayed on a host stand-in for the device
(every byte counted, every block checked) through pgmo's pool and through
the stand-in for CuPy's stock pool (calibrated on the H100 traces).  One
table per workload:

* peak bytes held with no limit, against the physical limit (the most bytes
  the run has live at once, sizes rounded to 512 B as both pools round) and
  against CuPy's pool; and the moments at which pgmo held more than CuPy's
  pool held at the same point of the run;
* the smallest device on which the run completes, every block checked;
* the largest activation scale (batch, relative) that completes within the
  memory CuPy's pool needed for the run, against the physical largest.

Then a summary against the footprint targets.  No GPU is needed; these are
figures of the CPU model, not GPU measurements.

    python scripts/bench_footprint.py [--traces DIR] [--runs DIR] [--only NAME ...]
        [--iterations N] [--replan background|sync] [--time-limit S] [--step-ms MS]
        [--no-limits] [-o report.md]
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

import pgmo
from pgmo import bundled, footprint
from pgmo.runs import Run, read_run, run_from_iteration

ROOT = Path(__file__).resolve().parent.parent
RECORDED_RUNS = ROOT / "pgmo" / "traces" / "runs"
MIB = 2 ** 20

#: Targets of the footprint work (see README, "Footprint").
REPEATING_MAX = 1.05  # peak held / physical limit, repeating runs
VARYING_MAX_LIMIT = 1.3  # peak held / physical limit, variable-length runs
VARYING_MAX_STOCK = 0.6  # peak held / CuPy's, variable-length runs
SCALE_WITHIN = 0.05  # largest batch within 5 % of the physical largest


def _model_weights(arch: str) -> list[int]:
    """A model's parameter sizes, from examples/models after one training step's heads
    (Chainer's lazy layers make their weights in the first forward pass)."""
    sys.path.insert(0, str(ROOT / "examples"))
    import numpy as np

    import pgmo.chainer  # noqa: F401,I001  (the compatibility layer first)
    from models import ARCHS

    model = ARCHS[arch](n_classes=1000)
    model.heads(np.zeros((1, 3, model.insize, model.insize), np.float32))
    return [p.array.nbytes for p in model.params()]


def trace_runs(folder: Path | None, iterations: int) -> list[tuple[str, Run, str]]:
    """(name, run, how) for each real trace (the bundled ones recorded on the H100, or those
    in ``folder``): weights and state from its own gradients."""
    if folder is None:
        traces = {name: bundled.load(name) for name in bundled.names()
                  if bundled.is_real(bundled.load(name).metadata)}
    else:
        traces = {p.name.split(".json")[0]: pgmo.read_trace(p)
                  for p in sorted(folder.glob("*.json.gz"))}
    out = []
    for name, trace in traces.items():
        meta = trace.metadata
        training = meta.get("kind") == "training"
        grads = [b.size for b in trace.blocks if b.upper is None]
        if training:
            weights, state = grads, grads  # MomentumSGD: one velocity per parameter
            how = "weights + momentum = its gradients' sizes"
        else:
            donor = next((t for n, t in traces.items()
                          if t.metadata.get("model") == meta.get("model")
                          and t.metadata.get("kind") == "training"), None)
            if donor is not None:
                weights = [b.size for b in donor.blocks if b.upper is None]
                how = "weights from the same model's training trace"
            else:
                try:
                    weights = _model_weights(str(meta.get("model")))
                    how = "weights from examples/models"
                except Exception as e:  # Chainer missing: say so, run without weights
                    weights, how = [], f"no weights ({type(e).__name__})"
            state = []
        run = run_from_iteration(trace, iterations, setup=weights, state=state,
                                 recorded=str(meta.get("device", "?")))
        out.append((name, run, how))
    return out


def recorded_runs(folder: Path) -> list[tuple[str, Run, str]]:
    return [(p.name.split(".run")[0], read_run(p), "recorded whole run")
            for p in sorted(folder.glob("*.run.json.gz"))]


def varying(run: Run) -> bool:
    """Whether the run's iterations after the first differ (variable-length batches)."""
    where = run.iteration_of()
    shapes: dict[int, list[int]] = {}
    for i, b in enumerate(run.trace.blocks):
        if where[i] > 0:
            shapes.setdefault(where[i], []).append(b.size)
    return len({tuple(v) for v in shapes.values()}) > 1


def mib(n: int | None) -> str:
    return "-" if n is None else f"{n / MIB:,.1f}"


def bench(name: str, run: Run, how: str, args) -> dict:
    limit = run.lower_bound_rounded()
    make = footprint.pgmo_pool(replan=args.replan, time_limit=args.time_limit, seed=0)
    step = args.step_ms / 1000
    stock = footprint.measure(run, footprint.stock_pool())
    pool = make(None)
    mine = footprint.measure(run, pool, step_seconds=step)
    stats = mine.stats
    pool.close()
    del pool
    gc.collect()
    moments, excess = footprint.moments_above(mine.held, stock.held)
    row = {"name": name, "how": how, "requests": len(run), "iterations": len(run.iterations),
           "limit": limit, "long_lived": run.long_lived_bytes(),
           "stock": stock.peak, "pgmo": mine.peak, "moments": moments, "excess": excess,
           "ok": mine.completed and stock.completed, "varying": varying(run),
           "replans": stats.reoptimizations if stats else 0,
           "mode": stats.mode if stats else "-", "seconds": mine.seconds,
           "candidates": footprint.profiling_candidates(run)}
    if not args.no_limits:
        high = int(stock.peak * 1.2) + MIB
        row["cap_pgmo"] = footprint.smallest_capacity(run, make, limit, high, step_seconds=step)
        row["cap_stock"] = footprint.smallest_capacity(
            run, footprint.stock_pool, limit, high)
        row["scale_pgmo"] = footprint.largest_scale(run, make, stock.peak, step_seconds=step)
        row["scale_physical"] = footprint.physical_scale(run, stock.peak)
    return row


def table(row: dict, args) -> str:
    limit, stock = row["limit"], row["stock"]
    lines = [f"### {row['name']}", "",
             f"{row['requests']:,} requests, {row['iterations']} iterations"
             f"{' (variable)' if row['varying'] else ''}; {row['how']}; physical limit "
             f"{mib(limit)} MiB (long-lived {mib(row['long_lived'])} MiB); pgmo ended "
             f"{row['mode']}, {row['replans']} re-plans, replay {row['seconds']:.1f} s", "",
             "| | CuPy's pool (model) | pgmo | physical limit |", "|---|---:|---:|---:|",
             f"| peak held, no limit (MiB) | {mib(stock)} | {mib(row['pgmo'])} | {mib(limit)} |",
             f"| / physical limit | {stock / limit:.3f} | {row['pgmo'] / limit:.3f} | 1.000 |",
             f"| / CuPy's pool | 1.000 | {row['pgmo'] / stock:.3f} | {limit / stock:.3f} |",
             f"| moments above CuPy's pool (largest excess, MiB) | - | {row['moments']:,} "
             f"({mib(row['excess'])}) | - |"]
    if "cap_pgmo" in row:
        cp, cs = row["cap_pgmo"], row["cap_stock"]
        lines += [
            f"| smallest device that completes (MiB) | {mib(cs)} | {mib(cp)} | {mib(limit)} |",
            f"| ... / physical limit | {'-' if cs is None else f'{cs / limit:.3f}'} | "
            f"{'-' if cp is None else f'{cp / limit:.3f}'} | 1.000 |",
            f"| largest activation scale within CuPy's peak | 1.000 | "
            f"{row['scale_pgmo']:.3f} | {row['scale_physical']:.3f} |"]
    return "\n".join(lines)


def verdicts(rows: list[dict]) -> list[str]:
    out = []
    for r in rows:
        ratio, vs = r["pgmo"] / r["limit"], r["pgmo"] / r["stock"]
        if r["varying"]:
            ok = ratio <= VARYING_MAX_LIMIT and vs <= VARYING_MAX_STOCK
            goal = f"<= {VARYING_MAX_LIMIT} x limit and <= {VARYING_MAX_STOCK} x CuPy"
        else:
            ok = ratio <= REPEATING_MAX and r["moments"] == 0
            goal = f"<= {REPEATING_MAX} x limit, never above CuPy"
        line = (f"- {r['name']}: peak {ratio:.3f} x limit, {vs:.3f} x CuPy, "
                f"{r['moments']} moments above CuPy (goal {goal}): "
                f"{'met' if ok and r['ok'] else 'NOT met'}")
        if r["varying"] and r["limit"] > VARYING_MAX_STOCK * r["stock"]:
            line += (f" (no pool can: the physical limit is {r['limit'] / r['stock']:.3f} x "
                     f"CuPy's peak)")
        if "scale_pgmo" in r and r["scale_physical"]:
            within = r["scale_pgmo"] / r["scale_physical"]
            line += (f"; largest scale {within:.3f} of the physical largest "
                     f"({'met' if within >= 1 - SCALE_WITHIN else 'NOT met'})")
        out.append(line)
    return out


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--traces", type=Path, default=None,
                        help="folder of single-iteration traces made into runs (default: the "
                             "bundled traces recorded on the H100)")
    parser.add_argument("--runs", type=Path, default=RECORDED_RUNS,
                        help="folder of recorded whole runs (*.run.json.gz)")
    parser.add_argument("--only", nargs="+", default=(), help="workloads whose name has these")
    parser.add_argument("--iterations", type=int, default=10,
                        help="iterations of runs made from one trace")
    parser.add_argument("--replan", choices=("background", "sync", "bestfit"),
                        default="background", help="pgmo's re-planning (default: its own)")
    parser.add_argument("--time-limit", type=float, default=2.0,
                        help="pgmo's solver time limit, s (as in the H100 bench_memory run)")
    parser.add_argument("--step-ms", type=float, default=20.0,
                        help="time each iteration computes besides allocating, ms")
    parser.add_argument("--no-limits", action="store_true",
                        help="skip the smallest-device and largest-batch searches")
    parser.add_argument("-o", "--output", type=Path, help="also write the report here")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    workloads = []
    workloads += trace_runs(args.traces, args.iterations)
    if args.runs.is_dir():
        workloads += recorded_runs(args.runs)
    if args.only:
        workloads = [w for w in workloads if any(o in w[0] for o in args.only)]
    if not workloads:
        print("no workloads found (see --traces and --runs)", file=sys.stderr)
        return 2
    started = time.perf_counter()
    rows, parts = [], []
    for name, run, how in workloads:
        row = bench(name, run, how, args)
        rows.append(row)
        parts.append(table(row, args))
        print(parts[-1] + "\n", flush=True)
    command = "python scripts/bench_footprint.py " + " ".join(sys.argv[1:] if argv is None
                                                               else argv)
    names = list(rows[0]["candidates"])
    candidates = ["## Serving the warm-up and profiled iterations: peak held by each candidate", "",
                  "The first two iterations of each run (the warm-up and the profiled one), "
                  "served by each allocator pgmo could profile with (see "
                  "`pgmo.footprint.profiling_candidates`; MiB):", "",
                  "| workload | " + " | ".join(names) + " |",
                  "|---|" + "---:|" * len(names)]
    candidates += [f"| {r['name']} | " + " | ".join(mib(r["candidates"][n]) for n in names)
                   + " |" for r in rows]
    report = ["# Device footprint over whole runs (CPU model)", "",
              f"- command: `{command.strip()}`",
              f"- pgmo: replan={args.replan}, method best, time limit {args.time_limit} s, "
              f"{args.step_ms:g} ms of compute per iteration; "
              f"{time.perf_counter() - started:.0f} s in all",
              "- devices are host stand-ins (pgmo.host_device): figures of the CPU model, "
              "not GPU measurements", "", *parts, "", *candidates, "",
              "## Against the targets", "", *verdicts(rows)]
    text = "\n".join(report) + "\n"
    print("\n".join(verdicts(rows)))
    if args.output:
        args.output.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
