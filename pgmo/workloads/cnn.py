"""The CNN members of the family: ResNet-50 serving and training at several resolutions.

Tested in ``tests/test_workloads.py`` (and through the pool in
``tests/test_variable_workloads.py``).

Core module: numpy only (its seeded ``Generator``), no CuPy, no Chainer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence, cast

import numpy as np

from ..runs import Run, RunRecorder
from .arrays import F32, I32, Arrays, Params, check_options, finish_run


@dataclass(frozen=True)
class _ConvUnit:
    """Convolution (no bias), batch normalization, ReLU unless ``relu`` is False."""

    c_in: int
    c_out: int
    k: int
    stride: int
    pad: int
    relu: bool
    weight: int  # parameter indices: W, gamma, beta
    gamma: int
    beta: int


def _out(size: int, k: int, stride: int, pad: int) -> int:
    return (size + 2 * pad - k) // stride + 1


class _ResNet:
    """ResNet-50 as the project's example builds it (``examples/models/resnet50.py``: the
    stride in a bottleneck's 3x3 convolution, a projection shortcut where the shape
    changes, max pooling 3x3/2 with padding 1, global average pooling).

    Its parameters are those of the recorded ``resnet50-train-b32-cpu`` run (the same
    long-lived bytes); at 224 px and batch 32 an iteration's own lower bound here is
    92% of that recording's (functions' inner arrays condensed: 64% of its requests).

    A convolution on the generic path (no cuDNN) makes its im2col buffer
    (B, C, k, k, oh, ow), multiplies it into its output and frees it; backward makes
    the buffer again for the weight gradient and a (B, C, k, k, oh, ow) gradient that
    col2im folds into the input's gradient.  Batch normalization in training keeps
    its input, the batch's mean and 1/std (C each); ReLU keeps its output.
    """

    def __init__(self, arrays: Arrays, blocks: Sequence[int], classes: int,
                 state_per_param: int) -> None:
        self.d = arrays
        self.classes = classes
        sizes: list[int] = []
        persistent: list[int] = []

        def unit(c_in, c_out, k, stride, pad, relu=True):
            sizes.extend([c_out * c_in * k * k * F32, c_out * F32, c_out * F32])
            persistent.extend([c_out * F32, c_out * F32])  # running mean and variance
            n = len(sizes)
            return _ConvUnit(c_in, c_out, k, stride, pad, relu, n - 3, n - 2, n - 1)

        self.stem = unit(3, 64, 7, 2, 3)
        self.stages = []
        c_in = 64
        for n_blocks, mid, stride in zip(blocks, (64, 128, 256, 512), (1, 2, 2, 2)):
            out = 4 * mid
            stage = []
            for i in range(n_blocks):
                s = stride if i == 0 else 1
                branch = [unit(c_in, mid, 1, 1, 0), unit(mid, mid, 3, s, 1),
                          unit(mid, out, 1, 1, 0, relu=False)]
                shortcut = (unit(c_in, out, 1, s, 0, relu=False) if s != 1 or c_in != out
                            else None)
                stage.append((branch, shortcut))
                c_in = out
            self.stages.append(stage)
        self.features = c_in
        sizes.extend([classes * c_in * F32, classes * F32])
        self.fc_w, self.fc_b = len(sizes) - 2, len(sizes) - 1
        self.params = Params(arrays, sizes, state_per_param)
        self.persistent_sizes = persistent
        self.persistent: list[int] = []

    def make(self) -> None:
        self.params.make()
        self.persistent = [self.d.new(n) for n in self.persistent_sizes]

    # Forward: each call takes the caller's reference to its input and returns a new one.
    def unit_forward(self, u: _ConvUnit, x: int, B: int, hw: int, train: bool):
        """(output, its side, the record backward needs or None in inference)."""
        d = self.d
        o = _out(hw, u.k, u.stride, u.pad)
        col = B * u.c_in * u.k * u.k * o * o * F32
        act = B * u.c_out * o * o * F32
        d.temp(col)
        y = d.new(act)  # retained by batch normalization in training
        if train:
            d.hold(x)  # retained by the convolution
            mean, inv_std = d.new(u.c_out * F32), d.new(u.c_out * F32)
        z = d.new(act)
        if not train:
            d.drop(y)
        if u.relu:
            r = d.new(act)
            d.drop(z)
            if train:
                d.hold(r)  # ReLU retains its output
            z = r
        record = (u, x, y, mean, inv_std, z if u.relu else None, col, hw, act) if train else None
        return z, o, record

    def unit_backward(self, record, g: int, B: int) -> int | None:
        """The gradient of a unit's input from that of its output (None for the images)."""
        d, p = self.d, self.params
        u, x, y, mean, inv_std, r, col, hw, act = record
        if r is not None:
            g_z = d.new(act)
            d.drop(g)
            d.release(r)
            g = g_z
        g_y = d.new(act)
        p.grad(u.gamma)
        p.grad(u.beta)
        d.drop(g)
        d.release(mean, inv_std, y)
        d.temp(col)  # im2col of x again, for the weight gradient
        p.grad(u.weight)
        d.release(x)
        if u is self.stem:  # the images need no gradient
            d.drop(g_y)
            return None
        d.temp(col)  # the gradient of the columns, folded by col2im
        g_x = d.new(B * u.c_in * hw * hw * F32)
        d.drop(g_y)
        return g_x

    def forward(self, x: int, B: int, res: int, train: bool, tape: list) -> int:
        """The logits (B, classes) from the images ``x`` (the caller's reference taken);
        in training, ``tape`` gets what backward needs, in order of creation."""
        d = self.d
        h, hw, record = self.unit_forward(self.stem, x, B, res, train)
        if train:
            tape.append(("unit", record))
        d.drop(x)
        o = (hw + 2 * 1 - 3 + 2 - 1) // 2 + 1  # max pooling 3x3/2, padding 1, cover_all
        c = self.stem.c_out
        pooled = d.new(B * c * o * o * F32)
        if train:
            indexes = d.new(B * c * o * o * I32)  # kept for backward
            tape.append(("maxpool", indexes, B * c * hw * hw * F32))
        d.drop(h)
        h, hw = pooled, o
        for stage in self.stages:
            for branch, shortcut in stage:
                records = []
                a = h
                d.hold(a)
                side = hw
                for u in branch:
                    b, side, record = self.unit_forward(u, a, B, side, train)
                    d.drop(a)
                    records.append(record)
                    a = b
                if shortcut is not None:
                    s, _, short_record = self.unit_forward(shortcut, h, B, hw, train)
                else:
                    s, short_record = h, None
                    d.hold(h)
                act = B * branch[2].c_out * side * side * F32
                added = d.new(act)
                d.drop(a, s)
                out = d.new(act)
                d.drop(added)
                if train:
                    d.hold(out)  # ReLU retains its output
                    tape.append(("block", records, short_record, out,
                                 B * branch[0].c_in * hw * hw * F32, act))
                d.drop(h)  # the block's input: the caller's reference
                h, hw = out, side
        pooled = d.new(B * self.features * F32)  # global average pooling
        if train:
            tape.append(("avgpool", B * self.features * hw * hw * F32))
        d.drop(h)
        logits = d.new(B * self.classes * F32)
        if train:
            d.hold(pooled)  # retained by linear
            tape.append(("fc", pooled))
        d.drop(pooled)
        return logits

    def backward(self, tape: list, g: int, B: int) -> None:
        """From the gradient of the pooled features back to the images, in reverse (only
        the first unit, on the images, gives no gradient: nothing comes after it)."""
        d = self.d
        for entry in reversed(tape):
            kind = entry[0]
            if kind == "unit":
                g = cast(int, self.unit_backward(entry[1], g, B))
            elif kind == "avgpool" or kind == "maxpool":
                g_in = d.new(entry[-1])
                d.drop(g)
                d.release(*entry[1:-1])  # max pooling's indexes
                g = g_in
            elif kind == "block":
                _, records, short_record, out, in_bytes, act = entry
                g_relu = d.new(act)
                d.drop(g)
                d.release(out)
                d.hold(g_relu)  # the sum passes it to both branches
                # the shortcut was made last: its backward runs first
                g_short = (cast(int, self.unit_backward(short_record, g_relu, B))
                           if short_record is not None else g_relu)
                g_branch = g_relu
                for record in reversed(records):
                    g_branch = cast(int, self.unit_backward(record, g_branch, B))
                g = d.new(in_bytes)  # the two gradients of the block's input, summed
                d.drop(g_branch, g_short)


def _resnet_iteration(model: _ResNet, first: bool, B: int, res: int) -> None:
    d, p = model.d, model.params
    if first:
        model.make()
    x = d.new(B * 3 * res * res * F32)  # the batch on the device
    labels = d.new(B * I32)
    tape: list = []
    logits = model.forward(x, B, res, True, tape)
    cache = d.new(B * model.classes * F32)  # softmax cross-entropy's log-softmax
    loss = d.new(F32)
    p.cleargrads()
    g_loss = d.new(F32)
    g_logits = d.new(B * model.classes * F32)
    d.drop(g_loss)
    d.release(cache, logits)
    g = d.new(B * model.features * F32)
    p.grad(model.fc_w)
    p.grad(model.fc_b)
    d.drop(g_logits)
    d.release(tape.pop()[1])  # the pooled features, retained by linear
    model.backward(tape, g, B)
    d.delete_graph()  # del loss: what the nodes retained goes now
    d.drop(loss)
    p.update()
    d.drop(labels)


def serving(seed: int = 0, *, iterations: int = 150, scale: float = 1.0,
            batches: Sequence[int] = (1, 4, 8, 16, 32), burst: tuple[int, int] = (5, 20),
            resolution: int = 224, blocks: Sequence[int] = (3, 4, 6, 3),
            classes: int = 1000) -> Run:
    """Inference serving: ResNet-50 (float32, no cuDNN) answering requests in bursts, one
    iteration per request, the batch size changing between bursts.

    The model's weights and batch normalization's running statistics are loaded once,
    before the first request (outside every iteration).  Per request: the batch of
    images on the device; per convolution its im2col buffer (freed at once) and output;
    batch normalization's and ReLU's outputs, each array freed as soon as the next layer
    has used it (no backward: nothing retained), a block's input kept until its residual
    sum; the logits and their softmax, copied back and freed.  Bursts last
    ``burst`` requests (drawn uniformly); each burst's batch size is drawn from
    ``batches`` other than the last one's.
    """
    check_options(iterations, scale)
    if not batches or min(batches) < 1:
        raise ValueError(f"batches must be sizes >= 1, got {batches!r}")
    if not 1 <= burst[0] <= burst[1]:
        raise ValueError(f"burst must be a range (low, high) with 1 <= low <= high, "
                         f"got {burst!r}")
    rng = np.random.default_rng(seed)
    recorder = RunRecorder()
    d = Arrays(recorder, scale)
    model = _ResNet(d, blocks, classes, state_per_param=0)
    model.make()
    shapes: list[int] = []
    batch, left = 0, 0  # no batch yet: 0 is none of the batch sizes
    for _ in range(iterations):
        if not left:
            others = [b for b in batches if b != batch] or list(batches)
            batch = int(others[int(rng.integers(len(others)))])
            left = int(rng.integers(burst[0], burst[1] + 1))
        left -= 1
        recorder.begin()
        x = d.new(batch * 3 * resolution * resolution * F32)
        logits = model.forward(x, batch, resolution, False, [])
        probabilities = d.new(batch * classes * F32)
        d.drop(logits, probabilities)
        recorder.end()
        shapes.append(batch)
    params = dict(iterations=iterations, scale=scale, batches=list(batches), burst=list(burst),
                  resolution=resolution, blocks=list(blocks), classes=classes)
    return finish_run(recorder, "serving", seed,
                      f"ResNet inference at {resolution}px, bursts of {burst[0]}-{burst[1]} "
                      f"requests at batch sizes {list(batches)}", params, shapes)


def cnn_resolutions(seed: int = 0, *, iterations: int = 40, scale: float = 1.0,
                    resolutions: Sequence[int] = (160, 192, 224, 256), phase: int = 1,
                    batch: int = 32, blocks: Sequence[int] = (3, 4, 6, 3),
                    classes: int = 1000) -> Run:
    """CNN training at several input resolutions: ResNet-50 (float32, no cuDNN, momentum
    SGD), each phase of ``phase`` iterations at a resolution drawn uniformly from
    ``resolutions`` (1: a new draw every iteration, as multi-scale training does; more:
    phases, as progressive resizing does).

    Weights and running statistics made in the first iteration; per iteration the images
    and labels on the device; forward retains each convolution's input, batch
    normalization's input, mean and 1/std, ReLU's output, max pooling's indexes, frees
    im2col buffers and the rest at once; softmax cross-entropy over the classes; backward
    in reverse, each unit's gradients (ReLU, batch normalization, the weight gradient with
    its own im2col buffer, the columns' gradient folded into the input's), a block's two
    input gradients summed, each freed once used, parameter gradients kept until the
    next ``cleargrads()``; what forward retained goes when the graph is deleted after
    backward (so an iteration peaks at the end of its backward pass, as the project's
    recording of ResNet-50 does); the momentum made by the first update.
    """
    check_options(iterations, scale)
    if not resolutions or min(resolutions) < 64:
        raise ValueError(f"resolutions must be sides >= 64 pixels, got {resolutions!r}")
    if isinstance(phase, bool) or not isinstance(phase, int) or phase < 1:
        raise ValueError(f"phase must be an integer >= 1, got {phase!r}")
    rng = np.random.default_rng(seed)
    recorder = RunRecorder()
    model = _ResNet(Arrays(recorder, scale), blocks, classes, state_per_param=1)
    shapes: list[int] = []
    for k in range(iterations):
        if k % phase == 0:
            res = int(resolutions[int(rng.integers(len(resolutions)))])
        recorder.begin()
        _resnet_iteration(model, k == 0, batch, res)
        recorder.end()
        shapes.append(res)
    params = dict(iterations=iterations, scale=scale, resolutions=list(resolutions),
                  phase=phase, batch=batch, blocks=list(blocks), classes=classes)
    return finish_run(recorder, "cnn-resolutions", seed,
                      f"ResNet training, batch {batch}, resolutions {list(resolutions)} "
                      f"drawn every {phase} iteration(s)", params, shapes)
