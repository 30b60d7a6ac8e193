"""Record real allocation traces with pgmo's profiling mode, on a GPU.

For every ``--arch`` and ``--batchsize`` one training iteration of the
ImageNet CNNs in ``examples/models`` (and, with ``--inference``, one forward
pass at batch 1), and with ``--seq2seq N`` N variable-length batches of the
seq2seq example (training and greedy inference), run under a fresh
:class:`pgmo.ProfileGuidedMemoryPool` until it has profiled one iteration; its
``pool.profile`` is written to ``<out-dir>/<name>.json.gz`` with metadata saying
how it was recorded::

    python -m scripts.record_traces --device 0 --out-dir traces-h100 \\
        --arch alexnet googlenet resnet50 inception-resnet-v2 \\
        --batchsize 32 64 128 --inference --seq2seq 3 --densenet 64

How: one warm-up step with CuPy's stock pool creates what lives across
iterations (optimizer state, cuBLAS handles, compiled kernels); then a new
pool (``warmup=0``) is installed and the next step is its profiled iteration,
exactly the iteration pgmo would plan from in ``ProfileGuidedMemory``.

``--densenet B`` records the DenseNet-BC of ``examples/densenet.py`` at batch
``B`` in four combinations: without and with recomputation
(``-recompute-off``/``-on``), each under pgmo (``-pgmo``, as above) and under
CuPy's stock pool (``-stock``): a fresh ``cupy.cuda.MemoryPool`` serves one
step, then :class:`pgmo.TraceRecorder` records the next, so the trace also
says what the stock pool reserved (``reserved_peak``).
``python -m scripts.recompute_table`` compares the four.

``--device -1`` is a CPU dry run of the same code path at tiny sizes.  Chainer
on NumPy never calls CuPy's allocator, so there a Chainer function hook
(:class:`NumpyMirror`) asks CuPy's allocator (``cupy.cuda.alloc``) for one
stand-in block per NumPy array; the pool installed there is
``pgmo.testing.host_pool()`` with the pool's own defaults (planning in the
background), so the requests reach it, and it plans them, as on a GPU.  Those
files are named ``*.dry-run.json.gz`` and say ``"dry_run": true`` and
``"synthetic": true``: they test the plumbing and are no recording of
anything.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import logging
import subprocess
import sys
import time
from pathlib import Path

from pgmo import programs

programs.start(__name__)  # Ctrl-C from here on: one line, exit status 130

import pgmo  # noqa: E402
import pgmo.chainer  # noqa: E402,F401  (applies the Chainer compatibility layer first)

import chainer  # noqa: E402

from . import children, needs_gpu  # noqa: E402
from .chainer_workloads import (  # noqa: E402
    ARCHS, DENSENET, DRY_RUN_NOTE, TINY_INSIZE, Workload, cnn_inference, cnn_training,
    densenet_training, environment, mirror_for, new_pool, seq2seq_inference, seq2seq_training)

log = logging.getLogger("record_traces")

BUNDLED_DIR = children.ROOT / "pgmo" / "traces"


# ------------------------------------------------------------------ recording
def profiled_trace(pool, name: str):
    """The profile of the iteration the pool has just profiled.

    ``pool.profile`` is the profile of the plan in use or waiting to be
    installed.  In the pool's default ``replan="background"``, a profile is
    planned in the pool's worker process and installed at a later iteration
    boundary, so right after the iteration there is none yet:
    ``pool.optimize()`` plans it now.
    """
    if pool.profile is None and pool.stats().profiled_requests:
        pool.optimize()
    profile = pool.profile
    if profile is None:
        raise RuntimeError(f"{name}: the pool received no request in its profiled "
                           "iteration (is CuPy the array backend?)")
    return profile


def profile_step(workload: Workload, device_id: int, *, method: str = "bestfit",
                 time_limit: float = 5.0):
    """Run one step as a new pool's profiled iteration; return (profile, step facts, seconds).

    The profile's metadata gains ``survivors``: the blocks live after the
    iteration (gradients, say), open in the trace.
    """
    pool = new_pool(device_id, warmup=0, method=method, time_limit=time_limit)
    start = time.perf_counter()
    with pool, mirror_for(device_id):
        with pool.iteration():
            facts = workload.step()
        if device_id >= 0:
            import cupy

            cupy.cuda.Device(device_id).synchronize()
    seconds = time.perf_counter() - start
    profile = profiled_trace(pool, workload.name)
    pool.free_all_blocks()
    survivors = list(profile.metadata.get("survivors", ()))
    return pgmo.Trace(profile.blocks, {"survivors": survivors}), facts, seconds


@contextlib.contextmanager
def stock_pool(device_id: int):
    """A fresh CuPy stock pool serving this block's requests (CPU: a stand-in, see below).

    On the CPU, pgmo's host pool inside ``interrupted()`` serves everything
    from its fallback (a caching host pool standing in for CuPy's) and reports
    each request to CuPy's memory hooks, as CuPy's pool does.
    """
    if device_id >= 0:
        import cupy

        pool = cupy.cuda.MemoryPool()
        previous = cupy.cuda.get_allocator()
        cupy.cuda.set_allocator(pool.malloc)
        try:
            yield pool, contextlib.nullcontext
        finally:
            cupy.cuda.set_allocator(previous)
            cupy.cuda.Device(device_id).synchronize()
            pool.free_all_blocks()
        return
    pool = new_pool(device_id, warmup=0)

    @contextlib.contextmanager
    def iteration():
        with pool.iteration(), pool.interrupted():
            yield

    with pool, mirror_for(device_id):
        yield pool, iteration


def stock_step(workload: Workload, device_id: int):
    """One step on a fresh stock pool, then the next recorded; return (trace, facts, seconds).

    The first step leaves the pool holding what it holds in steady state, so
    ``reserved_peak`` (the pool's bytes before the recorded step plus what it
    took from the device during it) is what training with the stock pool
    reserves for an iteration.  Weights and optimizer state stay in CuPy's
    default pool, where the warm-up step left them.
    """
    from pgmo.trace_recorder import TraceRecorder

    with stock_pool(device_id) as (pool, iteration):
        with iteration():
            workload.step()
        start = time.perf_counter()
        with TraceRecorder(pool=pool) as recorder, iteration():
            facts = workload.step()
        if device_id >= 0:
            import cupy

            cupy.cuda.Device(device_id).synchronize()
        seconds = time.perf_counter() - start
        trace = recorder.trace()
    if not len(trace):
        raise RuntimeError(f"{workload.name}: the stock pool received no request "
                           "(is CuPy the array backend?)")
    return trace, facts, seconds


#: How each pool's traces are recorded, on a GPU and in a CPU dry run.
RECORDED_BY = {
    "pgmo": ("pgmo profiling mode",
             "scripts/record_traces.py CPU dry run (NumpyMirror)"),
    "stock": ("pgmo.TraceRecorder on a fresh cupy.cuda.MemoryPool (CuPy's stock pool), "
              "the step after its first",
              "scripts/record_traces.py CPU dry run (NumpyMirror, pgmo.TraceRecorder over a "
              "host pool standing in for CuPy's)"),
}


def record(workload: Workload, device_id: int, out_dir: Path, env: dict, args,
           count: int = 1) -> list[Path]:
    """Warm up once with the stock pool, then record ``count`` steps per pool, one file each."""
    start = time.perf_counter()
    workload.step()  # optimizer state, handles, kernels: not part of a hot iteration
    warm = time.perf_counter() - start
    dry = device_id < 0
    written = []
    for pool_name in workload.pools:
        for k in range(count):
            if pool_name == "stock":
                trace, facts, seconds = stock_step(workload, device_id)
            else:
                trace, facts, seconds = profile_step(workload, device_id, method=args.method,
                                                     time_limit=args.time_limit)
            name = workload.name + (f"-{pool_name}" if len(workload.pools) > 1 else "") \
                + (f"-{k + 1}" if count > 1 else "")
            metadata = {
                **trace.metadata, **workload.metadata, **facts, **env,
                "pool": pool_name, "requests": len(trace), "lower_bound": trace.lower_bound(),
                "date": datetime.datetime.now(datetime.timezone.utc).isoformat(
                    timespec="seconds"),
                "recorded_by": RECORDED_BY[pool_name][dry],
                "command": args.command,
                "synthetic": dry, "dry_run": dry,
            }
            if dry:
                metadata["note"] = DRY_RUN_NOTE
            path = out_dir / f"{name}{'.dry-run' if dry else ''}.json.gz"
            pgmo.write_trace(pgmo.Trace(trace.blocks, metadata), path)
            written.append(path)
            log.info("%s: %d requests, lower bound %.1f MiB, step %.2f s (warm-up %.2f s) -> %s",
                     name, len(trace), trace.lower_bound() / 2**20, seconds, warm, path)
    return written


def workloads(args, device):
    """The workloads asked for, built lazily (one model in memory at a time).

    Order: every model at the first batch size, inference, seq2seq, DenseNet,
    then the other batch sizes, so that a run cut short still has every kind
    of trace.
    """
    dry = args.device < 0

    def insize(arch):
        return args.insize or (TINY_INSIZE[arch] if dry else ARCHS[arch].insize)

    def training(batches):
        for batch in batches:
            for arch in args.arch:
                yield (lambda a=arch, b=batch:
                       cnn_training(a, b, device, insize(a), args.classes, args.seed)), 1

    yield from training(args.batchsize[:1])
    if args.inference:
        for arch in args.arch:
            yield (lambda a=arch: cnn_inference(a, device, insize(a), args.classes,
                                                 args.seed)), 1
    if args.seq2seq:
        yield (lambda: seq2seq_training(device, args)), args.seq2seq
        if args.inference:
            yield (lambda: seq2seq_inference(device, args)), args.seq2seq
    sizes = (args.densenet_depth, args.growth_rate, *DENSENET["dry-run" if dry else "gpu"][2:])
    for batch in args.densenet:
        for recompute in (False, True):
            yield (lambda b=batch, r=recompute:
                   densenet_training(b, device, r, sizes, args.seed)), 1
    yield from training(args.batchsize[1:])


def parse_args(argv=None):
    parser = programs.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", "-d", type=int, default=0,
                        help="GPU id, or -1 for a CPU dry run at tiny sizes")
    parser.add_argument("--out-dir", "-o", type=programs.output_folder,
                        default=Path("traces-recorded"), help="folder for the traces, made if new")
    parser.add_argument("--arch", nargs="*", choices=sorted(ARCHS), default=sorted(ARCHS))
    parser.add_argument("--batchsize", "-b", nargs="*", type=int, default=[32, 64, 128],
                        help="training batch sizes (none: no CNN training traces)")
    parser.add_argument("--inference", action="store_true",
                        help="also record inference: CNNs at batch 1, seq2seq translation")
    parser.add_argument("--seq2seq", type=int, default=0, metavar="N",
                        help="record N seq2seq batches (each with other sentence lengths)")
    parser.add_argument("--insize", type=int, help="image size (default: the model's; "
                        "on the CPU the smallest it accepts)")
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--vocab", type=int, default=40000)
    parser.add_argument("--units", type=int, default=512)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--seq2seq-batchsize", type=int, default=64)
    parser.add_argument("--sentences", type=int, default=2000, help="synthetic sentence pairs")
    parser.add_argument("--min-length", type=int, default=1)
    parser.add_argument("--max-length", type=int, default=50)
    parser.add_argument("--translate-batch", type=int, default=1)
    parser.add_argument("--max-output", type=int, default=100)
    parser.add_argument("--densenet", nargs="*", type=int, default=[], metavar="B",
                        help="record examples/densenet.py's DenseNet-BC at these batch sizes, "
                        "with and without recomputation, under pgmo and the stock pool")
    parser.add_argument("--densenet-depth", type=int,
                        help="DenseNet-BC depth, 6 n + 4 (default: 100; CPU dry run: 28)")
    parser.add_argument("--growth-rate", type=int,
                        help="DenseNet-BC growth rate (default: 12; CPU dry run: 4)")
    parser.add_argument("--method", default="bestfit", choices=pgmo.METHODS,
                        help="solver the pool runs after profiling (the trace does not "
                        "depend on it)")
    parser.add_argument("--time-limit", type=programs.non_negative_float, default=5.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--isolate", action="store_true",
                        help="record each workload in a process of its own, so that one that "
                             "fails or fills the device leaves nothing behind for the next")
    parser.add_argument("--only", type=int, help=argparse.SUPPRESS)  # an isolated child's
    parser.add_argument("--command", help=argparse.SUPPRESS)  # the command its parent ran
    argv = sys.argv[1:] if argv is None else [str(a) for a in argv]
    args = parser.parse_args(argv)
    args.argv = argv
    args.command = args.command or " ".join([Path(sys.argv[0]).name, *argv])
    if any(b < 1 for b in args.batchsize):
        parser.error("--batchsize values must be at least 1")
    if any(b < 1 for b in args.densenet):
        parser.error("--densenet batch sizes must be at least 1")
    depth, growth_rate = DENSENET["dry-run" if args.device < 0 else "gpu"][:2]
    args.densenet_depth = args.densenet_depth or depth
    args.growth_rate = args.growth_rate or growth_rate
    if args.densenet_depth < 10 or (args.densenet_depth - 4) % 6:
        parser.error(f"--densenet-depth must be 6 n + 4 with n >= 1, got {args.densenet_depth}")
    if args.growth_rate < 1:
        parser.error(f"--growth-rate must be at least 1, got {args.growth_rate}")
    if args.device < 0 and args.out_dir.resolve() == BUNDLED_DIR.resolve():
        parser.error("a CPU dry run must not write into pgmo/traces: its files are no recordings")
    if args.insize is not None:
        for arch in args.arch:
            if args.insize < ARCHS[arch].min_insize:
                parser.error(f"--insize {args.insize} is too small for {arch}")
    return args


def isolated(args, count: int) -> tuple[list[Path], int]:
    """Record workload ``k`` of ``count`` in a fresh process each: (files written, failures)."""
    before = set(args.out_dir.glob("*.json.gz"))
    failed = 0
    for k in range(count):
        argv = [a for a in args.argv if a != "--isolate"]
        done = subprocess.run(children.command("record_traces", *argv, "--only", k,
                                               "--command", args.command),
                              env=children.environment())
        failed += done.returncode != 0
    return sorted(set(args.out_dir.glob("*.json.gz")) - before), failed


def main(argv=None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    args = parse_args(argv)
    if args.device >= 0:
        needs_gpu.require_gpu(args.device, instead="--device -1 runs it on the CPU (a dry run)")
    device = chainer.get_device("@numpy" if args.device < 0 else f"@cupy:{args.device}")
    device.use()
    if args.device < 0 and args.only is None:
        print("CPU DRY RUN: no GPU recording is made; files are named *.dry-run.json.gz and "
              "marked \"dry_run\": true.", flush=True)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    total = time.perf_counter()
    chosen = list(workloads(args, device))  # built lazily: listing them builds nothing
    if args.isolate and args.only is None:
        written, failed = isolated(args, len(chosen))
        return summary(args, written, failed, total)
    if args.only is not None:
        chosen = chosen[args.only:args.only + 1]
    env = environment(args.device)
    written, failed = [], 0
    for build, count in chosen:
        start = time.perf_counter()
        workload = None
        try:  # one failing model (out of memory, say) must not cost the others' traces
            workload = build()
            written += record(workload, args.device, args.out_dir, env, args, count)
            log.info("%s done in %.1f s", workload.name, time.perf_counter() - start)
        except Exception:  # noqa: BLE001 - reported, counted, and the exit status says so
            failed += 1
            log.exception("a workload failed after %.1f s", time.perf_counter() - start)
        del workload
        if args.device >= 0:
            import cupy

            cupy.get_default_memory_pool().free_all_blocks()
    if args.only is not None:  # an isolated child: its parent sums up
        return 1 if failed else 0
    return summary(args, written, failed, total)


def summary(args, written: list[Path], failed: int, start: float) -> int:
    print(f"wrote {len(written)} trace(s) to {args.out_dir} in "
          f"{time.perf_counter() - start:.1f} s; {failed} workload(s) failed", flush=True)
    for path in written:
        print(f"  {path.name}  {path.stat().st_size} bytes")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(programs.run(main))
