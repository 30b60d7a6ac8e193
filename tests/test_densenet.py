"""``examples/densenet.py``: recomputation (``F.forget``) changes what is kept, not the results.

Both variants are built with the same weights and fed the same batch; the loss,
every parameter's gradient and every batch normalization's running statistics
must agree, while the recomputing graph must hold ``F.forget`` nodes and keep
fewer bytes alive between forward and backward.  On the CPU, with NumPy.
"""

import gc
import tracemalloc

import numpy as np
import pytest

from pgmo import _chainer_compat

_chainer_compat.apply()
chainer = pytest.importorskip("chainer")

from chainer.functions.util.forget import Forget  # noqa: E402

from .example_modules import load_example  # noqa: E402

pytestmark = pytest.mark.chainer

densenet = load_example("densenet")


def build(recompute, depth=16, growth_rate=4, seed=0):
    np.random.seed(seed)  # Chainer's initializers draw from NumPy: the same weights
    return densenet.DenseNetBC(depth, growth_rate, n_classes=10, recompute=recompute)


def batch(size=3, insize=8, seed=1):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((size, 3, insize, insize), dtype=np.float32),
            rng.integers(0, 10, size).astype(np.int32))


def statistics(model):
    """Every batch normalization's running mean and variance, by link name."""
    return {f"{name}/{key}": getattr(link, key).copy()
            for name, link in model.namedlinks()
            if isinstance(link, chainer.links.BatchNormalization)
            for key in ("avg_mean", "avg_var")}


def train_step(model, x, t):
    """One forward and backward in training mode; returns the loss value."""
    model.cleargrads()  # Chainer fills fresh gradients with NaN until cleared
    with chainer.using_config("train", True):
        loss = model(x, t)
        loss.backward()
    return float(loss.array)


def assert_same_training(stored, recomputed, x, t):
    """Same loss, gradients and running statistics after one step of each model."""
    before = statistics(stored)
    loss_stored, loss_recomputed = train_step(stored, x, t), train_step(recomputed, x, t)
    np.testing.assert_allclose(loss_recomputed, loss_stored, rtol=1e-6)
    grads = dict(stored.namedparams())
    others = dict(recomputed.namedparams())
    assert sorted(grads) == sorted(others) and len(grads) > 20
    for name, param in grads.items():
        assert param.grad is not None and np.isfinite(param.grad).all(), name
        np.testing.assert_allclose(others[name].grad, param.grad, rtol=1e-6, atol=1e-9,
                                   err_msg=name)
    after, after_recomputed = statistics(stored), statistics(recomputed)
    for name, value in after.items():
        assert not np.array_equal(value, before[name]), name  # the step did update them
        np.testing.assert_allclose(after_recomputed[name], value, rtol=1e-6, atol=1e-9,
                                   err_msg=name)


def test_recomputation_gives_the_same_loss_gradients_and_running_statistics():
    x, t = batch()
    assert_same_training(build(False), build(True), x, t)


def test_the_comparison_catches_statistics_updated_twice():
    """Recomputing with Chainer's ``in_recomputing`` flag ignored updates the statistics again."""
    x, t = batch()
    careless = build(True)
    for layer in careless.dense_layers():
        def bottleneck(*features, inner=layer.bottleneck):
            with chainer.using_config("in_recomputing", False):
                return inner(*features)
        layer.bottleneck = bottleneck
    with pytest.raises(AssertionError, match="avg_"):
        assert_same_training(build(False), careless, x, t)


def test_the_same_training_over_several_updates():
    x, t = batch(size=4)
    stored, recomputed = build(False), build(True)
    for model in (stored, recomputed):
        optimizer = chainer.optimizers.MomentumSGD(lr=0.1, momentum=0.9)
        optimizer.setup(model)
        for _ in range(3):
            optimizer.update(model, x, t)
    for (name, param), (_, other) in zip(sorted(stored.namedparams()),
                                         sorted(recomputed.namedparams())):
        np.testing.assert_allclose(other.array, param.array, rtol=1e-5, atol=1e-7,
                                   err_msg=name)


def function_nodes(loss):
    """Every function node in the graph that produced ``loss``."""
    seen, stack = {}, [loss.creator_node]
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen[id(node)] = node
        stack.extend(var.creator_node for var in node.inputs)
    return list(seen.values())


def test_recomputation_puts_each_bottleneck_under_forget():
    x, t = batch()
    counts = {}
    for recompute in (False, True):
        model = build(recompute)
        with chainer.using_config("train", True):
            nodes = function_nodes(model(x, t))
        counts[recompute] = (sum(isinstance(n, Forget) for n in nodes),
                             sum(type(n).__name__ == "BatchNormalization" for n in nodes))
    layers = 3 * 2  # depth 16: two dense layers per block
    assert counts[False] == (0, 2 * layers + 2 + 1)  # two per layer, transitions, the last
    # The bottleneck's normalization is inside F.forget: not in the graph until backward.
    assert counts[True] == (layers, layers + 2 + 1)


def held_after_forward(model, x, t):
    """Bytes allocated by a forward pass and still held by its graph (tracemalloc)."""
    with chainer.using_config("train", True):
        model(x, t)  # lazily made arrays (running statistics) are not the graph's
        model.cleargrads()
        gc.collect()
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            loss = model(x, t)
            held = tracemalloc.get_traced_memory()[0] - base
        finally:
            tracemalloc.stop()
    del loss
    return held


def test_recomputation_keeps_fewer_bytes_between_forward_and_backward():
    x, t = batch(size=4, insize=16)
    stored = held_after_forward(build(False, depth=28, growth_rate=8), x, t)
    recomputed = held_after_forward(build(True, depth=28, growth_rate=8), x, t)
    # The concatenations and their normalized copies grow with depth; F.forget
    # drops them (about a third of the bytes here, two thirds at depth 100).
    assert recomputed < 0.8 * stored, (recomputed, stored)


@pytest.mark.parametrize("depth", [4, 9, 15])
def test_depth_must_be_six_n_plus_four(depth):
    with pytest.raises(ValueError, match="6 n \\+ 4"):
        densenet.DenseNetBC(depth, 4)
