"""scripts.record_runs and its NumPy mirror: whole runs of the examples recorded on the CPU."""

from __future__ import annotations

import contextlib
import importlib
from pathlib import Path

import numpy as np
import pytest

import pgmo
from pgmo.runs import Run, RunRecorder, read_run

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "pgmo" / "traces" / "runs"
BUNDLED = {"resnet50-train-b32-cpu": 4, "seq2seq-train-b64-30batches-cpu": 30}


def _script(name: str):
    try:
        import pgmo.chainer  # noqa: F401  (the compatibility layer before Chainer)
    except ImportError as exc:  # pgmo.chainer says how to install Chainer
        pytest.skip(str(exc))
    pytest.importorskip("cupy")
    return importlib.import_module(f"scripts.{name}")


@pytest.fixture
def record_runs():
    return _script("record_runs")


@pytest.fixture
def mirror_module():
    return _script("numpy_mirror")


@contextlib.contextmanager
def installed(record_runs):
    """A RunRecorder installed as CuPy's allocator, as record_runs installs it."""
    import cupy

    rec = RunRecorder()
    with cupy.cuda.using_allocator(record_runs.RecorderAllocator(rec).malloc):
        yield rec


def sizes(rec: RunRecorder) -> list[int]:
    return [b.size for b in rec.run().trace.blocks]


def test_the_mirror_asks_the_allocator_installed_in_cupy(record_runs, mirror_module):
    import chainer.functions as F

    x = np.ones((4, 8), np.float32)
    with installed(record_runs) as rec, mirror_module.NumpyMirror():
        y = F.relu(x)
    assert sizes(rec) == [128, 128]  # x, then relu's output
    with installed(record_runs) as other:
        F.relu(x)  # no mirror: NumPy never calls CuPy's allocator
    assert sizes(other) == []
    del y


def test_a_block_lives_as_long_as_its_array(record_runs, mirror_module):
    import chainer.functions as F

    with installed(record_runs) as rec, mirror_module.NumpyMirror():
        x = np.ones(16, np.float32)
        y = F.relu(x)
        del x  # y's creator keeps nothing of x (relu retains its output): x dies
        z = F.relu(y)
        del y, z
    x_, y_, z_ = rec.run().trace.blocks
    assert x_.upper is not None and x_.upper < z_.lower
    assert y_.upper is not None and z_.upper is not None


def test_views_are_requested_once_as_their_base(record_runs, mirror_module):
    import chainer.functions as F

    x = np.ones((4, 8), np.float32)
    with installed(record_runs) as rec, mirror_module.NumpyMirror():
        F.relu(x[1:3])
        F.relu(x.T)
        F.relu(x)
    assert sizes(rec) == [128, 64, 128, 128]  # x once, whole; the three outputs


def test_a_view_a_function_cuts_from_its_own_temporary_counts_alone(record_runs,
                                                                    mirror_module):
    import chainer

    class Padded(chainer.FunctionNode):  # as col2im_cpu returns the inside of a padded image
        def forward(self, inputs):
            padded = np.zeros((6, 10), np.float32)
            return padded[1:5, 1:9],

    x = np.ones((4, 8), np.float32)
    with installed(record_runs) as rec, mirror_module.NumpyMirror():
        Padded().apply((x,))
    assert sizes(rec) == [128, 128]  # not the padded 240 bytes


def test_convolution_temporaries_are_modelled_from_the_shapes(record_runs, mirror_module):
    import chainer.functions as F

    x = np.ones((2, 3, 8, 8), np.float32)
    w = np.ones((5, 3, 3, 3), np.float32)
    with installed(record_runs) as rec, mirror_module.NumpyMirror():
        F.convolution_2d(x, w)
    y = 2 * 5 * 6 * 6 * 4
    col = 2 * 3 * 3 * 3 * 6 * 6 * 4
    blocks = rec.run().trace.blocks
    # x, W, then CuPy's unused output, im2col, tensordot's copy, the output
    assert [b.size for b in blocks] == [x.nbytes, w.nbytes, y, col, col, y]
    assert all(b.upper is not None and blocks[5].lower < b.upper for b in blocks[2:5])


def tiny_linear_setup(record_runs):
    import chainer
    import chainer.links as L

    data = chainer.datasets.TupleDataset(np.ones((8, 3), np.float32),
                                         np.zeros(8, np.int32))

    def setup():
        model = L.Classifier(L.Linear(3, 2))
        return record_runs._updater(model, chainer.optimizers.MomentumSGD(), data, 4,
                                    shuffle=False)

    return setup


def test_gradients_and_optimizer_state_are_seen(record_runs):
    run, facts = record_runs.record(tiny_linear_setup(record_runs), 3)
    assert len(run.iterations) == 3
    w, b = 2 * 3 * 4, 2 * 4
    blocks = run.trace.blocks
    where = run.iteration_of()
    kept = [(where[i], blk.size) for i, blk in enumerate(blocks) if blk.upper is None]
    assert {(-1, w), (-1, b)} <= set(kept)  # the weights, made with the model
    assert sorted(size for k, size in kept if k == 0) == [b, w]  # momentum: the first update
    assert {(2, w), (2, b)} <= set(kept)  # the last update's gradients
    assert facts["mirror_blocks"]["optimizer state"] == 2
    # W, its initial NaN gradient, momentum, and the gradient of each update: each
    # update's gradients replace the ones before (freed by cleargrads)
    assert sum(blk.size == w for blk in blocks) == 1 + 1 + 1 + 3
    assert [where[i] for i, blk in enumerate(blocks) if blk.size == w and blk.upper] == \
        [-1, 0, 1]


def test_a_tiny_resnet50_run_file_is_valid(record_runs, tmp_path):
    record_runs.main(["--workload", "resnet50", "--iterations", "2", "--batchsize", "2",
                      "--insize", "32", "--classes", "10", "--out-dir", str(tmp_path)])
    run = read_run(tmp_path / "resnet50-train-b2-2it-cpu.run.json.gz")
    check_whole_run(run, iterations=2)
    assert run.metadata["batch_size"] == 2 and run.metadata["capture"] == "mirror"
    counts = run.metadata["mirror_blocks"]
    assert counts["modelled temporary"] > 0 and counts["optimizer state"] == 161


def test_a_tiny_seq2seq_run_file_is_valid(record_runs, tmp_path):
    record_runs.main(["--workload", "seq2seq", "--iterations", "3", "--batchsize", "4",
                      "--vocab", "50", "--units", "16", "--layers", "1", "--sentences", "40",
                      "--out-dir", str(tmp_path)])
    run = read_run(tmp_path / "seq2seq-train-b4-3batches-cpu.run.json.gz")
    check_whole_run(run, iterations=3)
    assert run.metadata["vocab"] == 50 and run.metadata["optimizer"] == "Adam()"
    # Adam's two moments per parameter are made by the first update and kept
    seq2seq = _script("examples").load("seq2seq")
    parameters = len(list(seq2seq.Seq2seq(50, 16, 1).params()))
    assert run.metadata["mirror_blocks"]["optimizer state"] == 2 * parameters


def check_whole_run(run: Run, iterations: int) -> None:
    """Iterations marked, the model built before them, sizes positive, open blocks kept on purpose."""
    assert len(run.iterations) == iterations
    assert all(b.size > 0 for b in run.trace.blocks)
    where = run.iteration_of()
    assert where[0] == -1  # the model is built before the first update
    assert set(where) == {-1, *range(iterations)}
    open_blocks = [b for b in run.trace.blocks if b.upper is None]
    # what lives on after training: weights, gradients, optimizer state (and nothing
    # made in a forward or backward pass but the last loss)
    assert sum(b.size for b in open_blocks) <= run.long_lived_bytes() + 64
    meta = run.metadata
    assert meta["synthetic"] is False and meta["measured_on_gpu"] is False
    assert "not a GPU measurement" in meta["note"]


def test_the_numpy_capture_logs_every_numpy_allocation_in_order(tmp_path):
    pytest.importorskip("numpy_allocator")
    numpy_allocations = _script("numpy_allocations")

    rec = RunRecorder()
    with numpy_allocations.NumpyAllocations(rec) as allocations:
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


def test_an_iteration_is_cut_as_the_gpu_trace_was_taken():
    fidelity = _script("mirror_fidelity")
    rec = RunRecorder()
    before = rec.alloc(100)  # last update's gradient
    kept = rec.alloc(1000)  # a weight
    rec.begin()
    rec.free(before)
    a = rec.alloc(513)
    b = rec.alloc(10)
    rec.free(a)
    rec.end()
    rec.free(b)  # freed after the iteration: open in its trace
    del kept
    run = rec.run()
    profiled = fidelity.iteration_trace(run, 0, "profiled")
    assert [(x.size, x.upper is None) for x in profiled.blocks] == [(1024, False), (512, True)]
    stock = fidelity.iteration_trace(run, 0, "stock")
    assert sorted(x.size for x in stock.blocks) == [10, 100, 513]
    planned = fidelity.iteration_trace(run, 0, "planned")  # survivors outside the plan
    assert [x.size for x in planned.blocks] == [1024]


def test_a_recording_is_compared_with_the_h100_trace_it_stands_for():
    fidelity = _script("mirror_fidelity")
    row = fidelity.compare("alexnet", "mirror", ["--insize", "67", "--batchsize", "2",
                                                 "--classes", "10"])
    assert row["gpu"]["requests"] == 131 and row["gpu"]["lower_bound"] == 1013874176
    assert 0 < row["cpu"]["lower_bound"] < row["gpu"]["lower_bound"]  # a far smaller batch
    assert row["cpu"]["largest"] == sorted(row["cpu"]["largest"], reverse=True)
    assert "| alexnet (profiled) | mirror |" in fidelity.table([row])


@pytest.mark.parametrize("name, iterations", sorted(BUNDLED.items()))
def test_the_bundled_runs_carry_their_provenance(name, iterations):
    run = read_run(RUNS / f"{name}.run.json.gz")
    assert len(run.iterations) == iterations
    meta = run.metadata
    assert meta["synthetic"] is False and meta["measured_on_gpu"] is False
    assert meta["recorded_by"].startswith("scripts/record_runs.py")
    assert meta["command"].startswith("record_runs.py") and meta["date"]
    assert meta["device"].startswith("CPU (NumPy") and "not a GPU measurement" in meta["note"]
    assert meta["chainer"] and meta["numpy"] and meta["pgmo"]
    assert {"alexnet", "densenet"} <= {row["workload"] for row in meta["fidelity"]["rows"]}
    assert meta["pgmo_commit"]
    assert run.lower_bound() > run.long_lived_bytes() > 0
    assert all(b.size > 0 for b in run.trace.blocks)


def test_the_bundled_runs_are_packaged():
    setup_cfg = (ROOT / "setup.cfg").read_text()
    assert "traces/runs/*.run.json.gz" in setup_cfg
    assert sorted(p.name for p in RUNS.glob("*.run.json.gz")) == \
        sorted(f"{name}.run.json.gz" for name in BUNDLED)
    assert pgmo.__version__
