"""Inception-ResNet-v2 (Szegedy et al., 2017, "Inception-v4, Inception-ResNet
and the impact of residual connections on learning").

Layer sizes and block counts (10 x 35x35, 20 x 17x17, 10 x 8x8 blocks,
residual scales 0.17 / 0.1 / 0.2) follow the widely used TF-slim and Keras
versions, whose accuracy the paper reports.  ``valid`` convolutions and
poolings shrink the maps, so the input must be at least 75 pixels.
"""

import chainer
import chainer.functions as F
import chainer.links as L

from .base import ImageNetModel


class _ConvBN(chainer.Chain):
    """Convolution without bias, batch normalization, ReLU."""

    def __init__(self, in_channels, out_channels, ksize, stride=1, pad=0):
        super().__init__()
        with self.init_scope():
            self.conv = L.Convolution2D(in_channels, out_channels, ksize, stride, pad, nobias=True)
            self.bn = L.BatchNormalization(out_channels, eps=1e-3)

    def forward(self, x):
        return F.relu(self.bn(self.conv(x)))


def _same(ksize):
    """Padding that keeps the size for an odd (h, w) kernel."""
    return (ksize[0] // 2, ksize[1] // 2)


def _branch(in_channels, *layers):
    """A chain of _ConvBN layers given as (out_channels, ksize[, stride, pad])."""
    links = []
    for out_channels, ksize, *rest in layers:
        ksize = ksize if isinstance(ksize, tuple) else (ksize, ksize)
        stride, pad = rest if rest else (1, _same(ksize))
        links.append(_ConvBN(in_channels, out_channels, ksize, stride, pad))
        in_channels = out_channels
    return chainer.Sequential(*links)


def _max_pool_valid(x):
    return F.max_pooling_2d(x, 3, stride=2, cover_all=False)


class _Stem(chainer.Chain):
    """299x299x3 -> 35x35x320 (TF-slim's stem and Mixed_5b)."""

    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.conv1 = _branch(3, (32, 3, 2, 0), (32, 3, 1, 0), (64, 3))
            self.conv2 = _branch(64, (80, 1), (192, 3, 1, 0))
            self.b0 = _branch(192, (96, 1))
            self.b1 = _branch(192, (48, 1), (64, 5))
            self.b2 = _branch(192, (64, 1), (96, 3), (96, 3))
            self.b3 = _branch(192, (64, 1))

    def forward(self, x):
        h = _max_pool_valid(self.conv1(x))
        h = _max_pool_valid(self.conv2(h))
        pooled = F.average_pooling_2d(h, 3, stride=1, pad=1)
        return F.concat([self.b0(h), self.b1(h), self.b2(h), self.b3(pooled)])


class _ResidualBlock(chainer.Chain):
    """Parallel branches, a linear 1x1 projection, a scaled residual sum."""

    def __init__(self, channels, branches, scale, activate=True):
        super().__init__()
        self.scale = scale
        self.activate = activate
        with self.init_scope():
            self.branches = chainer.ChainList(*(_branch(channels, *b) for b in branches))
            mixed = sum(b[-1][0] for b in branches)
            self.project = L.Convolution2D(mixed, channels, 1)

    def forward(self, x):
        h = F.concat([branch(x) for branch in self.branches])
        h = x + self.scale * self.project(h)
        return F.relu(h) if self.activate else h


def _block35():
    return _ResidualBlock(320, [[(32, 1)], [(32, 1), (32, 3)], [(32, 1), (48, 3), (64, 3)]], 0.17)


def _block17():
    return _ResidualBlock(1088, [[(192, 1)], [(128, 1), (160, (1, 7)), (192, (7, 1))]], 0.1)


def _block8(scale=0.2, activate=True):
    return _ResidualBlock(2080, [[(192, 1)], [(192, 1), (224, (1, 3)), (256, (3, 1))]],
                          scale, activate)


class _ReductionA(chainer.Chain):
    """35x35x320 -> 17x17x1088."""

    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.b0 = _branch(320, (384, 3, 2, 0))
            self.b1 = _branch(320, (256, 1), (256, 3), (384, 3, 2, 0))

    def forward(self, x):
        return F.concat([self.b0(x), self.b1(x), _max_pool_valid(x)])


class _ReductionB(chainer.Chain):
    """17x17x1088 -> 8x8x2080."""

    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.b0 = _branch(1088, (256, 1), (384, 3, 2, 0))
            self.b1 = _branch(1088, (256, 1), (288, 3, 2, 0))
            self.b2 = _branch(1088, (256, 1), (288, 3), (320, 3, 2, 0))

    def forward(self, x):
        return F.concat([self.b0(x), self.b1(x), self.b2(x), _max_pool_valid(x)])


class InceptionResNetV2(ImageNetModel):
    """Stem, 10 x block35, reduction A, 20 x block17, reduction B, 10 x block8.

    ``repeats`` gives the numbers of 35x35, 17x17 and 8x8 blocks before the
    last 8x8 block (which has no ReLU); fewer make a smaller test model.
    """

    insize = 299
    min_insize = 75

    def __init__(self, n_classes=1000, repeats=(10, 20, 9)):
        super().__init__()
        n35, n17, n8 = repeats
        with self.init_scope():
            self.stem = _Stem()
            self.blocks35 = chainer.ChainList(*(_block35() for _ in range(n35)))
            self.reduction_a = _ReductionA()
            self.blocks17 = chainer.ChainList(*(_block17() for _ in range(n17)))
            self.reduction_b = _ReductionB()
            self.blocks8 = chainer.ChainList(*(_block8() for _ in range(n8)))
            self.block8_last = _block8(scale=1.0, activate=False)
            self.conv = _branch(2080, (1536, 1))
            self.fc = L.Linear(1536, n_classes)

    def forward(self, x):
        h = self.stem(x)
        for stage in (self.blocks35, self.reduction_a, self.blocks17, self.reduction_b,
                      self.blocks8, self.block8_last, self.conv):
            h = _apply(stage, h)
        return self.fc(F.dropout(F.average(h, axis=(2, 3)), 0.2))


def _apply(stage, h):
    """A ChainList of blocks applies them in turn (none: identity); a link is called."""
    if isinstance(stage, chainer.ChainList) and not isinstance(stage, chainer.Sequential):
        for block in stage:
            h = block(h)
        return h
    return stage(h)
