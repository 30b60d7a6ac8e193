"""The recorded member of the family: the bundled seq2seq run, cut and scaled on request.

Tested in ``tests/test_workloads.py``.

Core module: no CuPy, no Chainer.
"""

from __future__ import annotations

import math
from pathlib import Path

from ..runs import Run, read_run
from ..trace import Block, Trace
from .arrays import check_options

#: The bundled recorded run behind ``seq2seq-recorded``.
RECORDED_RUN = (Path(__file__).parents[1] / "traces" / "runs"
                / "seq2seq-train-b64-30batches-cpu.run.json.gz")


_recorded_cache: dict[str, Run] = {}


def _recorded() -> Run:
    key = str(RECORDED_RUN)
    if key not in _recorded_cache:
        _recorded_cache[key] = read_run(RECORDED_RUN)
    return _recorded_cache[key]


def seq2seq_recorded(seed: int = 0, *, iterations: int = 30, scale: float = 1.0) -> Run:
    """The bundled recorded run: Chainer's seq2seq example (3 x 512 LSTM, batch 64,
    vocabulary 40,000, sentences of 1-50 words, Adam) for 30 batches, its arrays'
    allocations captured on the CPU (see its metadata's ``recorded_by`` and ``note``).

    ``seed`` is ignored: the run is what was recorded.  ``iterations`` keeps the first
    ones (at most 30): requests after the last kept iteration are dropped and blocks
    freed after it stay open.  ``scale`` multiplies every size (at least one byte).
    Unlike the generated members it has about 12,500 requests per iteration (375,000 in
    all): the generic path's every array, per-sentence arrays and stacked weights
    included.
    """
    check_options(iterations, scale)
    run = _recorded()
    if iterations > len(run.iterations):
        raise ValueError(f"{RECORDED_RUN.name} has {len(run.iterations)} iterations; "
                         f"asked for {iterations}")
    blocks = run.trace.blocks
    kept = list(run.iterations[:iterations])
    if iterations < len(run.iterations) or scale != 1.0:
        cut = kept[-1][1] if iterations < len(run.iterations) else None
        out = []
        for b in blocks:
            if cut is not None and b.lower >= cut:
                continue
            upper = b.upper if cut is None or (b.upper is not None and b.upper <= cut) else None
            size = b.size if scale == 1.0 else max(1, math.ceil(b.size * scale))
            out.append(Block(b.id, b.lower, upper, size))
        blocks = tuple(out)
    meta = {k: v for k, v in run.metadata.items() if k != "iterations"}
    meta.update(workload="seq2seq-recorded", seed=seed,
                how="Chainer's seq2seq example, 3x512 LSTM, batch 64, recorded on the CPU",
                parameters=dict(iterations=iterations, scale=scale), shapes=None,
                iterations=[list(it) for it in kept])
    return Run(Trace(blocks, meta), tuple(kept))
