"""GoogLeNet (Szegedy et al., 2015, "Going deeper with convolutions").

Nine Inception modules (Chainer's ``L.Inception``) and, while training, the two
auxiliary classifiers whose losses are added with weight 0.3.
"""

import chainer
import chainer.functions as F
import chainer.links as L

from .base import ImageNetModel

# (out 1x1, reduce 3x3, out 3x3, reduce 5x5, out 5x5, pool projection) per module.
_MODULES = {
    "inc3a": (64, 96, 128, 16, 32, 32), "inc3b": (128, 128, 192, 32, 96, 64),
    "inc4a": (192, 96, 208, 16, 48, 64), "inc4b": (160, 112, 224, 24, 64, 64),
    "inc4c": (128, 128, 256, 24, 64, 64), "inc4d": (112, 144, 288, 32, 64, 64),
    "inc4e": (256, 160, 320, 32, 128, 128), "inc5a": (256, 160, 320, 32, 128, 128),
    "inc5b": (384, 192, 384, 48, 128, 128),
}


def _out_channels(spec):
    out1, _, out3, _, out5, proj = spec
    return out1 + out3 + out5 + proj


class _AuxClassifier(chainer.Chain):
    """Average pool 5x5/3, 1x1 conv to 128, fc 1024, dropout 0.7, fc to classes."""

    def __init__(self, in_channels, n_classes):
        super().__init__()
        with self.init_scope():
            self.conv = L.Convolution2D(in_channels, 128, 1)
            self.fc1 = L.Linear(None, 1024)
            self.fc2 = L.Linear(1024, n_classes)

    def forward(self, x):
        k = min(5, x.shape[2], x.shape[3])  # small test inputs leave maps under 5x5
        h = F.relu(self.conv(F.average_pooling_2d(x, k, stride=3)))
        h = F.dropout(F.relu(self.fc1(h)), 0.7)
        return self.fc2(h)


class GoogLeNet(ImageNetModel):
    """Inception v1 with auxiliary heads after inception 4a and 4d."""

    insize = 224
    min_insize = 31

    def __init__(self, n_classes=1000):
        super().__init__()
        with self.init_scope():
            self.conv1 = L.Convolution2D(3, 64, 7, stride=2, pad=3)
            self.conv2_reduce = L.Convolution2D(64, 64, 1)
            self.conv2 = L.Convolution2D(64, 192, 3, pad=1)
            in_channels = 192
            for name, spec in _MODULES.items():
                setattr(self, name, L.Inception(in_channels, *spec))
                in_channels = _out_channels(spec)
            self.aux1 = _AuxClassifier(_out_channels(_MODULES["inc4a"]), n_classes)
            self.aux2 = _AuxClassifier(_out_channels(_MODULES["inc4d"]), n_classes)
            self.fc = L.Linear(in_channels, n_classes)

    def _features(self, x):
        """Main trunk; also returns the inputs of the two auxiliary heads."""
        h = F.max_pooling_2d(F.relu(self.conv1(x)), 3, stride=2)
        h = F.local_response_normalization(h)
        h = F.relu(self.conv2(F.relu(self.conv2_reduce(h))))
        h = F.max_pooling_2d(F.local_response_normalization(h), 3, stride=2)
        h = self.inc3b(self.inc3a(h))
        h = F.max_pooling_2d(h, 3, stride=2)
        a1 = self.inc4a(h)
        a2 = self.inc4d(self.inc4c(self.inc4b(a1)))
        h = F.max_pooling_2d(self.inc4e(a2), 3, stride=2)
        h = self.inc5b(self.inc5a(h))
        return F.average(h, axis=(2, 3)), a1, a2

    def forward(self, x):
        h, _, _ = self._features(x)
        return self.fc(F.dropout(h, 0.4))

    def heads(self, x):
        h, a1, a2 = self._features(x)
        main = (1.0, self.fc(F.dropout(h, 0.4)))
        if not chainer.config.train:
            return [main]
        return [main, (0.3, self.aux1(a1)), (0.3, self.aux2(a2))]
