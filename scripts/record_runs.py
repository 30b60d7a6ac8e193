"""Record whole training runs of the real examples on the CPU, every array allocation included.

A footprint is a property of a whole run (weights, optimizer state, warm-up,
every iteration), so pgmo's footprint benchmark needs whole runs, not single
iterations.  Without a GPU, the examples run with Chainer on NumPy, and this
script records, from building the model on, the allocations a GPU would
make for the run's arrays into a :class:`pgmo.runs.RunRecorder`, with an
iteration mark around each optimizer update.  Two ways (``--capture``):

``mirror`` (default)
    :class:`scripts.numpy_mirror.NumpyMirror`: one request through CuPy's allocator
    (``cupy.cuda.alloc``; the recorder is installed there with
    ``cupy.cuda.set_allocator``) per array a function receives, returns or
    keeps, per parameter, gradient and optimizer state, plus the modelled
    temporaries of Chainer's GPU convolutions (im2col), each freed when its
    NumPy array dies.
``numpy``
    :class:`scripts.numpy_allocations.NumpyAllocations`: every NumPy data allocation
    and free, through NumPy's allocator handler (``numpy-allocator``): the
    temporaries of Chainer's CPU paths included, which are not the GPU's.

``python -m scripts.mirror_fidelity`` compares both with the H100 recordings of
2026-11-25; its table is kept in each run file's metadata (``--fidelity``).

    python -m scripts.record_runs --workload resnet50 --iterations 4 --out-dir pgmo/traces/runs
    python -m scripts.record_runs --workload seq2seq --iterations 30 --out-dir pgmo/traces/runs

Workloads: ``resnet50`` / ``alexnet`` / ``googlenet`` (``examples/train_imagenet.py``'s
models and synthetic data, MomentumSGD), ``densenet`` (``examples/densenet.py``'s
DenseNet-BC), ``seq2seq`` (``examples/seq2seq.py``: NStepLSTM encoder-decoder,
Adam, variable-length sentences of 1-50 words).  The datasets are built
before recording starts (on a GPU they live in host memory).
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import itertools
import json
import logging
import platform
import subprocess
import sys
import time
from pathlib import Path

from pgmo import programs

programs.start(__name__)  # Ctrl-C from here on: one line, exit status 130

import pgmo  # noqa: E402
import pgmo.chainer  # noqa: E402,F401  (the Chainer compatibility layer first)

import chainer  # noqa: E402
import numpy as np  # noqa: E402
from pgmo.runs import Run, RunRecorder, write_run  # noqa: E402

from .examples import load  # noqa: E402
from .numpy_mirror import NumpyMirror  # noqa: E402

#: The checkout whose commit the run files name.
ROOT = Path(__file__).resolve().parent.parent

log = logging.getLogger("record_runs")

#: Where each capture's requests come from, for the files' "recorded_by".
RECORDED_BY = {
    "mirror": "scripts/record_runs.py with scripts/numpy_mirror.py's NumpyMirror: the example "
              "run with Chainer on NumPy; one request through CuPy's allocator (the run "
              "recorder installed with cupy.cuda.set_allocator) per array a Chainer function "
              "receives, returns or keeps for backward, per parameter, gradient and optimizer "
              "state, plus the modelled im2col temporaries of Chainer's GPU convolutions "
              "(no cuDNN), each freed when its NumPy array dies; views count as their base. "
              "Not seen: arrays user code makes and never passes to a function, other "
              "temporaries inside functions, library workspaces (cuBLAS)",
    "numpy": "scripts/record_runs.py --capture numpy: the example run with Chainer on NumPy, "
             "every NumPy data allocation and free logged through NumPy's allocator handler "
             "(numpy-allocator); NumPy's scalar temporaries left out",
}


# ----------------------------------------------------------------- capture
class RecorderAllocator:
    """A CuPy allocator (``size -> MemoryPointer``) that logs into a RunRecorder.

    Each request gets a stand-in ``UnownedMemory`` at a fresh fake address,
    never touched; when CuPy's last reference to it dies, so does its owner,
    and that is the block's free, as with CuPy's own pools.
    """

    def __init__(self, recorder: RunRecorder):
        self.recorder = recorder
        self._addresses = itertools.count(1 << 40, 1 << 20)

    def malloc(self, nbytes: int):
        from cupy.cuda.memory import MemoryPointer, UnownedMemory

        owner = _Release(self.recorder, self.recorder.alloc(nbytes))
        return MemoryPointer(UnownedMemory(next(self._addresses), nbytes, owner, 0), 0)


class _Release:
    """Frees its handle in the recorder when it dies (with the block's memory object)."""

    __slots__ = ("recorder", "handle")

    def __init__(self, recorder: RunRecorder, handle: int):
        self.recorder, self.handle = recorder, handle

    def __del__(self):
        self.recorder.free(self.handle)


class MirrorCapture:
    """The mirror, requesting through CuPy's allocator, where the recorder is installed."""

    def __init__(self, recorder: RunRecorder):
        import cupy

        self.recorder = recorder
        self.mirror = NumpyMirror()
        self._stack = contextlib.ExitStack()
        self._stack.enter_context(cupy.cuda.using_allocator(RecorderAllocator(recorder).malloc))
        self._stack.enter_context(self.mirror)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._stack.close()

    def built(self, updater) -> None:
        """The model's parameters; then every batch the converter makes (on a GPU, the
        batch's device copy), whether or not a function ever receives all of it."""
        self.mirror.see_link(updater.get_optimizer("main").target)
        convert = updater.converter  # a new-style converter, as the examples' are

        @chainer.dataset.converter()
        def converter(batch, device):
            arrays = convert(batch, device)
            values = arrays.values() if isinstance(arrays, dict) else \
                arrays if isinstance(arrays, (tuple, list)) else (arrays,)
            for value in values:
                self.mirror.see(value if isinstance(value, (tuple, list)) else (value,),
                                "batch")
            return arrays

        updater.converter = converter

    def begin(self) -> None:
        self.recorder.begin()

    def end(self, updater) -> None:
        # gradients made by cleared-gradient reallocation, state made by the first update
        optimizer = updater.get_optimizer("main")
        self.mirror.see_link(optimizer.target)
        self.mirror.see_optimizer(optimizer)
        self.recorder.end()

    def facts(self) -> dict:
        return {"mirror_blocks": dict(self.mirror.counts)}


class NumpyCapture:
    """Every NumPy data allocation (``--capture numpy``)."""

    def __init__(self, recorder: RunRecorder):
        from .numpy_allocations import NumpyAllocations

        self.allocations = NumpyAllocations(recorder)

    def __enter__(self):
        self.allocations.__enter__()
        return self

    def __exit__(self, *exc):
        self.allocations.__exit__(*exc)

    def built(self, updater) -> None:
        pass

    def begin(self) -> None:
        self.allocations.begin()

    def end(self, updater) -> None:
        self.allocations.end()

    def facts(self) -> dict:
        return {"scalars_left_out": self.allocations.scalars}


CAPTURES = {"mirror": MirrorCapture, "numpy": NumpyCapture}


# --------------------------------------------------------------- workloads
def _updater(model, optimizer, data, batch: int, **iterator_options):
    optimizer.setup(model)
    converter = iterator_options.pop("converter", chainer.dataset.concat_examples)
    iterator = chainer.iterators.SerialIterator(data, batch, **iterator_options)
    return chainer.training.updaters.StandardUpdater(iterator, optimizer, converter=converter,
                                                     device=-1)


def imagenet_workload(arch: str, batch: int, insize: int | None, classes: int, seed: int):
    """(setup, facts) for ``examples/train_imagenet.py``'s ``arch``, as it trains."""
    train_imagenet = load("train_imagenet")
    archs = load("models").ARCHS

    size = insize or archs[arch].insize
    data = train_imagenet.SyntheticImageNet(batch, size, classes, seed)  # host data, untraced

    def setup():
        np.random.seed(seed)
        return _updater(archs[arch](n_classes=classes),
                        chainer.optimizers.MomentumSGD(lr=0.01, momentum=0.9), data, batch,
                        shuffle=False)

    facts = {"model": arch, "kind": "training", "batch_size": batch, "input_size": size,
             "classes": classes, "optimizer": "MomentumSGD(lr=0.01, momentum=0.9)"}
    return setup, facts


def densenet_workload(batch: int, seed: int, depth: int = 100, growth: int = 12,
                      insize: int = 32, recompute: bool = False):
    """(setup, facts) for ``examples/densenet.py``'s DenseNet-BC (``recompute``: its
    bottlenecks under ``F.forget``)."""
    densenet = load("densenet")
    data = densenet.synthetic_cifar(batch, insize, 10, seed)

    def setup():
        np.random.seed(seed)
        return _updater(densenet.DenseNetBC(depth, growth, 10, recompute),
                        chainer.optimizers.MomentumSGD(lr=0.1, momentum=0.9), data, batch,
                        shuffle=False)

    facts = {"model": f"densenet-bc-{depth}", "growth_rate": growth, "kind": "training",
             "batch_size": batch, "input_size": insize, "classes": 10, "recompute": recompute,
             "optimizer": "MomentumSGD(lr=0.1, momentum=0.9)"}
    return setup, facts


def seq2seq_workload(batch: int, vocab: int, units: int, layers: int, sentences: int,
                     seed: int):
    """(setup, facts) for ``examples/seq2seq.py``: shuffled batches of 1-50-word sentences."""
    seq2seq = load("seq2seq")
    pairs = seq2seq.synthetic_pairs(sentences, vocab, 1, 50, seed)  # host data, untraced

    def setup():
        np.random.seed(seed)
        order = chainer.iterators.ShuffleOrderSampler(np.random.RandomState(seed))
        return _updater(seq2seq.Seq2seq(vocab, units, layers), chainer.optimizers.Adam(),
                        pairs, batch, order_sampler=order, converter=seq2seq.convert_pairs)

    facts = {"model": "seq2seq", "kind": "training", "batch_size": batch, "vocab": vocab,
             "units": units, "layers": layers, "sentence_words": "1-50",
             "sentences": sentences, "optimizer": "Adam()"}
    return setup, facts


# --------------------------------------------------------------- recording
def record(setup, iterations: int, capture: str = "mirror",
           on_iteration=None) -> tuple[Run, dict]:
    """Build the model and train ``iterations`` updates, every allocation recorded.

    As Chainer's Trainer does, each update reports into a fresh observation
    that lives until the next update begins (the loss outlives its
    iteration).  The run is taken when training ends, with the model alive:
    its weights, gradients and optimizer state are never freed (open), as in
    a training process that ends there.  Returns the run and facts about the
    capture.
    """
    rec = RunRecorder()
    with CAPTURES[capture](rec) as captured:
        updater = setup()
        captured.built(updater)
        observation: dict = {}
        reporter = chainer.Reporter()
        reporter.add_observer("main", updater.get_optimizer("main").target)
        for k in range(iterations):
            observation = {}  # the last update's loss dies here, between iterations
            captured.begin()
            started = time.perf_counter()
            with reporter.scope(observation):
                updater.update()
            captured.end(updater)
            if on_iteration is not None:
                on_iteration(k, time.perf_counter() - started)
        del observation
        gc.collect()  # what the last update left in reference cycles
        run = rec.run()
        del updater
    return run, captured.facts()


def commit() -> str | None:
    """The checkout's git commit (a '+' when it has changes), or None outside git."""
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--",
                                "scripts", "examples", "pgmo", ":(exclude)pgmo/traces"],
                               capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+" if dirty else "")


def provenance(facts: dict, capture: str, fidelity: dict | None, code: str | None) -> dict:
    """What the run file says about itself; ``code``: :func:`commit` when recording began."""
    meta = {
        **facts,
        "capture": capture,
        "recorded_by": RECORDED_BY[capture],
        "command": " ".join(["record_runs.py", *sys.argv[1:]]),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": f"CPU (NumPy {np.__version__}, {platform.machine()}); sizes as CuPy would "
                  f"allocate them on a GPU",
        "pgmo": pgmo.__version__, "pgmo_commit": code, "chainer": chainer.__version__,
        "numpy": np.__version__, "python": platform.python_version(),
        "synthetic": False, "measured_on_gpu": False,
        "note": "A CPU recording of the real example's array allocations (Chainer on NumPy), "
                "not a GPU measurement: each block is the bytes of an array the GPU run would "
                "allocate through CuPy, alive as long as that array lived on the CPU. The "
                "input batch is one array (on a GPU: a host array and its device copy); the "
                "dataset is not recorded (host memory on a GPU). See 'recorded_by' for what "
                "is and is not seen, and 'fidelity' for how close this capture came to the "
                "H100 recordings of 2026-11-25.",
    }
    if fidelity is not None:
        meta["fidelity"] = fidelity
    return meta


def parse_args(argv=None):
    parser = programs.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", nargs="+", required=True,
                        choices=("resnet50", "alexnet", "googlenet", "densenet", "seq2seq"))
    parser.add_argument("--capture", choices=sorted(CAPTURES), default="mirror")
    parser.add_argument("--iterations", type=int, help="updates (default: 4, seq2seq 30)")
    parser.add_argument("--batchsize", type=int, help="default: 32 (ImageNet CNNs), 64 "
                                                      "(seq2seq, DenseNet-BC)")
    parser.add_argument("--insize", type=int, help="CNN input size (default: the model's; "
                                                   "DenseNet-BC 32)")
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--depth", type=int, default=100, help="DenseNet-BC depth")
    parser.add_argument("--growth-rate", type=int, default=12, help="DenseNet-BC growth rate")
    parser.add_argument("--recompute", action="store_true",
                        help="DenseNet-BC: recompute each bottleneck in backward (F.forget)")
    parser.add_argument("--vocab", type=int, default=40000)
    parser.add_argument("--units", type=int, default=512)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--sentences", type=int, default=10000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--name", help="file name stem (default: from the workload)")
    parser.add_argument("--fidelity", type=programs.existing_path("file"),
                        help="JSON table from scripts.mirror_fidelity, kept in the metadata")
    parser.add_argument("--out-dir", type=programs.output_folder, default=Path("."),
                        help="folder for the run files, made if new")
    args = parser.parse_args(argv)
    for name in ("iterations", "batchsize", "insize", "classes", "depth", "growth_rate",
                 "vocab", "units", "layers", "sentences"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be positive, got {value}")
    if args.name and len(args.workload) > 1:
        parser.error("--name names one workload's file")
    return args


def workload(args, name: str):
    """(setup, facts, batch, iterations, default file stem) of workload ``name``."""
    if name == "seq2seq":
        batch, iterations = args.batchsize or 64, args.iterations or 30
        setup, facts = seq2seq_workload(batch, args.vocab, args.units, args.layers,
                                        args.sentences, args.seed)
        return setup, facts, f"seq2seq-train-b{batch}-{iterations}batches-cpu", iterations
    iterations = args.iterations or 4
    if name == "densenet":
        batch = args.batchsize or 64
        setup, facts = densenet_workload(batch, args.seed, args.depth, args.growth_rate,
                                         args.insize or 32, args.recompute)
        stem = f"densenet-bc{args.depth}-k{args.growth_rate}-train-b{batch}" \
            f"{'-recompute' if args.recompute else ''}"
    else:
        batch = args.batchsize or 32
        setup, facts = imagenet_workload(name, batch, args.insize, args.classes, args.seed)
        stem = f"{name}-train-b{batch}"
    return setup, facts, f"{stem}-{iterations}it-cpu" if iterations != 4 else f"{stem}-cpu", \
        iterations


def main(argv=None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    args = parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    fidelity = json.loads(args.fidelity.read_text()) if args.fidelity else None
    code = commit()
    for name in args.workload:
        setup, facts, stem, iterations = workload(args, name)
        stem = args.name or stem
        started = time.perf_counter()
        run, captured = record(setup, iterations, args.capture,
                               lambda k, s: log.info("%s: iteration %d in %.1f s", stem, k + 1, s))
        seconds = round(time.perf_counter() - started, 1)
        meta = {**provenance(facts, args.capture, fidelity, code), **captured,
                "seconds": seconds}
        run = Run(run.trace.with_metadata(**meta), run.iterations)
        path = args.out_dir / f"{stem}.run.json.gz"
        write_run(run, path)
        log.info("%s: %d requests, %d iterations, lower bound %.1f MiB, long-lived %.1f MiB, "
                 "%.0f s -> %s (%d bytes)", stem, len(run), len(run.iterations),
                 run.lower_bound() / 2 ** 20, run.long_lived_bytes() / 2 ** 20, seconds, path,
                 path.stat().st_size)
    return 0


if __name__ == "__main__":
    sys.exit(programs.run(main))
