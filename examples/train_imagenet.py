#!/usr/bin/env python
"""The paper's CNN experiments: memory and speed of CuPy's pool vs pgmo.

Trains (or, with ``--inference``, runs forward passes at batch 1 of) AlexNet,
GoogLeNet, ResNet-50 or Inception-ResNet-v2 on synthetic ImageNet-shaped data,
and prints for every iteration the bytes held by the memory pools, the device
memory in use and the time, then a summary table::

    python examples/train_imagenet.py --arch resnet50 --pool stock pgmo --device 0
    python examples/train_imagenet.py --arch googlenet --inference --device 0
    python examples/train_imagenet.py --arch alexnet --device -1 --insize 64 \\
        --batchsize 2 --iterations 2 --classes 10         # CPU smoke run

Training goes through Chainer's Trainer with the ``pgmo.chainer``
extension, so each update is one pgmo iteration.  Several ``--arch`` and
``--pool`` values run one after another in this process; for the cleanest
device-memory numbers run one configuration per process.
"""

import argparse
import contextlib
import logging
import os
import sys
import tempfile

from pgmo import programs

programs.start(__name__)  # Ctrl-C from here on: one line, exit status 130
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import pgmo.chainer  # noqa: E402  (applies the Chainer compatibility layer first)

import chainer  # noqa: E402
import numpy as np  # noqa: E402
from chainer import training  # noqa: E402

from measure import (  # noqa: E402
    NA, add_pgmo_options, make_pool, mib, mode_text, pgmo_options, print_table, Recorder,
    add_device_option, pick_device, release_cached, require_positive, use_device,
)
from models import ARCHS  # noqa: E402


class SyntheticImageNet(chainer.dataset.DatasetMixin):
    """Random images of shape (3, insize, insize) and labels, fixed by a seed."""

    def __init__(self, size, insize, n_classes, seed=0):
        rng = np.random.default_rng(seed)
        self.images = rng.standard_normal((size, 3, insize, insize), dtype=np.float32)
        self.labels = rng.integers(0, n_classes, size).astype(np.int32)

    def __len__(self):
        return len(self.labels)

    def get_example(self, i):
        return self.images[i], self.labels[i]


class IterationMeter(training.Extension):
    """Print one line per iteration: loss, pool bytes, device memory, time."""

    trigger = 1, "iteration"
    priority = training.PRIORITY_READER

    def __init__(self, recorder):
        self.recorder = recorder

    def initialize(self, trainer):
        self.recorder.start()

    def __call__(self, trainer):
        seconds, held, used = self.recorder.record()
        loss = float(trainer.observation["main/loss"].array)
        mode = mode_text(self.recorder.pool, self.recorder.device_id)
        print(f"  iter {trainer.updater.iteration:4d}  loss {loss:8.4f}  "
              f"{mode:10s}  pools {mib(held):>14s}  "
              f"device {mib(used):>14s}  {1e3 * seconds:9.1f} ms", flush=True)


def run_training(args, model, data, lr, pool_name, device, extensions=()):
    """``args.iterations`` SGD updates of ``model`` on ``data``, under pgmo or the stock pool.

    Every line printed and every number measured comes from the returned
    ``(pool, recorder)``; ``extensions`` run after the meter (a loss log, say).
    """
    optimizer = chainer.optimizers.MomentumSGD(lr=lr, momentum=0.9)
    optimizer.setup(model)
    iterator = chainer.iterators.SerialIterator(data, args.batchsize, shuffle=False)
    updater = training.updaters.StandardUpdater(iterator, optimizer, device=device)
    pool = make_pool(args.device, **pgmo_options(args)) if pool_name == "pgmo" else None
    recorder = Recorder(args.device, pool)
    with tempfile.TemporaryDirectory() as out:
        trainer = training.Trainer(updater, (args.iterations, "iteration"), out=out)
        if pool is not None:
            trainer.extend(pgmo.chainer.ProfileGuidedMemory(pool))
        trainer.extend(IterationMeter(recorder))
        for extension in extensions:
            trainer.extend(extension)
        trainer.run()
    return pool, recorder


def train(args, arch, pool_name, device):
    """Train ``arch`` for ``args.iterations`` updates; return the summary row."""
    model = ARCHS[arch](n_classes=args.classes)
    model.to_device(device)
    data = SyntheticImageNet(args.batchsize, args.insize, args.classes, args.seed)
    _, recorder = run_training(args, model, data, 0.01, pool_name, device)
    return summary_row(arch, pool_name, "train", args.batchsize, recorder)


def infer(args, arch, pool_name, device):
    """Run ``args.iterations`` forward passes at batch 1; return the summary row."""
    model = ARCHS[arch](n_classes=args.classes)
    model.to_device(device)
    image, _ = SyntheticImageNet(1, args.insize, args.classes, args.seed)[0]
    pool = make_pool(args.device, **pgmo_options(args)) if pool_name == "pgmo" else None
    recorder = Recorder(args.device, pool)
    with (pool if pool is not None else contextlib.nullcontext()), \
            chainer.using_config("train", False), chainer.no_backprop_mode():
        recorder.start()
        for i in range(1, args.iterations + 1):
            with (pool.iteration() if pool is not None else contextlib.nullcontext()):
                scores = model.forward(device.send(image[None]))
                label = int(chainer.backends.cuda.to_cpu(scores.array).argmax())
                del scores  # nothing allocated in the iteration outlives it
            seconds, held, used = recorder.record()
            mode = mode_text(pool, args.device)
            print(f"  iter {i:4d}  class {label:4d}  {mode:10s}  pools {mib(held):>14s}  "
                  f"device {mib(used):>14s}  {1e3 * seconds:9.1f} ms", flush=True)
    return summary_row(arch, pool_name, "inference", 1, recorder)


SUMMARY_COLUMNS = ("arch", "pool", "task", "batch", "iters", "peak pool bytes",
                   "peak device in use", "ms/iter", "pgmo mode", "fallback reqs")


def summary_row(arch, pool_name, task, batch, recorder):
    stats = recorder.pool.stats() if recorder.pool is not None and recorder.device_id >= 0 \
        else None
    cpu_pgmo = NA if recorder.pool is not None and recorder.device_id < 0 else "-"
    return (arch, pool_name, task, batch, recorder.iterations,
            recorder.peak_text(recorder.peak_pool), recorder.peak_text(recorder.peak_device),
            f"{recorder.watch.steady_ms():.1f}",
            stats.mode if stats else cpu_pgmo,
            stats.departed_requests if stats else cpu_pgmo)


def parse_args(argv=None):
    parser = programs.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", nargs="+", choices=sorted(ARCHS), default=["resnet50"])
    parser.add_argument("--pool", nargs="+", choices=("stock", "pgmo"), default=["pgmo"],
                        help="CuPy's own pool, pgmo's, or both one after the other")
    parser.add_argument("--batchsize", "-b", type=int, default=32)
    parser.add_argument("--iterations", "-i", type=int, default=10)
    parser.add_argument("--inference", action="store_true",
                        help="forward passes only, at batch size 1")
    add_device_option(parser)
    parser.add_argument("--insize", type=int, default=None,
                        help="image size (default: the model's published size)")
    parser.add_argument("--classes", type=int, default=1000)
    add_pgmo_options(parser)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    require_positive(parser, args, ("batchsize", "iterations", "classes"))
    if args.insize is not None:
        for arch in args.arch:
            if args.insize < ARCHS[arch].min_insize:
                parser.error(f"--insize {args.insize} is too small for {arch} "
                             f"(at least {ARCHS[arch].min_insize})")
    return args


def main(argv=None):
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    args = parse_args(argv)
    pick_device(args)
    device = use_device(args.device)
    rows = []
    for arch in args.arch:
        for pool_name in args.pool:
            insize = args.insize or ARCHS[arch].insize
            run_args = argparse.Namespace(**{**vars(args), "insize": insize})
            task = "inference" if args.inference else "train"
            print(f"\n{arch}, {task}, pool {pool_name}, batch "
                  f"{1 if args.inference else args.batchsize}, {insize}x{insize}", flush=True)
            run = infer if args.inference else train
            rows.append(run(run_args, arch, pool_name, device))
            release_cached(args.device)
    print_table("Summary (peaks: the most at an iteration's end, every iteration counted; "
                "ms/iter: median after the first iteration)", SUMMARY_COLUMNS, rows)


if __name__ == "__main__":
    sys.exit(programs.run(main))
