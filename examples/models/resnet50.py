"""ResNet-50 (He et al., 2016) with bottleneck blocks, stride in the 3x3 conv."""

import chainer
import chainer.functions as F
import chainer.links as L

from .base import ImageNetModel


class _ConvBN(chainer.Chain):
    """Convolution without bias followed by batch normalization."""

    def __init__(self, in_channels, out_channels, ksize, stride=1, pad=0):
        super().__init__()
        with self.init_scope():
            self.conv = L.Convolution2D(in_channels, out_channels, ksize, stride, pad, nobias=True)
            self.bn = L.BatchNormalization(out_channels)

    def forward(self, x):
        return self.bn(self.conv(x))


class _Bottleneck(chainer.Chain):
    """1x1 reduce, 3x3, 1x1 expand; a projection shortcut where the shape changes."""

    def __init__(self, in_channels, mid_channels, out_channels, stride):
        super().__init__()
        with self.init_scope():
            self.reduce = _ConvBN(in_channels, mid_channels, 1)
            self.conv = _ConvBN(mid_channels, mid_channels, 3, stride, 1)
            self.expand = _ConvBN(mid_channels, out_channels, 1)
            if stride != 1 or in_channels != out_channels:
                self.shortcut = _ConvBN(in_channels, out_channels, 1, stride)
            else:
                self.shortcut = None

    def forward(self, x):
        h = F.relu(self.reduce(x))
        h = F.relu(self.conv(h))
        h = self.expand(h)
        return F.relu(h + (x if self.shortcut is None else self.shortcut(x)))


class ResNet50(ImageNetModel):
    """Stem, four stages of 3, 4, 6 and 3 bottlenecks, global average pooling."""

    insize = 224
    min_insize = 8

    STAGES = ((3, 64, 256, 1), (4, 128, 512, 2), (6, 256, 1024, 2), (3, 512, 2048, 2))

    def __init__(self, n_classes=1000):
        super().__init__()
        with self.init_scope():
            self.stem = _ConvBN(3, 64, 7, 2, 3)
            self.blocks = chainer.ChainList()
            in_channels = 64
            for count, mid, out, stride in self.STAGES:
                for i in range(count):
                    self.blocks.append(_Bottleneck(in_channels, mid, out, stride if i == 0 else 1))
                    in_channels = out
            self.fc = L.Linear(in_channels, n_classes)

    def forward(self, x):
        h = F.max_pooling_2d(F.relu(self.stem(x)), 3, stride=2, pad=1)
        for block in self.blocks:
            h = block(h)
        return self.fc(F.average(h, axis=(2, 3)))
