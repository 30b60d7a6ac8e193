"""The LSTM members of the family: seq2seq training on lengths that vary by iteration.

Each generator only draws its iterations' encoder and decoder lengths; one
runner (:func:`_lstm_run`) trains :class:`~pgmo.workloads.lstm_model.Seq2seq` on
them, so the four members differ in their lengths alone.  Tested in
``tests/test_workloads.py`` (and through the pool in ``tests/test_variable_workloads.py``).

Core module: numpy only (its seeded ``Generator``), no CuPy, no Chainer.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, Sequence

import numpy as np

from ..runs import Run, RunRecorder
from .arrays import Arrays, check_options, finish_run, pair
from .lstm_model import LstmModel, Seq2seq


def _lstm_run(workload: str, seed: int, lengths: list[tuple[int, int]],
              drawn: dict[str, Any], how: str, *, iterations: int, scale: float,
              model: LstmModel, **extra: Any) -> Run:
    """The run of ``model`` trained on ``lengths`` (one (encoder, decoder) pair per
    iteration); ``drawn``: the member's own parameters, ``how``: how it drew the lengths."""
    recorder = RunRecorder()
    seq2seq = Seq2seq(Arrays(recorder, scale), model)
    for k, (src_len, tgt_len) in enumerate(lengths):
        recorder.begin()
        seq2seq.iteration(k == 0, src_len, tgt_len)
        recorder.end()
    parameters = dict(iterations=iterations, scale=scale, **drawn, **asdict(model))
    return finish_run(recorder, workload, seed, f"{model.how()}, {how}", parameters,
                      [[int(a), int(b)] for a, b in lengths], **extra)


_LSTM_DOC = """
    The model, as Chainer 7's seq2seq example runs it on the GPU without cuDNN (the
    generic NStepLSTM path), float32, Adam:

    * weights (embeddings V x H for each side, per LSTM layer the gates' x- and
      h-weights and their biases, the output layer H x V and V) made in the first
      iteration and kept; their gradients made by each backward pass and dropped by the
      next iteration's ``cleargrads()``; Adam's m and v per parameter made by the first
      update and kept;
    * per iteration the batch's ids (int32) on the device; the source embedded and
      transposed to one (B, H) array per step; per encoder step and layer the linear
      outputs (a temporary), the gates (B, 4H), c and h, retained for backward; the
      final states stacked for the decoder, which does the same per decoder step;
      the output layer over the vocabulary (see ``output``);
    * backward in reverse order of creation: the gradients of what forward kept, each
      freed once the function that takes it has run back; what the function nodes
      retained lives until the graph is deleted after ``loss.backward()`` (``del loss``),
      as in the project's recordings of Chainer; then the update, then the batch goes.

    Condensed: per-sentence arrays of the example are one block per batch; gradients
    reaching one array from two places, and parameter gradients from later steps, are
    added in place (Chainer adds out of place: a new array each time); lstm's two
    gradients per step are one block; with ``stacked_weights`` each step also keeps the
    generic path's stacked copy of its weights (4H x 2H) and frees a gradient of it.
"""



def lstm_random(seed: int = 0, *, iterations: int = 30, scale: float = 1.0,
                min_len: int = 1, max_len: int = 50, batch: int = 64, units: int = 512,
                layers: int = 3, vocab: int = 16000, stacked_weights: bool = False,
                output: str = "concat") -> Run:
    """Encoder-decoder LSTM training with random lengths: each iteration's encoder and
    decoder lengths drawn uniformly, independently, from ``min_len..max_len``.
    """
    check_options(iterations, scale)
    if not 1 <= min_len <= max_len:
        raise ValueError(f"lengths need 1 <= min_len <= max_len, got {min_len}..{max_len}")
    rng = np.random.default_rng(seed)
    lengths = [pair(rng.integers(min_len, max_len + 1, size=2)) for _ in range(iterations)]
    return _lstm_run("lstm-random", seed, lengths, dict(min_len=min_len, max_len=max_len),
                     f"encoder and decoder lengths uniform {min_len}..{max_len}",
                     iterations=iterations, scale=scale,
                     model=LstmModel(batch, units, layers, vocab, stacked_weights, output))


def lstm_bucketed(seed: int = 0, *, iterations: int = 30, scale: float = 1.0,
                  buckets: Sequence[int] = (10, 20, 30, 40, 50), batch: int = 64,
                  units: int = 512, layers: int = 3, vocab: int = 16000,
                  stacked_weights: bool = False, output: str = "concat") -> Run:
    """Encoder-decoder LSTM training on sorted batches: each batch holds sentences of one
    bucket, padded to its length, so encoder and decoder both run the bucket's length;
    each iteration's bucket drawn uniformly.  A shape recurs (about iterations / buckets
    times each).
    """
    check_options(iterations, scale)
    if not buckets or min(buckets) < 1:
        raise ValueError(f"buckets must be lengths >= 1, got {buckets!r}")
    rng = np.random.default_rng(seed)
    choice = rng.integers(0, len(buckets), size=iterations)
    lengths = [(int(buckets[c]), int(buckets[c])) for c in choice]
    return _lstm_run("lstm-bucketed", seed, lengths, dict(buckets=list(buckets)),
                     f"sorted batches padded to buckets {list(buckets)}",
                     iterations=iterations, scale=scale,
                     model=LstmModel(batch, units, layers, vocab, stacked_weights, output))


def lstm_growing(seed: int = 0, *, iterations: int = 30, scale: float = 1.0,
                 start: int = 5, stop: int = 50, batch: int = 64, units: int = 512,
                 layers: int = 3, vocab: int = 16000, stacked_weights: bool = False,
                 output: str = "concat") -> Run:
    """Encoder-decoder LSTM training under a curriculum: iteration k's longest length
    rises linearly from ``start`` (first iteration) to ``stop`` (last); its encoder and
    decoder lengths drawn uniformly from 1..that.
    """
    check_options(iterations, scale)
    if not 1 <= start <= stop:
        raise ValueError(f"the curriculum needs 1 <= start <= stop, got {start}..{stop}")
    rng = np.random.default_rng(seed)
    lengths = []
    for k in range(iterations):
        longest = start + round((stop - start) * k / max(1, iterations - 1))
        lengths.append(pair(rng.integers(1, longest + 1, size=2)))
    return _lstm_run("lstm-growing", seed, lengths, dict(start=start, stop=stop),
                     f"curriculum: longest length {start} rising to {stop}",
                     iterations=iterations, scale=scale,
                     model=LstmModel(batch, units, layers, vocab, stacked_weights, output))


def lstm_outliers(seed: int = 0, *, iterations: int = 30, scale: float = 1.0,
                  short: tuple[int, int] = (5, 15), rate: float = 0.05,
                  factor: tuple[float, float] = (3.0, 4.0), batch: int = 64,
                  units: int = 512, layers: int = 3, vocab: int = 16000,
                  stacked_weights: bool = False, output: str = "concat") -> Run:
    """Encoder-decoder LSTM training on mostly short lengths (uniform in ``short``) with
    rare long outliers: ``max(1, round(rate * iterations))`` iterations, drawn among all
    but the first, have both lengths ``factor`` (drawn uniformly) times a short one.
    """
    check_options(iterations, scale)
    low, high = short
    if not 1 <= low <= high:
        raise ValueError(f"short lengths need 1 <= low <= high, got {short!r}")
    if not 1 <= factor[0] <= factor[1]:
        raise ValueError(f"factor must be a range (low, high) with 1 <= low <= high, "
                         f"got {factor!r}")
    rng = np.random.default_rng(seed)
    lengths = [pair(rng.integers(low, high + 1, size=2))
               for _ in range(iterations)]
    count = min(iterations - 1, max(1, round(rate * iterations)))
    outliers = sorted(int(k) for k in rng.choice(np.arange(1, iterations), size=count,
                                                 replace=False)) if count > 0 else []
    for k in outliers:
        lengths[k] = pair([max(1, round(n * rng.uniform(*factor))) for n in lengths[k]])
    return _lstm_run("lstm-outliers", seed, lengths,
                     dict(short=list(short), rate=rate, factor=list(factor)),
                     f"lengths {low}..{high} with {len(outliers)} outliers at "
                     f"{factor[0]:g}-{factor[1]:g}x", iterations=iterations, scale=scale,
                     model=LstmModel(batch, units, layers, vocab, stacked_weights, output),
                     outliers=outliers)


for _f in (lstm_random, lstm_bucketed, lstm_growing, lstm_outliers):
    if _f.__doc__:  # None under python -OO
        _f.__doc__ += _LSTM_DOC
