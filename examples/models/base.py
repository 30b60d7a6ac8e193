"""What the four ImageNet models share: the loss, the report, the input size."""

import chainer
import chainer.functions as F


class ImageNetModel(chainer.Chain):
    """A classifier whose ``forward`` returns class scores.

    Subclasses set ``insize`` (the size of the published model) and
    ``min_insize`` (the smallest input its strides leave at least one pixel
    for), and may return auxiliary heads from :meth:`heads` (GoogLeNet).
    """

    insize = 224
    min_insize = 32

    def forward(self, x):
        raise NotImplementedError

    def heads(self, x):
        """``[(weight, scores), ...]`` whose weighted losses are summed; main head first."""
        return [(1.0, self.forward(x))]

    def __call__(self, x, t):
        heads = self.heads(x)
        loss = sum(weight * F.softmax_cross_entropy(y, t) for weight, y in heads)
        chainer.report({"loss": loss, "accuracy": F.accuracy(heads[0][1], t)}, self)
        return loss
