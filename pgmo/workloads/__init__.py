"""A family of variable workloads: whole runs made from a seed.

A pool that holds a repeating run at its physical limit may still hold far
more on a run whose iterations differ (the paper's showcase: seq2seq with
variable lengths).  Each member of :data:`FAMILY` writes, request by request
on the event clock, what a Chainer 7 program asks of CuPy's allocator on one
GPU (no cuDNN: Chainer's generic paths), as a :class:`~pgmo.runs.Run`:

* ``lstm-random``: an encoder-decoder LSTM, encoder and decoder lengths drawn 1..50;
* ``lstm-bucketed``: the same on sorted batches: lengths from a few buckets, so shapes recur;
* ``lstm-growing``: the same under a curriculum: the longest length grows over the run;
* ``lstm-outliers``: the same on short lengths with rare batches 3-4x as long;
* ``serving``: ResNet-50 inference, the batch size changing between bursts of requests;
* ``cnn-resolutions``: ResNet-50 training at several input resolutions;
* ``seq2seq-recorded``: the bundled recorded run (Chainer's seq2seq example, CPU capture).

Every generator is ``f(seed=0, *, iterations=..., scale=1.0, ...) -> Run``:
the same seed gives the same run; ``scale`` multiplies every request's
size (at least one byte), ``iterations`` sets the run's length.  Sizes are
the arrays' bytes as CuPy receives them (float32 data, int32 ids), not
rounded: pools round.  An array is freed when its last holder lets it go,
a holder being the program's variable or a function node that retains it
for backward (Chainer's ``retain_inputs`` / ``retain_outputs``) until the
graph is deleted after ``loss.backward()``; in
training, parameters' gradients live from the backward that makes them to
the next iteration's ``cleargrads()`` (after its forward), and the
optimizer's state is made by the first update.  The metadata say which
member, seed and parameters made the run, ``how`` in a line, and each
iteration's ``shapes`` (lengths, batch or resolution).

These are generated, not measured (``metadata["synthetic"]`` is True), and
each model condenses what the frameworks do where the full detail would
only multiply small requests: each docstring says where.

One module per part: :mod:`.arrays` (the arrays and parameters every model
writes through), :mod:`.lstm_model` (the seq2seq model) and :mod:`.lstm` (its four
members), :mod:`.cnn` (the ResNet members), :mod:`.recorded` (the recorded run);
this module names the family.  Tested in ``tests/test_workloads.py`` (and through
the pool in ``tests/test_variable_workloads.py``).

Core module: numpy only (its seeded ``Generator``), no CuPy, no Chainer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from ..runs import Run, write_run
from .cnn import cnn_resolutions, serving
from .lstm import LstmModel, lstm_bucketed, lstm_growing, lstm_outliers, lstm_random
from .recorded import RECORDED_RUN, seq2seq_recorded

__all__ = ["FAMILY", "make", "names", "write", "lstm_random", "lstm_bucketed",
           "lstm_growing", "lstm_outliers", "serving", "cnn_resolutions", "seq2seq_recorded",
           "RECORDED_RUN", "LstmModel"]


#: The family, in order: name -> generator ``f(seed=0, *, iterations, scale, ...) -> Run``.
FAMILY: dict[str, Callable[..., Run]] = {
    "lstm-random": lstm_random,
    "lstm-bucketed": lstm_bucketed,
    "lstm-growing": lstm_growing,
    "lstm-outliers": lstm_outliers,
    "serving": serving,
    "cnn-resolutions": cnn_resolutions,
    "seq2seq-recorded": seq2seq_recorded,
}


def names() -> list[str]:
    """The members' names, in order."""
    return list(FAMILY)


def make(name: str, seed: int = 0, **options: Any) -> Run:
    """The run of member ``name`` for ``seed`` (``options``: its keywords)."""
    try:
        generator = FAMILY[name]
    except KeyError:
        raise ValueError(f"no workload {name!r}; the family is {', '.join(FAMILY)}") from None
    return generator(seed, **options)


def write(name: str, path: str | Path, seed: int = 0, **options: Any) -> Run:
    """Write member ``name``'s run for ``seed`` to a run file (``.run.json.gz``) for
    inspection with any reader of pgmo traces; returns the run."""
    run = make(name, seed, **options)
    write_run(run, path)
    return run
