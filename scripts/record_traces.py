#!/usr/bin/env python
"""Record real allocation traces with pgmo's profiling mode, on a GPU.

For every ``--arch`` and ``--batchsize`` one training iteration of the
ImageNet CNNs in ``examples/models`` (and, with ``--inference``, one forward
pass at batch 1), and with ``--seq2seq N`` N variable-length batches of the
seq2seq example (training and greedy inference), run under a fresh
:class:`pgmo.ProfileGuidedMemoryPool` until it has profiled one iteration; its
``pool.profile`` is written to ``<out-dir>/<name>.json.gz`` with metadata saying
how it was recorded::

    python scripts/record_traces.py --device 0 --out-dir traces-h100 \\
        --arch alexnet googlenet resnet50 inception-resnet-v2 \\
        --batchsize 32 64 128 --inference --seq2seq 3

How: one warm-up step with CuPy's stock pool creates what lives across
iterations (optimizer state, cuBLAS handles, compiled kernels); then a new
pool (``warmup=0``) is installed and the next step is its profiled iteration,
exactly the iteration pgmo would plan from in ``ProfileGuidedMemory``.

``--device -1`` is a CPU dry run of the same code path at tiny sizes.  Chainer
on NumPy never calls CuPy's allocator, so there a Chainer function hook
(:class:`NumpyMirror`) sends one stand-in request per NumPy array to
``pgmo.testing.host_pool()``.  Those files are named ``*.dry-run.json.gz`` and
say ``"dry_run": true`` and ``"synthetic": true``: they test the plumbing and
are no recording of anything.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import logging
import platform
import sys
import time
import weakref
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))

import pgmo  # noqa: E402
import pgmo.chainer  # noqa: E402,F401  (applies the Chainer compatibility layer first)

import chainer  # noqa: E402
import numpy as np  # noqa: E402

import seq2seq as seq2seq_example  # noqa: E402
import train_imagenet  # noqa: E402
from models import ARCHS  # noqa: E402

log = logging.getLogger("record_traces")

BUNDLED_DIR = ROOT / "pgmo" / "traces"
#: Smallest image sizes the models accept: the CPU dry run's defaults.
TINY_INSIZE = {"alexnet": 39, "googlenet": 32, "resnet50": 32, "inception-resnet-v2": 75}
DRY_RUN_NOTE = ("CPU dry run: NumPy never calls CuPy's allocator, so each block stands in "
                "for one NumPy array Chainer passed to a function; no GPU recording")


# ------------------------------------------------------------------ workloads
class Workload:
    """One hot step of a model (``step()``) plus the metadata that names it.

    ``step()`` returns facts about the step just run (e.g. sentence lengths),
    merged into the trace's metadata.
    """

    def __init__(self, name: str, metadata: dict, step):
        self.name = name
        self.metadata = metadata
        self.step = step


def cnn_training(arch: str, batch: int, device, insize: int, classes: int, seed: int = 0):
    """One MomentumSGD update of ``arch`` on synthetic ImageNet-shaped data."""
    model = ARCHS[arch](n_classes=classes)
    model.to_device(device)
    optimizer = chainer.optimizers.MomentumSGD(lr=0.01, momentum=0.9)
    optimizer.setup(model)
    data = train_imagenet.SyntheticImageNet(batch, insize, classes, seed)
    iterator = chainer.iterators.SerialIterator(data, batch, shuffle=False)
    updater = chainer.training.updaters.StandardUpdater(iterator, optimizer, device=device)

    def step():
        updater.update()
        return {}

    return Workload(f"{arch}-train-b{batch}",
                    {"model": arch, "kind": "training", "batch_size": batch,
                     "input_size": insize, "classes": classes,
                     "optimizer": "MomentumSGD(lr=0.01, momentum=0.9)"}, step)


def cnn_inference(arch: str, device, insize: int, classes: int, seed: int = 0):
    """One forward pass at batch 1, as ``train_imagenet.py --inference`` runs it."""
    model = ARCHS[arch](n_classes=classes)
    model.to_device(device)
    image, _ = train_imagenet.SyntheticImageNet(1, insize, classes, seed)[0]

    def step():
        with chainer.using_config("train", False), chainer.no_backprop_mode():
            scores = model.forward(device.send(image[None]))
            label = int(chainer.backends.cuda.to_cpu(scores.array).argmax())
            del scores
        return {"predicted_class": label}

    return Workload(f"{arch}-infer-b1",
                    {"model": arch, "kind": "inference", "batch_size": 1,
                     "input_size": insize, "classes": classes}, step)


def _seq2seq_model(device, args):
    model = seq2seq_example.Seq2seq(args.vocab, args.units, args.layers)
    model.to_device(device)
    pairs = seq2seq_example.synthetic_pairs(args.sentences, args.vocab, args.min_length,
                                            args.max_length, args.seed)
    meta = {"model": "seq2seq", "vocab": args.vocab, "units": args.units,
            "layers": args.layers, "sentence_words": [args.min_length, args.max_length]}
    return model, pairs, meta


def seq2seq_training(device, args):
    """One Adam update on a shuffled batch: every batch has other sentence lengths."""
    model, pairs, meta = _seq2seq_model(device, args)
    optimizer = chainer.optimizers.Adam()
    optimizer.setup(model)
    order = chainer.iterators.ShuffleOrderSampler(np.random.RandomState(args.seed))
    iterator = chainer.iterators.SerialIterator(pairs, args.seq2seq_batchsize,
                                                order_sampler=order)
    lengths = {}

    def convert(batch, device):
        lengths["source_lengths"] = [len(s) for s, _ in batch]
        return seq2seq_example.convert_pairs(batch, device)

    updater = chainer.training.updaters.StandardUpdater(iterator, optimizer, converter=convert,
                                                        device=device)

    def step():
        updater.update()
        return dict(lengths)

    return Workload(f"seq2seq-train-b{args.seq2seq_batchsize}",
                    {**meta, "kind": "training", "batch_size": args.seq2seq_batchsize,
                     "optimizer": "Adam()"}, step)


def seq2seq_inference(device, args):
    """Greedy translation of the next sentence(s), up to ``--max-output`` words."""
    model, pairs, meta = _seq2seq_model(device, args)
    sources = [s for s, _ in pairs]
    position = [0]

    def step():
        first = position[0] % len(sources)
        batch = sources[first:first + args.translate_batch]
        position[0] = first + len(batch)
        outputs = model.translate(seq2seq_example.send_sequences(device, batch),
                                  args.max_output)
        return {"source_lengths": [len(s) for s in batch],
                "output_lengths": [len(o) for o in outputs]}

    return Workload(f"seq2seq-infer-b{args.translate_batch}",
                    {**meta, "kind": "inference", "batch_size": args.translate_batch,
                     "max_output_words": args.max_output, "untrained": True}, step)


# ------------------------------------------------------ CPU dry-run stand-in
class NumpyMirror(chainer.FunctionHook):
    """CPU dry runs only: one pool request per NumPy array, freed when the array dies.

    On NumPy, Chainer never calls CuPy's allocator, so a pool installed with
    ``cupy.cuda.set_allocator`` sees nothing.  This hook asks ``pool`` for the
    bytes of every array (its base, for views) that a function receives in
    forward or backward, the first time it is seen, and drops the block when
    the array is garbage; the pool then profiles and plans as it would on a GPU.
    """

    name = "pgmo_numpy_mirror"

    def __init__(self, pool):
        self.pool = pool
        self._blocks: dict[int, object] = {}

    def _see(self, arrays) -> None:
        for array in arrays:
            if not isinstance(array, np.ndarray):
                continue
            while isinstance(array.base, np.ndarray):
                array = array.base
            key = id(array)
            if key in self._blocks or array.nbytes == 0:
                continue
            self._blocks[key] = self.pool.malloc(array.nbytes)
            weakref.finalize(array, self._blocks.pop, key, None)

    def forward_preprocess(self, function, in_data):
        self._see(in_data)

    def backward_preprocess(self, function, in_data, out_grad):
        self._see(in_data)
        self._see(out_grad)


# ------------------------------------------------------------------ recording
def new_pool(device_id: int, **options):
    """A pool for the profiled iteration: CuPy's on a GPU, host memory on the CPU."""
    if device_id < 0:
        from pgmo.testing import host_pool

        return host_pool(**options)
    return pgmo.ProfileGuidedMemoryPool(**options)


def profile_step(workload: Workload, device_id: int, *, method: str = "bestfit",
                 time_limit: float = 5.0):
    """Run one step as a new pool's profiled iteration; return (profile, step facts, seconds)."""
    pool = new_pool(device_id, warmup=0, method=method, time_limit=time_limit)
    mirror = NumpyMirror(pool) if device_id < 0 else contextlib.nullcontext()
    start = time.perf_counter()
    with pool, mirror:
        with pool.iteration():
            facts = workload.step()
        if device_id >= 0:
            import cupy

            cupy.cuda.Device(device_id).synchronize()
    seconds = time.perf_counter() - start
    profile = pool.profile
    pool.free_all_blocks()
    if profile is None:
        raise RuntimeError(f"{workload.name}: the pool received no request in its profiled "
                           "iteration (is CuPy the array backend?)")
    return profile, facts, seconds


def environment(device_id: int) -> dict:
    """Device and library versions, for every trace's metadata."""
    import cupy

    env = {"pgmo": pgmo.__version__, "cupy": cupy.__version__, "chainer": chainer.__version__,
           "numpy": np.__version__, "python": platform.python_version()}
    if device_id >= 0:
        props = cupy.cuda.runtime.getDeviceProperties(device_id)
        name = props["name"]
        env["device"] = name.decode() if isinstance(name, bytes) else str(name)
        env["device_memory_bytes"] = int(props["totalGlobalMem"])
        env["cuda_runtime"] = cupy.cuda.runtime.runtimeGetVersion()
        env["cuda_driver"] = cupy.cuda.runtime.driverGetVersion()
    else:
        env["device"] = f"CPU ({platform.processor() or platform.machine()}), dry run"
    return env


def record(workload: Workload, device_id: int, out_dir: Path, env: dict, args,
           count: int = 1) -> list[Path]:
    """Warm up once with the stock pool, then profile ``count`` steps, one file each."""
    start = time.perf_counter()
    workload.step()  # optimizer state, handles, kernels: not part of a hot iteration
    warm = time.perf_counter() - start
    dry = device_id < 0
    written = []
    for k in range(count):
        profile, facts, seconds = profile_step(workload, device_id, method=args.method,
                                               time_limit=args.time_limit)
        name = workload.name + (f"-{k + 1}" if count > 1 else "")
        metadata = {
            **workload.metadata, **facts, **env,
            "requests": len(profile), "lower_bound": profile.lower_bound(),
            "survivors": list(profile.metadata.get("survivors", ())),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "recorded_by": "pgmo profiling mode",
            "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
            "synthetic": dry, "dry_run": dry,
        }
        if dry:
            metadata["recorded_by"] = "scripts/record_traces.py CPU dry run (NumpyMirror)"
            metadata["note"] = DRY_RUN_NOTE
        path = out_dir / f"{name}{'.dry-run' if dry else ''}.json.gz"
        pgmo.write_trace(pgmo.Trace(profile.blocks, metadata), path)
        written.append(path)
        log.info("%s: %d requests, lower bound %.1f MiB, step %.2f s (warm-up %.2f s) -> %s",
                 name, len(profile), profile.lower_bound() / 2**20, seconds, warm, path)
    return written


def workloads(args, device):
    """The workloads asked for, built lazily (one model in memory at a time).

    Order: every model at the first batch size, inference, seq2seq, then the
    other batch sizes, so that a run cut short still has every kind of trace.
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
    yield from training(args.batchsize[1:])


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", "-d", type=int, default=0,
                        help="GPU id, or -1 for a CPU dry run at tiny sizes")
    parser.add_argument("--out-dir", "-o", type=Path, default=Path("traces-recorded"))
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
    parser.add_argument("--method", default="bestfit",
                        help="solver the pool runs after profiling (the trace does not "
                        "depend on it)")
    parser.add_argument("--time-limit", type=float, default=5.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if any(b < 1 for b in args.batchsize):
        parser.error("--batchsize values must be at least 1")
    if args.device < 0 and args.out_dir.resolve() == BUNDLED_DIR.resolve():
        parser.error("a CPU dry run must not write into pgmo/traces: its files are no recordings")
    if args.insize is not None:
        for arch in args.arch:
            if args.insize < ARCHS[arch].min_insize:
                parser.error(f"--insize {args.insize} is too small for {arch}")
    return args


def main(argv=None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    args = parse_args(argv)
    device = chainer.get_device("@numpy" if args.device < 0 else f"@cupy:{args.device}")
    device.use()
    if args.device < 0:
        print("CPU DRY RUN: no GPU recording is made; files are named *.dry-run.json.gz and "
              "marked \"dry_run\": true.", flush=True)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    env = environment(args.device)
    total = time.perf_counter()
    written, failed = [], 0
    for build, count in workloads(args, device):
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
    print(f"wrote {len(written)} trace(s) to {args.out_dir} in "
          f"{time.perf_counter() - total:.1f} s; {failed} workload(s) failed", flush=True)
    for path in written:
        print(f"  {path.name}  {path.stat().st_size} bytes")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
