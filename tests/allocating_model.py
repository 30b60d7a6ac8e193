"""A Chainer model whose forward makes a fixed pattern of device requests.

The requests go through CuPy's current allocator (``cupy.cuda.alloc``), the
way CuPy arrays allocate on a GPU, so a test sees whether a pool was really
installed and each update marked.  Import it after ``pgmo.chainer`` (or
``pgmo.chainermn``): Chainer needs pgmo's compatibility layer first.
"""

import chainer
import chainer.functions as F
import chainer.links as L
import cupy

# What one forward pass "allocates on the device": (size, how many of the
# following requests it outlives).  Fixed, so every update repeats the pattern.
PATTERN = [(4096, 2), (1024, 0), (8192, 1), (512, 0), (2048, 0)]
REQUESTS_PER_UPDATE = len(PATTERN)


def allocate_pattern():
    """Make PATTERN's requests through CuPy's current allocator; free them in order."""
    held = []
    for size, keep in PATTERN:
        held.append([cupy.cuda.alloc(size), keep])
        for entry in held[:-1]:
            entry[1] -= 1
        held = [entry for entry in held if entry[1] >= 0]
    return held  # dropped by the caller: frees the rest


class AllocatingModel(chainer.Chain):
    """A linear regressor whose forward also makes PATTERN's device requests."""

    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.fc = L.Linear(3, 1)

    def forward(self, x, t):
        held = allocate_pattern()
        loss = F.mean_squared_error(self.fc(x), t)
        chainer.report({"loss": loss}, self)
        del held
        return loss
