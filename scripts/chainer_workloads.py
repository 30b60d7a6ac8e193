"""The examples' training and inference steps, for recording and measuring them under a pool.

One :class:`Workload` is one hot step of an example model (``examples/``:
the ImageNet CNNs of ``train_imagenet.py``, ``seq2seq.py``'s encoder-decoder,
``densenet.py``'s DenseNet-BC), built on a Chainer device, plus the metadata
that names it.  ``record_traces`` records one step of each as a trace;
``bench_memory``'s children train them under each pool.

On the CPU (a dry run, ``device_id < 0``) Chainer's arrays are NumPy's and
never reach CuPy's allocator: :func:`mirror_for` asks that allocator for one
stand-in block per array (:class:`scripts.numpy_mirror.NumpyMirror`), and
:func:`new_pool` makes pgmo's pool on host memory with the pool's own
defaults, so that the requests reach the pool installed, as on a GPU.
"""

from __future__ import annotations

import contextlib
import platform

import pgmo
import pgmo.chainer  # noqa: F401  (applies the Chainer compatibility layer first)

import chainer
import numpy as np

from .examples import load
from .numpy_mirror import NumpyMirror

densenet_example = load("densenet")
seq2seq_example = load("seq2seq")
train_imagenet = load("train_imagenet")
ARCHS = load("models").ARCHS

#: Smallest image sizes the models accept: the CPU dry run's defaults.
TINY_INSIZE = {"alexnet": 39, "googlenet": 32, "resnet50": 32, "inception-resnet-v2": 75}
#: DenseNet-BC on CIFAR-sized images: (depth, growth rate, image size, classes);
#: the published DenseNet-BC-100 (k=12) on a GPU; in a CPU dry run a tiny one whose
#: profiles still exceed the 256 requests that the pool plans in the background.
DENSENET = {"gpu": (100, 12, 32, 10), "dry-run": (28, 4, 8, 10)}
DRY_RUN_NOTE = ("CPU dry run: NumPy never calls CuPy's allocator, so each block stands in "
                "for one NumPy array Chainer passed to a function; no GPU recording")


# ------------------------------------------------------------------ workloads
class Workload:
    """One hot step of a model (``step()``) plus the metadata that names it.

    ``step()`` returns facts about the step just run (e.g. sentence lengths),
    merged into the trace's metadata.  ``pools``: under which pools to record
    it (``"pgmo"``: its profiling mode; ``"stock"``: CuPy's pool with
    :class:`pgmo.TraceRecorder`); with more than one, each file's name ends
    with its pool's.
    """

    def __init__(self, name: str, metadata: dict, step, pools=("pgmo",)):
        self.name = name
        self.metadata = metadata
        self.step = step
        self.pools = tuple(pools)


def update_step(model, optimizer, data, batch: int, device):
    """One call = one update of ``model`` on the next batch of ``data`` (Chainer's own updater)."""
    optimizer.setup(model)
    iterator = chainer.iterators.SerialIterator(data, batch, shuffle=False)
    updater = chainer.training.updaters.StandardUpdater(iterator, optimizer, device=device)

    def step():
        updater.update()
        return {}

    return step


def cnn_training(arch: str, batch: int, device, insize: int, classes: int, seed: int = 0):
    """One MomentumSGD update of ``arch`` on synthetic ImageNet-shaped data."""
    model = ARCHS[arch](n_classes=classes)
    model.to_device(device)
    optimizer = chainer.optimizers.MomentumSGD(lr=0.01, momentum=0.9)
    data = train_imagenet.SyntheticImageNet(batch, insize, classes, seed)
    step = update_step(model, optimizer, data, batch, device)
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


def densenet_training(batch: int, device, recompute: bool, sizes, seed: int = 0):
    """One MomentumSGD update of ``examples/densenet.py``'s DenseNet-BC, under both pools."""
    depth, growth_rate, insize, classes = sizes
    np.random.seed(seed)  # the same weights with and without recomputation
    model = densenet_example.DenseNetBC(depth, growth_rate, classes, recompute)
    model.to_device(device)
    optimizer = chainer.optimizers.MomentumSGD(lr=0.1, momentum=0.9)
    data = densenet_example.synthetic_cifar(batch, insize, classes, seed)
    step = update_step(model, optimizer, data, batch, device)
    metadata = {"model": f"densenet-bc-{depth}", "depth": depth, "growth_rate": growth_rate,
                "kind": "training", "batch_size": batch, "input_size": insize,
                "classes": classes, "optimizer": "MomentumSGD(lr=0.1, momentum=0.9)",
                "recompute": recompute}
    if recompute:
        metadata["recomputed"] = densenet_example.RECOMPUTED
    name = f"densenet-bc{depth}-k{growth_rate}-train-b{batch}-recompute-" \
           f"{'on' if recompute else 'off'}"
    return Workload(name, metadata, step, pools=("stock", "pgmo"))


# ------------------------------------------------------------------ the dry run
def pool_defaults() -> dict:
    """The pool's own defaults for the options ``pgmo.testing``'s host pools set otherwise.

    The host pools plan at the boundary (``replan="sync"``) for reproducible
    tests; a dry run must behave as the pool does on a GPU (``"background"``).
    """
    from pgmo.engine import PoolOptions
    from pgmo.measure.hosts import TEST_DEFAULTS

    defaults = PoolOptions()
    return {key: getattr(defaults, key) if hasattr(defaults, key) else
            getattr(defaults.solver, key) for key in TEST_DEFAULTS}


def new_pool(device_id: int, **options):
    """A pgmo pool with its own defaults: CuPy's on a GPU, on host memory in a CPU dry run.

    Without the plan cache (``plan_cache=False`` unless given): each recording and
    measurement is a cold run, whatever ran before it on this machine."""
    options = {"plan_cache": False, **options}
    if device_id < 0:
        from pgmo.measure.hosts import host_pool

        return host_pool(**{**pool_defaults(), **options})
    return pgmo.ProfileGuidedMemoryPool(**options)


def mirror_for(device_id: int):
    """CPU dry run: NumPy arrays mirrored into CuPy's allocator; on a GPU, nothing to do."""
    return NumpyMirror() if device_id < 0 else contextlib.nullcontext()


# ------------------------------------------------------------------ provenance
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
