"""A GPU's array allocations, mirrored from Chainer on NumPy into CuPy's allocator.

On the CPU, Chainer's arrays are NumPy's, and CuPy's allocator (the one a
pool is installed as with ``cupy.cuda.set_allocator``) never hears of them.
:class:`NumpyMirror` is a Chainer function hook that asks that allocator
(``cupy.cuda.alloc``, exactly what CuPy calls for every array on a GPU) for
one block per array a GPU would hold, and drops the block when the NumPy
array dies:

* every array a function receives or returns, in forward and in backward
  (outputs through the function's own ``forward``/``backward``, wrapped while
  it runs), and the arrays a function keeps on itself for backward (max
  pooling's indexes, LRN's scale, dropout's mask...);
* what :meth:`NumpyMirror.see_link` and :meth:`NumpyMirror.see_optimizer`
  are shown: parameters, their gradients, optimizer state;
* the temporaries CuPy allocates inside Chainer's GPU paths that no one sees
  on the CPU, modelled from the function's shapes (:data:`TEMPORARIES`;
  e.g. a convolution's im2col buffer and the copy ``cupy.tensordot`` makes).

A view is its base's block, requested once.  Sizes are the NumPy arrays'
bytes, with the dtypes CuPy uses where Chainer's CPU path differs
(:data:`GPU_ITEMSIZE`).  Not seen: arrays user code makes and never hands
to a function or keeps as a parameter (e.g. seq2seq's per-sentence
``concatenate`` before the embedding's), temporaries inside functions
other than those modelled, and libraries' workspaces (cuBLAS).
"""

from __future__ import annotations

import collections
import weakref
from typing import Any, Callable, Iterable

import pgmo.chainer  # noqa: F401,I001  (the Chainer compatibility layer first)
import chainer
import numpy as np


def cupy_alloc(nbytes: int):
    """CuPy's allocator, whichever is installed: what every CuPy array calls on a GPU."""
    import cupy

    return cupy.cuda.alloc(nbytes)


def _im2col_bytes(x_shape, w_shape, y_shape, itemsize: int) -> int:
    """Bytes of ``im2col``'s buffer: (n, c, kh, kw, out_h, out_w)."""
    n, c = x_shape[:2]
    kh, kw = w_shape[2:]
    return n * c * kh * kw * int(np.prod(y_shape[2:])) * itemsize


def _convolution(function, inputs, outputs):
    """Convolution2DFunction without cuDNN: ``y = cupy.empty(...)`` (unused), im2col,
    ``cupy.tensordot``'s contiguous copy of it; all freed once ``y`` is made."""
    if getattr(function, "groups", 1) > 1:
        return [], []
    x, w, y = inputs[0], inputs[1], outputs[0]
    col = _im2col_bytes(x.shape, w.shape, y.shape, x.itemsize)
    return [], [("unused output", y.nbytes), ("im2col", col), ("tensordot copy", col)]


def _convolution_grad_w(function, inputs, outputs):
    """Convolution2DGradW without cuDNN: im2col, then ``cupy.tensordot`` copies gy and the
    buffer into contiguous order."""
    if getattr(function, "groups", 1) > 1:
        return [], []
    x, gy = inputs
    col = _im2col_bytes(x.shape, (0, 0, function.kh, function.kw), gy.shape, x.itemsize)
    return [], [("im2col", col), ("tensordot copy of gy", gy.nbytes), ("tensordot copy", col)]


def _deconvolution(function, inputs, outputs):
    """Deconvolution2DFunction without cuDNN: ``cupy.tensordot`` copies x (freed once the
    column buffer is made), then col2im reads the column buffer into y."""
    if getattr(function, "groups", 1) > 1:
        return [], []
    x, w = inputs[0], inputs[1]
    gcol = int(np.prod(w.shape[1:])) * x.shape[0] * int(np.prod(x.shape[2:])) * x.itemsize
    return [("tensordot copy of x", x.nbytes)], [("column buffer", gcol)]


def _dropout(function, inputs, outputs):
    """Dropout without cuDNN: ``cupy.random.rand`` of x's shape, float32, beside the mask."""
    return [], [("random numbers", inputs[0].size * 4)]


def _softmax_cross_entropy(function, inputs, outputs):
    """SoftmaxCrossEntropy: ``logsumexp``'s ``x - max`` and row sums die before ``log_y`` is
    made; its row maxima and ``log_y`` live beside the loss (its kept ``exp(log_y)`` is seen
    on the CPU as well).  The scalars of its mean are not modelled."""
    x = inputs[0]
    rows = x.size // max(1, x.shape[1]) * x.itemsize
    return [("x - max", x.nbytes), ("row sums", rows)], [("row maxima", rows), ("log_y", x.nbytes)]


def _lrn_grad(function, inputs, outputs):
    """LocalResponseNormalizationGrad: the summand ``y * gy / scale``, beside gx."""
    return [], [("summand", inputs[0].nbytes)]


def _batch_normalization_grad(function, inputs, outputs):
    """BatchNormalizationGrad (no cuDNN): ``gy * x_hat`` for gamma's gradient dies before gx
    is made; ``x_hat`` lives beside it.  (Forward reduces without a temporary.)"""
    x = inputs[0]
    return [("gy * x_hat", x.nbytes)], [("x_hat", x.nbytes)]


#: Temporaries a function's GPU path allocates besides its outputs, by class name:
#: ``f(function, inputs, outputs) -> (before, beside)``, lists of (what, bytes).
#: ``before`` are made, then freed, before the outputs are made; ``beside`` live
#: while the outputs are made.  Calibrated against the H100 traces of 2026-11-25.
TEMPORARIES: dict[str, Callable] = {
    "Convolution2DFunction": _convolution,
    "Convolution2DGradW": _convolution_grad_w,
    "Deconvolution2DFunction": _deconvolution,
    "Dropout": _dropout,
    "SoftmaxCrossEntropy": _softmax_cross_entropy,
    "LocalResponseNormalizationGrad": _lrn_grad,
    "BatchNormalizationGrad": _batch_normalization_grad,
}

#: Arrays a function keeps whose dtype differs on the GPU: (class, attribute) -> itemsize.
#: Max pooling's argmax indexes are int64 on the CPU (``ndarray.argmax``), int32 on the GPU.
GPU_ITEMSIZE: dict[tuple[str, str], int] = {
    ("MaxPoolingND", "indexes"): 4,
    ("MaxPooling2D", "indexes"): 4,
}

#: Arrays a function keeps that a GPU run holds in no device memory: its GPU path keeps
#: no such array (LRN's ``unit_scale``), or keeps it in host memory (split indices).
NOT_ON_DEVICE: set[tuple[str, str]] = {
    ("LocalResponseNormalization", "unit_scale"),
    ("LocalResponseNormalizationGrad", "unit_scale"),
    ("SplitAxis", "indices"),
}


def _base(array: np.ndarray) -> np.ndarray:
    while isinstance(array.base, np.ndarray):
        array = array.base
    return array


class NumpyMirror(chainer.FunctionHook):
    """One request to CuPy's allocator per array a GPU would hold, freed when the array dies.

    ``allocator.malloc(nbytes)`` is asked for each block (default: CuPy's
    allocator, :func:`cupy_alloc`; a pool's ``malloc`` would bypass what is
    installed, as the old mirror did, hiding a pool that never got installed);
    what it returns is kept until the array is garbage, then dropped, which
    is the block's free for CuPy's pools.  ``counts`` says how many blocks
    each source gave.
    """

    name = "pgmo_numpy_mirror"

    def __init__(self, allocator: Any = None, temporaries: bool = True):
        self.allocate: Callable[[int], Any] = cupy_alloc if allocator is None \
            else allocator.malloc
        self.temporaries = temporaries
        self._blocks: dict[int, Any] = {}
        self.counts: collections.Counter = collections.Counter()
        #: With ``log=[]``, one (source, nbytes, shape, dtype, function) per request.
        self.log: list | None = None
        self._function = ""
        self._lazy: list[chainer.Link] = []  # links with parameters not initialized yet

    # ------------------------------------------------------------ requests
    def see(self, arrays: Iterable[Any], source: str, itemsize: int | None = None,
            made: bool = False) -> None:
        """Request a block for each array (its base's) not seen yet, freed with the base.

        ``made``: the arrays were just made by a function.  Then a base seen
        for the first time through one smaller view gets only that view's
        bytes: it is a CPU temporary the view was cut from (``col2im_cpu``
        returns the inside of a padded image; CuPy's allocates the image
        alone).  Otherwise, and through several views at once, the whole base.
        """
        views: dict[int, list[np.ndarray]] = {}
        bases: dict[int, np.ndarray] = {}
        for array in arrays:
            if isinstance(array, chainer.Variable):
                array = array.array
            if not isinstance(array, np.ndarray):
                continue
            base = _base(array)
            if id(base) not in self._blocks and base.nbytes:
                bases[id(base)] = base
                views.setdefault(id(base), []).append(array)
        for key, base in bases.items():
            seen = views[key]
            size = min(seen[0].size, base.size) if made and len(seen) == 1 else base.size
            nbytes = size * (base.itemsize if itemsize is None else itemsize)
            self._blocks[key] = self.allocate(nbytes)
            weakref.finalize(base, self._blocks.pop, key, None)
            self.counts[source] += 1
            if self.log is not None:
                self.log.append((source, nbytes, seen[0].shape, str(base.dtype), self._function))

    def see_link(self, link: chainer.Link) -> None:
        """Parameters and their gradients (made at construction, by backward, or lazily).

        A link whose parameters are not all initialized yet is watched: its
        parameters are looked at after each function until they are (a lazy
        parameter's NaN gradient is made with it, in the first forward pass).
        """
        lazy = False
        for param in link.params():
            self.see((param.array, param.grad_var), "parameter")  # .grad raises when unset
            lazy = lazy or param.array is None
        if lazy and link not in self._lazy:
            self._lazy.append(link)
        elif not lazy and link in self._lazy:
            self._lazy.remove(link)

    def see_optimizer(self, optimizer: chainer.Optimizer) -> None:
        """The update rules' state (made by the first update: momentum, Adam's moments)."""
        for param in optimizer.target.params():
            rule = getattr(param, "update_rule", None)
            if rule is not None and rule.state:
                self.see(rule.state.values(), "optimizer state")

    def _temporaries(self, function, inputs, outputs):
        """Request the modelled temporaries; return (blocks to free now, blocks to free after)."""
        model = TEMPORARIES.get(type(function).__name__) if self.temporaries else None
        if model is None:
            return [], []
        before, beside = model(function, inputs, outputs)
        made = [[self.allocate(n) for _, n in group if n > 0] for group in (before, beside)]
        if self.log is not None:
            self.log += [("modelled: " + what, n, (), "", self._function)
                         for what, n in before + beside if n > 0]
        self.counts["modelled temporary"] += len(made[0]) + len(made[1])
        return made[0], made[1]

    def _kept(self, function) -> None:
        """Arrays a function keeps on itself for backward (on old-style ones: their Function)."""
        for owner in (function, getattr(function, "_function", None)):
            if owner is None:
                continue
            kind = type(owner).__name__
            for attribute, value in list(vars(owner).items()):
                if (kind, attribute) in NOT_ON_DEVICE or attribute.startswith("_retained"):
                    continue
                values = value if isinstance(value, (tuple, list)) else (value,)
                self.see(values, "kept by a function", GPU_ITEMSIZE.get((kind, attribute)))

    # --------------------------------------------------------------- hooks
    def _wrap(self, function, method: str, done: Callable) -> None:
        original = getattr(type(function), method).__get__(function)

        def wrapped(*args):
            return done(function, args, original(*args))

        setattr(function, method, wrapped)

    @staticmethod
    def _unwrap(function, method: str) -> None:
        vars(function).pop(method, None)

    def _forward_done(self, function, args, outputs):
        inputs = args[0]
        before, beside = self._temporaries(function, inputs, outputs)
        del before[:]  # freed before the outputs are made
        self.see(outputs, "output", made=True)
        self._kept(function)
        del beside[:]
        return outputs

    def _backward_done(self, function, args, gradients):
        self.see(gradients, "gradient", made=True)
        return gradients

    def forward_preprocess(self, function, in_data):
        self._function = type(function).__name__
        self.see(in_data, "input")
        self._wrap(function, "forward", self._forward_done)

    def forward_postprocess(self, function, in_data):
        self._unwrap(function, "forward")
        self._function = ""
        for link in list(self._lazy):
            self.see_link(link)

    def backward_preprocess(self, function, in_data, out_grad):
        self._function = type(function).__name__ + ".backward"
        self.see(in_data, "input")
        self.see(out_grad, "output gradient")
        self._wrap(function, "backward", self._backward_done)

    def backward_postprocess(self, function, in_data, out_grad):
        self._unwrap(function, "backward")
        self._function = ""
