"""Cost of one malloc+free pair in each of pgmo's paths, as ratios to baselines measured in the same run.

On the CPU (host backend, no GPU needed) the baseline is a trivial Python
allocator: it only wraps a fixed host address in CuPy's memory objects, the
least any Python allocator can do.  With a GPU (``--gpu``) CuPy's stock
``MemoryPool`` is measured side by side.  Rows:

* pgmo optimized: a planned iteration, served from the arena (the hot path,
  compiled when pgmo was built with Cython, and its plain-Python reference);
* pgmo profiling: an iteration served by the fallback and recorded;
* pgmo fallback: between ``interrupt()`` and ``resume()``.

The fallback and profiling paths call the fallback pool (a Python caching
pool on the CPU, CuPy's stock pool on a GPU), measured alone too; the last
column is pgmo's own part of those paths, against the optimized path.

Each workload is replayed as hot iterations; times are microseconds per
malloc+free pair (the loop's own overhead included, the same for every row),
best of ``--repeat`` runs, in CPU time of the calling thread (robust on a busy
machine).  Targets: optimized <= 2x the trivial allocator; profiling and
fallback < 2x optimized.

    python -m scripts.bench_malloc              # CPU host backend
    python -m scripts.bench_malloc --gpu        # CUDA device, against CuPy's pool
"""

from __future__ import annotations

import gc
import time

import numpy as np
from pgmo import programs

from . import needs_gpu


def workloads(n: int) -> dict[str, tuple[list[int], list[tuple[int, int]]]]:
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
        start = time.thread_time()
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
        elapsed = time.thread_time() - start
    finally:
        gc.enable()
    return elapsed / (iterations * len(sizes))


def best_of(repeat: int, fn) -> float:
    return min(fn() for _ in range(repeat))


def pool_rows(make_pool, sizes, evs, iterations, repeat, label=""):
    """(path, seconds) for the optimized, profiling and fallback paths of fresh pools."""
    rows = []
    pool = make_pool(warmup=1)
    run(pool.malloc, sizes, evs, 2, pool.begin_iteration, pool.end_iteration)
    assert pool.mode == "optimized", pool.mode
    rows.append((f"pgmo optimized{label}",
                 best_of(repeat, lambda: run(pool.malloc, sizes, evs, iterations,
                                             pool.begin_iteration, pool.end_iteration))))
    st = pool.stats()
    assert st.departed_requests == 0 and st.departures == 0, st
    pool.interrupt()
    rows.append((f"pgmo fallback{label}",
                 best_of(repeat, lambda: run(pool.malloc, sizes, evs, iterations,
                                             pool.begin_iteration, pool.end_iteration))))
    pool.resume()
    profiling = make_pool(warmup=10 ** 9)  # every iteration recorded, served by the fallback
    rows.append((f"pgmo profiling{label}",
                 best_of(repeat, lambda: run(profiling.malloc, sizes, evs, iterations,
                                             profiling.begin_iteration,
                                             profiling.end_iteration))))
    return rows


def cpu_table(n: int, iterations: int, repeat: int):
    from cupy.cuda.memory import MemoryPointer, UnownedMemory

    from pgmo.engine import compiled, reference_handout
    from pgmo.measure.hosts import host_pool

    buf = np.empty(1 << 21, np.uint8)
    base = buf.ctypes.data

    def trivial(size):
        return MemoryPointer(UnownedMemory(base, size, buf, 0), 0)

    from pgmo.measure.hosts import HostFallback
    from pgmo.testing import HostMemory

    bare = HostFallback(HostMemory())

    def bare_fallback(size):  # the fallback pool alone, wrapped as CuPy would see it
        block = bare.malloc(size)
        return MemoryPointer(UnownedMemory(block.ptr, block.size, block, 0), 0)

    def reference_pool(**kw):
        pool = host_pool(**kw)
        engine = pool.engine
        # the same engine with the plain-Python hot path
        from pgmo.engine import Engine

        pure = Engine(engine.backend, engine.options, hot_path=reference_handout().HotPath)
        return pure

    table = {}
    for name, (sizes, evs) in workloads(n).items():
        rows = [("trivial python allocator",
                 best_of(repeat, lambda: run(trivial, sizes, evs, iterations))),
                ("host fallback pool alone",
                 best_of(repeat, lambda: run(bare_fallback, sizes, evs, iterations)))]
        label = " (compiled)" if compiled() else " (plain Python: not compiled)"
        rows += pool_rows(host_pool, sizes, evs, iterations, repeat, label)
        if compiled():
            rows += [r for r in pool_rows(reference_pool, sizes, evs, iterations, repeat,
                                          " (plain Python)") if "optimized" in r[0]]
        table[name] = rows
    return table, "trivial python allocator", "host fallback pool alone"


def gpu_table(n: int, iterations: int, repeat: int):
    import cupy

    import pgmo

    table = {}
    for name, (sizes, evs) in workloads(n).items():
        stock = cupy.cuda.MemoryPool()
        run(stock.malloc, sizes, evs, 1)
        rows = [("cupy MemoryPool",
                 best_of(repeat, lambda: run(stock.malloc, sizes, evs, iterations)))]
        # pgmo's fallback is such a pool: it is also the fallback paths' floor
        rows += pool_rows(lambda **kw: pgmo.ProfileGuidedMemoryPool(
            method="bestfit", replan="sync", plan_cache=False, **kw), sizes, evs, iterations,
            repeat)
        table[name] = rows
        cupy.cuda.Device().synchronize()
    return table, "cupy MemoryPool", "cupy MemoryPool"


def report(table, baseline: str, pool_alone: str) -> str:
    """One row per path; for the fallback and profiling paths, also pgmo's own share.

    Those paths call the fallback pool: "pgmo's own" is the path's time minus
    the pool's alone, against the optimized path.
    """
    lines = [f"| workload | path | us / malloc+free | x {baseline} | x pgmo optimized "
             f"| pgmo's own, x optimized |", "|---|---|---:|---:|---:|---:|"]
    for workload, rows in table.items():
        times = dict(rows)
        base, alone = times[baseline], times.get(pool_alone)
        optimized = next(sec for path, sec in rows if path.startswith("pgmo optimized"))
        for path, sec in rows:
            own = ""
            if alone is not None and path.startswith(("pgmo fallback", "pgmo profiling")):
                own = f"{(sec - alone) / optimized:.2f}"
            lines.append(f"| {workload} | {path} | {sec * 1e6:.3f} | {sec / base:.2f} | "
                         f"{sec / optimized:.2f} | {own} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = programs.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", action="store_true", help="benchmark on the CUDA device")
    ap.add_argument("-n", type=int, default=2000, help="requests per iteration")
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args(argv)
    for name in ("n", "iterations", "repeat"):
        if getattr(args, name) < 1:
            ap.error(f"{'-n' if name == 'n' else '--' + name} must be at least 1, got "
                     f"{getattr(args, name)}")
    if args.gpu:
        needs_gpu.require_gpu(0, instead="without --gpu it runs on the CPU")
    table, baseline, pool_alone = (gpu_table if args.gpu else cpu_table)(
        args.n, args.iterations, args.repeat)
    print(report(table, baseline, pool_alone))


if __name__ == "__main__":
    raise SystemExit(programs.run(main))
