#!/usr/bin/env python
"""Cost of one malloc+free pair: pgmo's optimized path against simple baselines.

On the CPU (host backend, no GPU needed) the baselines are a trivial Python
allocator (it only wraps a fixed host address in CuPy's memory objects, the
least any Python allocator can do) and pgmo's own profiling/fallback path.
With a GPU (``--gpu``) the baseline is CuPy's stock ``MemoryPool``.

Each workload is replayed as hot iterations; the table gives microseconds per
malloc+free pair (the loop's own overhead included, the same for every row),
best of ``--repeat`` runs, in CPU time of this process (robust on a busy machine).

    python scripts/bench_malloc.py              # CPU host backend
    python scripts/bench_malloc.py --gpu        # CUDA device
"""

from __future__ import annotations

import argparse
import gc
import time

import numpy as np


def workloads(n: int) -> dict[str, list[tuple[int, int]]]:
    """Event lists ``(kind, index)``: kind 1 alloc, 0 free; sizes by index."""
    rng = np.random.default_rng(0)
    sizes = [int(s) for s in rng.integers(1, 1 << 20, n)]
    pairs = []
    for i in range(n):  # alloc then free at once: the pool's best case
        pairs += [(1, i), (0, i)]
    stack = []
    depth = 32
    for base in range(0, n, depth):  # allocate a layer stack, free it in reverse
        idx = list(range(base, min(base + depth, n)))
        stack += [(1, i) for i in idx] + [(0, i) for i in reversed(idx)]
    return {"pairs": (sizes, pairs), "stack": (sizes, stack)}


def run(malloc, sizes, evs, iterations: int, begin=None, end=None) -> float:
    """Seconds per malloc+free pair over ``iterations`` hot iterations."""
    live = [None] * len(sizes)
    gc.disable()
    try:
        start = time.process_time()
        for _ in range(iterations):
            if begin is not None:
                begin()
            for kind, i in evs:
                if kind:
                    live[i] = malloc(sizes[i])
                else:
                    live[i] = None
            if end is not None:
                end()
        elapsed = time.process_time() - start
    finally:
        gc.enable()
    return elapsed / (iterations * len(sizes))


def best_of(repeat: int, fn) -> float:
    return min(fn() for _ in range(repeat))


def cpu_rows(n: int, iterations: int, repeat: int):
    from cupy.cuda.memory import MemoryPointer, UnownedMemory

    from pgmo.testing import host_pool

    buf = np.empty(1 << 21, np.uint8)
    base = buf.ctypes.data

    def trivial(size):
        return MemoryPointer(UnownedMemory(base, size, buf, 0), 0)

    rows = []
    for name, (sizes, evs) in workloads(n).items():
        rows.append((name, "trivial python allocator",
                     best_of(repeat, lambda: run(trivial, sizes, evs, iterations))))
        pool = host_pool(warmup=1, method="bestfit")
        # warm-up + profiled iteration, then optimized
        run(pool.malloc, sizes, evs, 2, pool.begin_iteration, pool.end_iteration)
        assert pool.mode == "optimized", pool.mode
        t = best_of(repeat, lambda: run(pool.malloc, sizes, evs, iterations,
                                        pool.begin_iteration, pool.end_iteration))
        st = pool.stats()
        assert st["fallback_requests"] == 0 and st["departures"] == 0, st
        rows.append((name, "pgmo optimized (host arena)", t))
        engine = pool.engine
        rows.append((name, "pgmo engine.malloc directly",
                     best_of(repeat, lambda: run(engine.malloc, sizes, evs, iterations,
                                                 pool.begin_iteration, pool.end_iteration))))
        pool.interrupt()
        rows.append((name, "pgmo fallback (host cache)",
                     best_of(repeat, lambda: run(pool.malloc, sizes, evs, iterations,
                                                 pool.begin_iteration, pool.end_iteration))))
        pool.resume()
    return rows


def gpu_rows(n: int, iterations: int, repeat: int):
    import cupy

    import pgmo

    rows = []
    for name, (sizes, evs) in workloads(n).items():
        stock = cupy.cuda.MemoryPool()
        run(stock.malloc, sizes, evs, 1)
        rows.append((name, "cupy MemoryPool",
                     best_of(repeat, lambda: run(stock.malloc, sizes, evs, iterations))))
        pool = pgmo.ProfileGuidedMemoryPool(method="bestfit")
        run(pool.malloc, sizes, evs, 2, pool.begin_iteration, pool.end_iteration)
        rows.append((name, "pgmo optimized",
                     best_of(repeat, lambda: run(pool.malloc, sizes, evs, iterations,
                                                 pool.begin_iteration, pool.end_iteration))))
        st = pool.stats()
        rows.append((name, f"  (arena {st['arena_bytes']:,} B, fallback requests "
                           f"{st['fallback_requests']})", float("nan")))
        pool.interrupt()
        rows.append((name, "pgmo fallback (cupy pool)",
                     best_of(repeat, lambda: run(pool.malloc, sizes, evs, iterations,
                                                 pool.begin_iteration, pool.end_iteration))))
        pool.resume()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", action="store_true", help="benchmark on the CUDA device")
    ap.add_argument("-n", type=int, default=2000, help="requests per iteration")
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    rows = (gpu_rows if args.gpu else cpu_rows)(args.n, args.iterations, args.repeat)
    print(f"{'workload':8}  {'allocator':34}  {'us / malloc+free':>16}")
    print("-" * 64)
    for workload, name, sec in rows:
        cell = "" if sec != sec else f"{sec * 1e6:16.3f}"
        print(f"{workload:8}  {name:34}  {cell}")


if __name__ == "__main__":
    main()
