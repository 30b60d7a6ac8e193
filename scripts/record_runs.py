#!/usr/bin/env python
"""Record whole training runs of the real examples on the CPU, every array allocation included.

A footprint is a property of a whole run (weights, optimizer state, warm-up,
every iteration), so pgmo's footprint benchmark needs whole runs, not single
iterations.  Without a GPU, the examples run with Chainer on NumPy, and this
script records every allocation NumPy makes for an array's data, from
building the model on: NumPy's data allocator is replaced for the process
(NumPy's ``PyDataMem_SetHandler``, through the ``numpy-allocator`` package)
by one that logs each allocation and free into a :class:`pgmo.runs.RunRecorder`,
with an iteration mark around each optimizer update.  On a GPU, the same
arrays are CuPy arrays that CuPy's allocator serves, with the same sizes.

What differs from a GPU run, and is said in each file's metadata: the
temporaries inside functions are NumPy's (Chainer's CPU paths; on a GPU
without cuDNN, Chainer's GPU paths use the same im2col and tensordot
algorithms with CuPy's temporaries, which differ in detail), less NumPy's
scalar temporaries, which CuPy does not allocate (left out, counted); the input batch
is one array instead of a host array and its device copy; nothing is
recorded from libraries outside NumPy.  The datasets are built before
recording starts (on a GPU they live in host memory).

    python scripts/record_runs.py --workload resnet50 seq2seq --out-dir pgmo/traces/runs
    python scripts/record_runs.py --workload alexnet --iterations 2 --batchsize 32  # fidelity

Workloads: ``resnet50`` / ``alexnet`` / ``googlenet`` (``examples/train_imagenet.py``'s
models and synthetic data, MomentumSGD), ``densenet`` (``examples/densenet.py``'s
DenseNet-BC), ``seq2seq`` (``examples/seq2seq.py``: NStepLSTM encoder-decoder,
Adam, variable-length sentences).
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import logging
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))

import pgmo  # noqa: E402
import pgmo.chainer  # noqa: E402,F401  (the Chainer compatibility layer first)

import chainer  # noqa: E402
import numpy as np  # noqa: E402

from pgmo.runs import Run, RunRecorder, write_run  # noqa: E402

log = logging.getLogger("record_runs")

#: NumPy's scalar temporaries are at most this many bytes (see NumpyAllocations.apply).
SCALAR = 64


class NumpyAllocations:
    """NumPy's data allocator, replaced while active by one that logs into a RunRecorder.

    Each callback only appends to a list (an allocation can happen anywhere,
    a free inside the garbage collector); :meth:`apply` turns the list into
    the recorder's events, outside NumPy.  Arrays made while active are freed
    through this allocator wherever they die, as NumPy keeps each array's
    allocator with it.
    """

    def __init__(self, recorder: RunRecorder):
        import numpy_allocator

        self.recorder = recorder
        self.events: list[tuple[int, int, int]] = []  # (1 alloc / 0 free, address, size)
        self.scalars = 0  # scalar temporaries left out (see apply)
        self.handles: dict[int, int] = {}
        libc = ctypes.CDLL(None)
        for name, res, args in (("malloc", ctypes.c_void_p, [ctypes.c_size_t]),
                                ("calloc", ctypes.c_void_p, [ctypes.c_size_t] * 2),
                                ("realloc", ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_size_t]),
                                ("free", None, [ctypes.c_void_p])):
            getattr(libc, name).restype, getattr(libc, name).argtypes = res, args
        events = self.events

        @ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_size_t)
        def malloc(size):
            ptr = libc.malloc(size)
            if ptr:
                events.append((1, ptr, size))
            return ptr

        @ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t)
        def calloc(nelem, elsize):
            ptr = libc.calloc(nelem, elsize)
            if ptr:
                events.append((1, ptr, nelem * elsize))
            return ptr

        @ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
        def realloc(ptr, size):
            new = libc.realloc(ptr, size)
            if new:
                if ptr:
                    events.append((0, ptr, 0))
                events.append((1, new, size))
            return new

        @ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_size_t)
        def free(ptr, size):
            if ptr:
                events.append((0, ptr, size))
            libc.free(ptr)

        class Logging(metaclass=numpy_allocator.type):
            _malloc_, _calloc_, _realloc_, _free_ = malloc, calloc, realloc, free

        self.allocator = Logging
        self._keep = (malloc, calloc, realloc, free)  # the C callbacks must outlive it

    def __enter__(self):
        self.allocator.__enter__()
        return self

    def __exit__(self, *exc):
        self.allocator.__exit__(*exc)
        self.apply()

    def begin(self) -> None:
        """An iteration starts now (after what was allocated and freed so far)."""
        self.apply()
        self.recorder.begin()

    def end(self) -> None:
        self.apply()
        self.recorder.end()

    def apply(self) -> None:
        """Log the allocations and frees so far on the run's event clock, in order.

        NumPy's scalar temporaries (:data:`SCALAR` bytes at most, freed within
        two events) are left out and counted: on a GPU CuPy passes scalars to
        its kernels as arguments, with no allocation.
        """
        events, self.events[:] = list(self.events), []
        rec, handles = self.recorder, self.handles
        skip = set()
        for k, (alloc, ptr, size) in enumerate(events):
            if alloc and 0 < size <= SCALAR:
                for j in range(k + 1, min(k + 4, len(events))):
                    if events[j][0] == 0 and events[j][1] == ptr:
                        skip.update((k, j))
                        self.scalars += 1
                        break
        for k, (alloc, ptr, size) in enumerate(events):
            if k in skip:
                continue
            if alloc:
                if size:
                    handles[ptr] = rec.alloc(size)
            else:
                handle = handles.pop(ptr, None)
                if handle is not None:  # a zero-size one, or made before recording
                    rec.free(handle)


def imagenet_workload(arch: str, batch: int, insize: int | None, classes: int, seed: int):
    """(setup, step) for ``examples/train_imagenet.py``'s ``arch``, as it trains."""
    import train_imagenet
    from models import ARCHS

    size = insize or ARCHS[arch].insize
    data = train_imagenet.SyntheticImageNet(batch, size, classes, seed)  # host data, untraced

    def setup():
        np.random.seed(seed)
        model = ARCHS[arch](n_classes=classes)
        optimizer = chainer.optimizers.MomentumSGD(lr=0.01, momentum=0.9)
        optimizer.setup(model)
        iterator = chainer.iterators.SerialIterator(data, batch, shuffle=False)
        return chainer.training.updaters.StandardUpdater(iterator, optimizer, device=-1)

    facts = {"model": arch, "kind": "training", "batch_size": batch, "input_size": size,
             "classes": classes, "optimizer": "MomentumSGD(lr=0.01, momentum=0.9)"}
    return setup, facts


def densenet_workload(batch: int, seed: int, depth: int = 100, growth: int = 12):
    import densenet

    data = densenet.synthetic_cifar(batch, 32, 10, seed)

    def setup():
        np.random.seed(seed)
        model = densenet.DenseNetBC(depth, growth, 10, False)
        optimizer = chainer.optimizers.MomentumSGD(lr=0.1, momentum=0.9)
        optimizer.setup(model)
        iterator = chainer.iterators.SerialIterator(data, batch, shuffle=False)
        return chainer.training.updaters.StandardUpdater(iterator, optimizer, device=-1)

    facts = {"model": f"densenet-bc-{depth}", "growth_rate": growth, "kind": "training",
             "batch_size": batch, "input_size": 32, "classes": 10,
             "optimizer": "MomentumSGD(lr=0.1, momentum=0.9)"}
    return setup, facts


def seq2seq_workload(batch: int, vocab: int, units: int, layers: int, sentences: int,
                     seed: int):
    import seq2seq

    pairs = seq2seq.synthetic_pairs(sentences, vocab, 1, 50, seed)  # host data, untraced

    def setup():
        np.random.seed(seed)
        model = seq2seq.Seq2seq(vocab, units, layers)
        optimizer = chainer.optimizers.Adam()
        optimizer.setup(model)
        order = chainer.iterators.ShuffleOrderSampler(np.random.RandomState(seed))
        iterator = chainer.iterators.SerialIterator(pairs, batch, order_sampler=order)
        return chainer.training.updaters.StandardUpdater(
            iterator, optimizer, converter=seq2seq.convert_pairs, device=-1)

    facts = {"model": "seq2seq", "kind": "training", "batch_size": batch, "vocab": vocab,
             "units": units, "layers": layers, "sentence_words": "1-50",
             "optimizer": "Adam()"}
    return setup, facts


def record(setup, iterations: int, on_iteration=None) -> tuple[RunRecorder, int]:
    """Build the model and train ``iterations`` updates, every NumPy allocation recorded.

    As Chainer's Trainer does, each update reports into a fresh observation
    that lives until the next update begins (the loss outlives its iteration).
    """
    rec = RunRecorder()
    with NumpyAllocations(rec) as allocations:
        updater = setup()
        observation: dict = {}
        reporter = chainer.Reporter()
        reporter.add_observer("main", updater.get_optimizer("main").target)
        for k in range(iterations):
            observation = {}  # the last update's loss dies here, between iterations
            allocations.begin()
            started = time.perf_counter()
            with reporter.scope(observation):
                updater.update()
            allocations.end()
            if on_iteration is not None:
                on_iteration(k, time.perf_counter() - started)
        del updater, observation
    return rec, allocations.scalars


def provenance(name: str, facts: dict, args) -> dict:
    return {
        **facts,
        "recorded_by": "scripts/record_runs.py: the example run with Chainer on NumPy, every "
                       "NumPy data allocation and free logged through NumPy's allocator "
                       "handler (numpy-allocator), an iteration mark around each update",
        "command": " ".join(["record_runs.py", *sys.argv[1:]]),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": f"CPU ({platform.machine()}), NumPy {np.__version__}",
        "pgmo": pgmo.__version__, "chainer": chainer.__version__, "numpy": np.__version__,
        "python": platform.python_version(),
        "synthetic": False, "measured_on_gpu": False,
        "note": "A CPU recording of the real example's array allocations, not a GPU "
                "measurement: function temporaries are NumPy's (Chainer's CPU code paths), "
                "NumPy's scalar temporaries (64 B at most, freed at once) are left out (CuPy "
                "passes scalars to kernels), the input batch is one array (on a GPU: a host "
                "array and its device copy), the dataset is not recorded (host memory on a "
                "GPU).",
    }


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", nargs="+", required=True,
                        choices=("resnet50", "alexnet", "googlenet", "densenet", "seq2seq"))
    parser.add_argument("--iterations", type=int, help="updates (default: 4, seq2seq 30)")
    parser.add_argument("--batchsize", type=int, help="default: 32 (CNNs), 64 (seq2seq, "
                                                      "DenseNet-BC)")
    parser.add_argument("--insize", type=int, help="CNN input size (default: the model's)")
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--vocab", type=int, default=40000)
    parser.add_argument("--units", type=int, default=512)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--sentences", type=int, default=10000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out-dir", type=Path, default=Path("."))
    args = parser.parse_args(argv)
    for name in ("iterations", "batchsize", "insize", "classes", "vocab", "units", "layers",
                 "sentences"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name} must be positive, got {value}")
    return args


def main(argv=None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    args = parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for workload in args.workload:
        if workload == "seq2seq":
            batch = args.batchsize or 64
            iterations = args.iterations or 30
            setup, facts = seq2seq_workload(batch, args.vocab, args.units, args.layers,
                                            args.sentences, args.seed)
        elif workload == "densenet":
            batch, iterations = args.batchsize or 64, args.iterations or 4
            setup, facts = densenet_workload(batch, args.seed)
        else:
            batch, iterations = args.batchsize or 32, args.iterations or 4
            setup, facts = imagenet_workload(workload, batch, args.insize, args.classes,
                                             args.seed)
        name = f"{workload}-train-b{batch}-{iterations}it-cpu"
        started = time.perf_counter()
        rec, scalars = record(setup, iterations,
                              lambda k, s: log.info("%s: iteration %d in %.1f s", name, k + 1, s))
        run: Run = rec.run(**provenance(name, facts, args), scalars_left_out=scalars,
                           seconds=round(time.perf_counter() - started, 1))
        path = args.out_dir / f"{name}.run.json.gz"
        write_run(run, path)
        log.info("%s: %d requests, %d iterations, physical limit %.1f MiB, long-lived %.1f "
                 "MiB -> %s", name, len(run), len(run.iterations),
                 run.lower_bound_rounded() / 2 ** 20, run.long_lived_bytes() / 2 ** 20, path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
