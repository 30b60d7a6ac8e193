"""ImageNet models of the paper's CNN experiments, written in Chainer.

Every model maps ``(N, 3, insize, insize)`` float32 images to class scores and
computes its training loss in ``__call__(x, t)``; ``ARCHS`` maps the names
``train_imagenet.py --arch`` accepts to the model classes.
"""

from .alexnet import AlexNet
from .googlenet import GoogLeNet
from .inception_resnet_v2 import InceptionResNetV2
from .resnet50 import ResNet50

ARCHS = {
    "alexnet": AlexNet,
    "googlenet": GoogLeNet,
    "resnet50": ResNet50,
    "inception-resnet-v2": InceptionResNetV2,
}

__all__ = ["ARCHS", "AlexNet", "GoogLeNet", "InceptionResNetV2", "ResNet50"]
