#!/usr/bin/env python
"""DenseNet-BC with and without recomputation, with CuPy's pool or pgmo.

A DenseNet-BC (Huang et al., 2017) on synthetic CIFAR-shaped data, trained
through Chainer's Trainer with the ``pgmo.chainer`` extension.  With
``--recompute on`` each dense layer's bottleneck (concatenation, batch
normalization, ReLU and the 1x1 convolution) runs under Chainer's
``F.forget``: its outputs are dropped after the forward pass and computed again
in backward, as in Pleiss et al., *Memory-efficient implementation of
DenseNets* (2017).  Recomputation cuts what the graph keeps; pgmo cuts what
the pool reserves around it; the summary shows both, one run per
combination::

    python examples/densenet.py --recompute off on --pool stock pgmo --device 0
    python examples/densenet.py --device -1 --depth 10 --growth-rate 4 --insize 8 \\
        --batchsize 2 --iterations 2 --recompute off on      # CPU smoke run

Runs with the same ``--seed`` start from the same weights and data, so
``--recompute off`` and ``on`` compute the same losses (the summary's last
column; on a GPU to within rounding, as some cuDNN kernels are not
deterministic).  ``python -m scripts.record_traces --densenet B`` records
one iteration of each combination as a trace, and ``python -m
scripts.recompute_table`` compares them.
"""

import logging
import os
import sys

from pgmo import programs

programs.start(__name__)  # Ctrl-C from here on: one line, exit status 130
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import pgmo.chainer  # noqa: E402,F401  (applies the Chainer compatibility layer first)

import chainer  # noqa: E402
import chainer.functions as F  # noqa: E402
import chainer.links as L  # noqa: E402
import numpy as np  # noqa: E402
from chainer import training  # noqa: E402

from measure import (  # noqa: E402
    NA, add_device_option, add_pgmo_options, pick_device, print_table, release_cached,
    require_positive, use_device,
)
from train_imagenet import run_training  # noqa: E402

#: What ``--recompute on`` forgets in each dense layer (and trace metadata says).
RECOMPUTED = ("each dense layer's bottleneck (concatenation, batch normalization, ReLU, "
              "1x1 convolution) under chainer.functions.forget")


class DenseLayer(chainer.Chain):
    """BN-ReLU-Conv1x1 (the bottleneck, ``4 * growth_rate`` channels), BN-ReLU-Conv3x3.

    The bottleneck's input is the concatenation of every earlier feature map
    of the block, so its concatenation, normalization and ReLU outputs grow
    with depth: kept for backward, they make memory quadratic in the number of
    layers.  With ``recompute`` the whole bottleneck runs under ``F.forget``,
    which keeps only its inputs (the feature maps, kept anyway) and its small
    output.  The 1x1 convolution is inside because it keeps its input (the
    ReLU output, as large as the concatenation) for its weight gradient; left
    outside, that copy would stay.

    ``L.BatchNormalization`` updates its running statistics only in the first
    forward pass, not in ``F.forget``'s recomputation
    (``chainer.config.in_recomputing``), so both variants train the same.
    """

    def __init__(self, in_channels, growth_rate, recompute=False, bottleneck_width=4):
        super().__init__()
        self.recompute = recompute
        width = bottleneck_width * growth_rate
        with self.init_scope():
            self.norm1 = L.BatchNormalization(in_channels)
            self.conv1 = L.Convolution2D(in_channels, width, 1, nobias=True)
            self.norm2 = L.BatchNormalization(width)
            self.conv2 = L.Convolution2D(width, growth_rate, 3, pad=1, nobias=True)

    def bottleneck(self, *features):
        return self.conv1(F.relu(self.norm1(F.concat(features, axis=1))))

    def forward(self, features):
        """The new feature map (``growth_rate`` channels) from the list of earlier ones."""
        if self.recompute:
            h = F.forget(self.bottleneck, *features)
        else:
            h = self.bottleneck(*features)
        return self.conv2(F.relu(self.norm2(h)))


class Transition(chainer.Chain):
    """BN-ReLU-Conv1x1 halving the channels (the "C" in BC), then 2x2 average pooling."""

    def __init__(self, in_channels, out_channels):
        super().__init__()
        with self.init_scope():
            self.norm = L.BatchNormalization(in_channels)
            self.conv = L.Convolution2D(in_channels, out_channels, 1, nobias=True)

    def forward(self, x):
        return F.average_pooling_2d(self.conv(F.relu(self.norm(x))), 2)


class DenseNetBC(chainer.Chain):
    """DenseNet-BC for CIFAR-sized images: a 3x3 stem, three dense blocks, a classifier.

    ``depth`` counts the convolutions and the classifier as the paper does:
    ``(depth - 4) / 6`` dense layers per block (DenseNet-BC-100: 16).
    """

    def __init__(self, depth=100, growth_rate=12, n_classes=10, recompute=False,
                 compression=0.5):
        super().__init__()
        if depth < 10 or (depth - 4) % 6:
            raise ValueError(f"depth must be 6 n + 4 with n >= 1 (10, 16, ..., 100), got {depth}")
        self.recompute = recompute
        self.layers_per_block = (depth - 4) // 6
        channels = 2 * growth_rate
        with self.init_scope():
            self.stem = L.Convolution2D(3, channels, 3, pad=1, nobias=True)
            self.blocks = chainer.ChainList()
            self.transitions = chainer.ChainList()
            for b in range(3):
                block = chainer.ChainList()
                for _ in range(self.layers_per_block):
                    block.append(DenseLayer(channels, growth_rate, recompute))
                    channels += growth_rate
                self.blocks.append(block)
                if b < 2:
                    out = int(channels * compression)
                    self.transitions.append(Transition(channels, out))
                    channels = out
            self.norm = L.BatchNormalization(channels)
            self.fc = L.Linear(channels, n_classes)

    def dense_layers(self):
        return [layer for block in self.blocks for layer in block]

    def forward(self, x):
        h = self.stem(x)
        for b, block in enumerate(self.blocks):
            features = [h]
            for layer in block:
                features.append(layer(features))
            h = F.concat(features, axis=1)
            if b < len(self.transitions):
                h = self.transitions[b](h)
        h = F.relu(self.norm(h))
        return self.fc(F.average(h, axis=(2, 3)))

    def __call__(self, x, t):
        y = self.forward(x)
        loss = F.softmax_cross_entropy(y, t)
        chainer.report({"loss": loss, "accuracy": F.accuracy(y, t)}, self)
        return loss


def synthetic_cifar(size, insize, n_classes, seed=0):
    """Random images of shape (3, insize, insize) and labels, fixed by ``seed``."""
    rng = np.random.default_rng(seed)
    images = rng.standard_normal((size, 3, insize, insize), dtype=np.float32)
    labels = rng.integers(0, n_classes, size).astype(np.int32)
    return chainer.datasets.TupleDataset(images, labels)


def build_model(args, recompute, device):
    """The model, with the weights ``--seed`` gives (Chainer's initializers draw from NumPy)."""
    np.random.seed(args.seed)
    model = DenseNetBC(args.depth, args.growth_rate, args.classes, recompute)
    model.to_device(device)
    return model


class LossLog(training.Extension):
    """Keep every iteration's loss (the summary shows the last)."""

    trigger = 1, "iteration"
    priority = training.PRIORITY_READER

    def __init__(self):
        self.losses = []

    def __call__(self, trainer):
        self.losses.append(float(trainer.observation["main/loss"].array))


def train(args, recompute, pool_name, device):
    """Train for ``args.iterations`` updates; return the summary row."""
    model = build_model(args, recompute, device)
    data = synthetic_cifar(args.batchsize, args.insize, args.classes, args.seed)
    losses = LossLog()
    pool, recorder = run_training(args, model, data, 0.1, pool_name, device, [losses])
    stats = pool.stats() if pool is not None and args.device >= 0 else None
    cpu_pgmo = NA if pool is not None and args.device < 0 else "-"
    return ("on" if recompute else "off", pool_name, args.batchsize, recorder.iterations,
            recorder.peak_text(recorder.peak_pool), recorder.peak_text(recorder.peak_device),
            f"{recorder.watch.steady_ms():.1f}",
            stats.mode if stats else cpu_pgmo,
            stats.departed_requests if stats else cpu_pgmo,
            f"{losses.losses[-1]:.6f}")


SUMMARY_COLUMNS = ("recompute", "pool", "batch", "iters", "peak pool bytes",
                   "peak device in use", "ms/iter", "pgmo mode", "fallback reqs", "last loss")


def parse_args(argv=None):
    parser = programs.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recompute", nargs="+", choices=("off", "on"), default=["off", "on"],
                        help="recompute each bottleneck in backward (F.forget), or not, or "
                        "both one after the other")
    parser.add_argument("--pool", nargs="+", choices=("stock", "pgmo"), default=["pgmo"],
                        help="CuPy's own pool, pgmo's, or both one after the other")
    parser.add_argument("--depth", type=int, default=100,
                        help="6 n + 4: n dense layers per block (DenseNet-BC-100: 16)")
    parser.add_argument("--growth-rate", "-k", type=int, default=12,
                        help="channels each dense layer adds")
    parser.add_argument("--batchsize", "-b", type=int, default=64)
    parser.add_argument("--iterations", "-i", type=int, default=10)
    add_device_option(parser)
    parser.add_argument("--insize", type=int, default=32, help="image size (CIFAR: 32)")
    parser.add_argument("--classes", type=int, default=10)
    add_pgmo_options(parser)
    parser.add_argument("--seed", type=int, default=0, help="seeds the data and the weights")
    args = parser.parse_args(argv)
    require_positive(parser, args, ("growth_rate", "batchsize", "iterations", "classes"))
    if args.depth < 10 or (args.depth - 4) % 6:
        parser.error(f"--depth must be 6 n + 4 with n >= 1 (10, 16, ..., 100), got {args.depth}")
    if args.insize < 4:
        parser.error(f"--insize must be at least 4 (two transitions halve it), got {args.insize}")
    return args


def main(argv=None):
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    args = parse_args(argv)
    pick_device(args)
    device = use_device(args.device)
    layers = 3 * ((args.depth - 4) // 6)
    rows = []
    for recompute in args.recompute:
        for pool_name in args.pool:
            print(f"\nDenseNet-BC-{args.depth} (k={args.growth_rate}, {layers} dense layers), "
                  f"recompute {recompute}, pool {pool_name}, batch {args.batchsize}, "
                  f"{args.insize}x{args.insize}", flush=True)
            rows.append(train(args, recompute == "on", pool_name, device))
            release_cached(args.device)
    print_table("Summary (peaks: the most at an iteration's end, every iteration counted; "
                "ms/iter: median after the first iteration)", SUMMARY_COLUMNS, rows)


if __name__ == "__main__":
    sys.exit(programs.run(main))
