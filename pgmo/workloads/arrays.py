"""What every generated workload is made of: device arrays freed by their last holder.

The LSTM (:mod:`.lstm_model`) and CNN (:mod:`.cnn`) models write their requests
through :class:`Arrays` and keep their parameters in :class:`Params`, so both
families free an array, make a gradient and an optimizer's state the same way.
Tested through the generators, in ``tests/test_workloads.py``.

Core module: no CuPy, no Chainer.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from ..runs import Run, RunRecorder

F32 = 4  # bytes of a float32
I32 = 4  # bytes of an int32 word id or label

_SYNTHETIC = {"synthetic": True}


class Arrays:
    """A run's device arrays, each freed when its last holder lets it go.

    A function node's hold on what it retained for backward ends when the graph is
    deleted (:meth:`release` then :meth:`delete_graph`), not when its backward runs:
    Chainer's nodes keep their retained arrays until the last reference to the loss
    goes, after ``loss.backward()``.
    """

    def __init__(self, recorder: RunRecorder, scale: float) -> None:
        self.recorder = recorder
        self.scale = scale
        self.refs: dict[int, int] = {}
        self.graph: list[int] = []  # holds to end when the graph is deleted, in order

    def new(self, nbytes: int) -> int:
        """A new array of ``nbytes`` (times the scale), held once by the caller."""
        handle = self.recorder.alloc(max(1, math.ceil(nbytes * self.scale)))
        self.refs[handle] = 1
        return handle

    def temp(self, nbytes: int) -> None:
        """A temporary: made and freed at once."""
        self.drop(self.new(nbytes))

    def hold(self, *handles: int) -> None:
        for h in handles:
            self.refs[h] += 1

    def drop(self, *handles: int) -> None:
        for h in handles:
            left = self.refs[h] - 1
            if left:
                self.refs[h] = left
            else:
                del self.refs[h]
                self.recorder.free(h)

    def release(self, *handles: int) -> None:
        """A node's backward has run: its holds on ``handles`` end with the graph."""
        self.graph.extend(handles)

    def delete_graph(self) -> None:
        """The loss's last reference goes: every node's holds end, in the order their
        backward ran (the graph is torn down from the loss)."""
        graph, self.graph = self.graph, []
        self.drop(*graph)


class Params:
    """A model's parameters: weights, their gradients (remade each iteration) and optimizer
    state (made by the first update)."""

    def __init__(self, arrays: Arrays, sizes: Sequence[int], state_per_param: int) -> None:
        self.arrays = arrays
        self.sizes = list(sizes)  # bytes
        self.state_per_param = state_per_param
        self.weights: list[int] = []
        self.grads: dict[int, int] = {}  # param index -> its gradient's handle
        self.state: list[int] = []

    def make(self) -> None:
        self.weights = [self.arrays.new(n) for n in self.sizes]

    def cleargrads(self) -> None:
        """Chainer's ``cleargrads()``: every gradient dropped (after the forward pass)."""
        for h in self.grads.values():
            self.arrays.drop(h)
        self.grads = {}

    def grad(self, index: int) -> None:
        """The backward pass reaches parameter ``index``: its gradient is made the first
        time; later contributions are added into it (in place here)."""
        if index not in self.grads:
            self.grads[index] = self.arrays.new(self.sizes[index])

    def update(self) -> None:
        """The optimizer's update: its state made the first time (Adam: m and v; momentum
        SGD: v), each the size of its parameter; the update kernels allocate nothing."""
        if not self.state:
            self.state = [self.arrays.new(n) for n in self.sizes
                          for _ in range(self.state_per_param)]


def finish_run(recorder: RunRecorder, workload: str, seed: int, how: str,
               parameters: dict[str, Any], shapes: list, **extra: Any) -> Run:
    """The recorded run, its metadata saying which member, seed and parameters made it."""
    return recorder.run(**_SYNTHETIC, workload=workload, seed=seed, how=how,
                        parameters=parameters, shapes=shapes, **extra,
                        recorded_by=f"pgmo.workloads ({workload}): generated, not a measurement")


def pair(values: Any) -> tuple[int, int]:
    """An encoder and a decoder length, as ints."""
    return int(values[0]), int(values[1])


def check_options(iterations: int, scale: float) -> None:
    """A clear error for the options every member takes, before anything is drawn."""
    if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 1:
        raise ValueError(f"iterations must be an integer >= 1, got {iterations!r}")
    if not (isinstance(scale, (int, float)) and scale > 0):
        raise ValueError(f"scale must be a number > 0, got {scale!r}")
