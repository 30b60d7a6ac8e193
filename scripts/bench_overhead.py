"""What re-planning costs a training loop: boundary stalls, synchronous against background.

A bundled trace (or, with ``--trace random``, a generated iteration of 400
requests where the paper's best-fit is 11 % above the lower bound, see
``pgmo.synth.random_iteration``) is replayed for ``--iterations`` iterations
through the pool on host memory (no GPU needed).  Like seq2seq with longer and longer sentences,
its sizes grow at ``--growth`` evenly spaced iterations in the first half, so
the pool departs from its plan and re-plans; then they stay put, so the
final plan can settle.  The loop runs twice, with ``replan="sync"`` (every
solve at the boundary) and ``replan="background"`` (best-fit at once, the
full method in a worker process), and prints per mode:

* total time of the loop, and of its boundaries (``begin_iteration`` +
  ``end_iteration``): the worst, the median and the 99th percentile stall;
* re-plans, background solves, plans dropped as stale;
* the arena size over time (sampled) and the final planned peak.

Goal: the worst stall under 20 ms in background mode, and the same final
peak as the synchronous run.

    python -m scripts.bench_overhead [--trace NAME] [--iterations N] [--time-limit S]
"""

from __future__ import annotations

import statistics
import time

import pgmo
from pgmo import bundled, programs
from pgmo.trace import events


def grown(trace: pgmo.Trace, step: int) -> pgmo.Trace:
    """Every third request larger by ``step`` x 4 KiB: more memory, same lifetimes."""
    lowers, uppers, sizes = trace.columns()
    sizes = [s + (4096 * step if i % 3 == 0 else 0) for i, s in enumerate(sizes)]
    return pgmo.Trace.from_columns(lowers, uppers, sizes)


def workload(trace: pgmo.Trace, iterations: int, growth: int) -> list[pgmo.Trace]:
    steps = [iterations // 2 * (k + 1) // (growth + 1) for k in range(growth)]
    out, step = [], 0
    for it in range(iterations):
        if step < len(steps) and it >= steps[step]:
            step += 1
        out.append(grown(trace, step))
    return out


def run(mode: str, traces: list[pgmo.Trace], args) -> dict:
    from pgmo.measure.hosts import host_pool

    pool = host_pool(warmup=1, replan=mode, method=args.method, time_limit=args.time_limit,
                     seed=0)
    stalls, arena = [], []
    started = time.perf_counter()
    for it, trace in enumerate(traces):
        blocks = trace.blocks
        live = {}
        t0 = time.perf_counter()
        pool.begin_iteration()
        stall = time.perf_counter() - t0
        for _, kind, i in events(blocks):
            if kind:
                live[i] = pool.malloc(blocks[i].size)
            else:
                del live[i]
        t0 = time.perf_counter()
        pool.end_iteration()
        stalls.append(stall + time.perf_counter() - t0)
        arena.append(pool.stats().arena_bytes)
    total = time.perf_counter() - started
    # Let a last background solve land, as a longer run would.
    deadline = time.perf_counter() + args.time_limit * 1.05 + 30
    while pool.engine.planner.busy and time.perf_counter() < deadline:
        time.sleep(0.05)
    pool.begin_iteration()
    pool.end_iteration()
    st = pool.stats()
    pool.close()
    stalls_ms = sorted(s * 1e3 for s in stalls)
    return {"mode": mode, "total_s": total, "boundary_s": sum(stalls),
            "worst_ms": stalls_ms[-1], "median_ms": statistics.median(stalls_ms),
            "p99_ms": stalls_ms[min(len(stalls_ms) - 1, int(0.99 * len(stalls_ms)))],
            "replans": st.reoptimizations, "background": st.background_solves,
            "stale": st.stale_plans, "failures": st.planner_failures + st.solve_failures,
            "final_peak": st.planned_peak, "lower_bound": st.lower_bound,
            "final_method": st.plan_method, "arena": arena}


def main(argv=None) -> None:
    ap = programs.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default="synthetic-inception_resnet_v2-train-b32",
                    help=f"bundled trace ({', '.join(bundled.names())}) or 'random'")
    ap.add_argument("--iterations", type=int, default=200)
    ap.add_argument("--growth", type=int, default=5, help="size increases in the first half")
    ap.add_argument("--method", default="best")
    ap.add_argument("--time-limit", type=float, default=2.0, metavar="S")
    args = ap.parse_args(argv)
    if args.trace == "random":
        from pgmo.synth import random_iteration

        trace = random_iteration(4, n=400)
    else:
        trace = bundled.load(args.trace)
    traces = workload(trace, args.iterations, args.growth)
    print(f"trace {args.trace}: {len(trace)} requests per iteration, {args.iterations} "
          f"iterations, sizes grow {args.growth} times; method {args.method}, time limit "
          f"{args.time_limit} s\n")
    rows = [run(mode, traces, args) for mode in ("sync", "background")]
    print("| replan | total s | boundaries s | worst stall ms | median ms | p99 ms | re-plans "
          "| background solves | stale | failures | final method | final peak | / LB |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|")
    for r in rows:
        print(f"| {r['mode']} | {r['total_s']:.2f} | {r['boundary_s']:.2f} | {r['worst_ms']:.1f} "
              f"| {r['median_ms']:.2f} | {r['p99_ms']:.1f} | {r['replans']} | {r['background']} "
              f"| {r['stale']} | {r['failures']} | {r['final_method']} | {r['final_peak']:,} "
              f"| {r['final_peak'] / r['lower_bound']:.4f} |")
    print("\narena bytes over time (every tenth iteration):")
    for r in rows:
        print(f"  {r['mode']:10} " + " ".join(f"{a / 2**20:.1f}" for a in r["arena"][::10])
              + " MiB")
    sync, background = rows
    print(f"\nworst stall in background mode: {background['worst_ms']:.1f} ms (goal < 20 ms); "
          f"final peak {'equals' if sync['final_peak'] == background['final_peak'] else 'differs from'}"
          f" the synchronous run's ({background['final_peak']:,} vs {sync['final_peak']:,} B)")


if __name__ == "__main__":
    raise SystemExit(programs.run(main))
