"""scripts/record_runs.py: whole runs of the examples recorded on the CPU, and the bundled ones."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pgmo.runs import read_run

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "pgmo" / "traces" / "runs"


@pytest.fixture
def record_runs():
    pytest.importorskip("pgmo.chainer")  # the compatibility layer before Chainer
    pytest.importorskip("numpy_allocator")
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import record_runs as module
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    return module


def test_every_numpy_allocation_is_logged_in_order_views_once(record_runs):
    import numpy as np

    from pgmo.runs import RunRecorder

    rec = RunRecorder()
    with record_runs.NumpyAllocations(rec) as allocations:
        a = np.ones(1000, np.float32)  # 4,000 bytes
        view = a[10:20]  # no allocation of its own
        allocations.begin()
        b = a * 2  # 4,000 more
        del a, view  # a's data goes only when its last view does
        c = np.zeros((8, 8))  # 512
        del b
        allocations.end()
        del c
    run = rec.run()
    arrays = [blk for blk in run.trace.blocks if blk.size >= 512]  # NumPy's scalars aside
    assert [blk.size for blk in arrays] == [4000, 4000, 512]
    a_, b_, c_ = arrays
    assert a_.lower < run.iterations[0][0] <= b_.lower < a_.upper < c_.lower < b_.upper
    assert c_.upper >= run.iterations[0][1]  # freed after the iteration ended


def test_a_tiny_seq2seq_run_is_recorded_whole(record_runs, tmp_path):
    record_runs.main(["--workload", "seq2seq", "--iterations", "3", "--batchsize", "4",
                      "--vocab", "50", "--units", "16", "--layers", "1", "--sentences", "40",
                      "--out-dir", str(tmp_path)])
    run = read_run(tmp_path / "seq2seq-train-b4-3it-cpu.run.json.gz")
    assert len(run.iterations) == 3 and len(run) > 0
    where = run.iteration_of()
    assert -1 in where  # the model was built before the first update
    assert all(b.size > 0 for b in run.trace.blocks)
    # Adam's two states per parameter are made by the first update and kept
    assert run.long_lived_bytes() > 0
    meta = run.metadata
    assert meta["synthetic"] is False and meta["measured_on_gpu"] is False
    assert "not a GPU measurement" in meta["note"] and meta["vocab"] == 50


@pytest.mark.parametrize("name, iterations", [("resnet50-train-b32-4it-cpu", 4),
                                              ("seq2seq-train-b64-30it-cpu", 30)])
def test_the_bundled_runs_carry_their_provenance(name, iterations):
    path = RUNS / f"{name}.run.json.gz"
    run = read_run(path)
    assert len(run.iterations) == iterations
    meta = run.metadata
    assert meta["synthetic"] is False and meta["measured_on_gpu"] is False
    assert meta["recorded_by"].startswith("scripts/record_runs.py")
    assert meta["command"].startswith("record_runs.py") and meta["date"]
    assert run.lower_bound_rounded() > run.long_lived_bytes() > 0
