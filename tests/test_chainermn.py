"""ChainerMN data-parallel training with one pgmo pool per rank, on the CPU under ``mpiexec -n 2``.

Every MPI job runs in subprocesses, as users start it: the example
``examples/train_mn.py --device -1`` (Chainer on NumPy, so the pools see no
requests: the checks are ChainerMN's, with pgmo's extension installed), and
``tests/mn_replay.py``, where each rank replays a bundled trace through the
pool that :func:`pgmo.chainermn.setup_rank` gives it.  MPI never starts in the
pytest process itself.
"""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

import pgmo
from pgmo import _chainer_compat, bundled
from pgmo.units import round_size

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "train_mn.py")
REPLAY = os.path.join(ROOT, "tests", "mn_replay.py")
TRAINER = os.path.join(ROOT, "tests", "mn_trainer.py")

pytest.importorskip("cupy")
_chainer_compat.apply()
pytest.importorskip("chainer")
pytest.importorskip("mpi4py", reason="needs mpi4py and an MPI (pip install 'pgmo[mpi]')")

#: The mpiexec installed beside this Python (the mpich wheel puts it there), else on PATH.
MPIEXEC = shutil.which("mpiexec", path=os.path.dirname(sys.executable)) or shutil.which("mpiexec")

pytestmark = [pytest.mark.chainer, pytest.mark.mpi,
              pytest.mark.skipif(MPIEXEC is None, reason="needs mpiexec (pip install mpich)")]


def mpirun(n, *args, timeout=240, check=True):
    """Run ``python ARGS`` as ``n`` MPI ranks; the finished process."""
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    result = subprocess.run([MPIEXEC, "-n", str(n), sys.executable, *map(str, args)],
                            capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    if check:
        assert result.returncode == 0, f"{args}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


SMOKE = ["--device", -1, "--arch", "mlp", "--insize", 8, "--batchsize", 4, "--classes", 4]


def rank_table(output):
    """The example's table of ranks: one dict per row, by column name."""
    lines = output[output.index("Every rank's pgmo pool"):].splitlines()
    rules = [i for i, line in enumerate(lines) if line.startswith("---")]
    header = re.split(r"\s{2,}", lines[rules[0] + 1].strip())
    rows = [re.split(r"\s{2,}", line.strip()) for line in lines[rules[1] + 1:rules[2]]]
    return [dict(zip(header, row)) for row in rows]


def report_lines(output):
    """PrintReport's lines (rank 0's log, above the table), split into fields."""
    log = output[:output.index("Every rank's pgmo pool")]
    return [line.split() for line in log.splitlines() if re.match(r"\d+\s", line)]


@pytest.mark.parametrize("communicator, name", [("auto", "NaiveCommunicator"),
                                                ("host_staged", "HostStagedCommunicator")])
def test_example_keeps_parameters_identical_across_ranks(communicator, name):
    out = mpirun(2, EXAMPLE, *SMOKE, "--iterations", 5, "--communicator", communicator).stdout
    rows = rank_table(out)
    assert [row["rank"] for row in rows] == ["0", "1"]
    assert all(row["device"] == "CPU" for row in rows)
    # Every update ran as one iteration of the rank's pool, under the multi-node optimizer.
    assert [row["iters"] for row in rows] == ["5", "5"]
    # Each rank started from its own random weights; rank 0's were broadcast, gradients
    # averaged: after training every rank holds the same parameters.
    assert rows[0]["params at start"] != rows[1]["params at start"]
    assert rows[0]["params at end"] == rows[1]["params at end"]
    assert rows[0]["params at end"] != rows[0]["params at start"]
    assert "parameters identical on all 2 ranks: yes" in out
    assert f"({name};" in out
    report = report_lines(out)
    assert [r[0] for r in report] == ["1", "2", "3", "4", "5"]  # only rank 0 reports
    assert len(report[-1]) == 4  # the multi-node evaluator's loss at the last iteration
    assert all(len(r) == 3 for r in report[:-1])  # iteration, loss, time
    # On the CPU the pools receive no request: no counts beside n/a, and a pipe gets the
    # lines without the terminal's escape codes.
    assert "pgmo/" not in out and "\x1b" not in out


def test_extension_serves_each_ranks_requests_under_the_multi_node_optimizer(tmp_path):
    """A model that allocates through CuPy's allocator: each rank's pool really serves it."""
    iterations = 6
    mpirun(2, TRAINER, tmp_path, iterations)
    per_update = 5  # the requests of tests/allocating_model.py's PATTERN
    for r in (0, 1):
        got = json.loads((tmp_path / f"trainer{r}.json").read_text())
        stats = got["stats"]
        assert stats["iterations"] == iterations and stats["mode"] == "optimized"
        # Two warm-up updates, one profiled, then every update from the plan; the
        # multi-node evaluator's requests, between updates, left the plan alone.
        assert stats["profiled_requests"] == 3 * per_update
        assert stats["planned_requests"] == (iterations - 3) * per_update
        assert stats["departed_requests"] == stats["departures"] == 0
        assert stats["requests"] > iterations * per_update  # the evaluator's, outside the plan
        assert got["allocator_restored"]


def test_host_staged_communicator_writes_the_averages_back_into_the_arrays():
    """As on a GPU, where the host copy is another buffer: MPI works on it, the result goes back."""
    code = f"""
import runpy, sys, numpy
import pgmo.chainermn
pgmo.chainermn._to_host = lambda array: numpy.array(array, copy=True)
sys.argv = [{EXAMPLE!r}] + {[str(a) for a in SMOKE]!r} + ["--iterations", "4", "-c", "host_staged"]
runpy.run_path({EXAMPLE!r}, run_name="__main__")
"""
    rows = rank_table(mpirun(2, "-c", code).stdout)
    assert rows[0]["params at start"] != rows[1]["params at start"]
    assert rows[0]["params at end"] == rows[1]["params at end"]


def test_auto_takes_nccl_only_when_every_rank_has_a_gpu_of_its_own():
    """Two ranks on this node, with the GPU count and NCCL's presence played."""
    code = """
import json, cupy, pgmo.chainermn as mn, chainermn.nccl
from mpi4py import MPI
picks = []
for gpus, nccl in ((1, True), (2, True), (2, False), (4, True)):
    cupy.cuda.runtime.getDeviceCount = lambda: gpus
    chainermn.nccl._available = nccl
    picks.append(mn.choose_communicator())
every_rank = MPI.COMM_WORLD.gather(picks)
if MPI.COMM_WORLD.rank == 0:
    print(json.dumps(every_rank))
"""
    out = mpirun(2, "-c", code).stdout.splitlines()
    assert json.loads(out[-1]) == [
        ["host_staged", "pure_nccl", "host_staged", "pure_nccl"]] * 2  # the same on each rank


def test_example_refuses_a_gpu_communicator_on_the_cpu():
    result = mpirun(1, EXAMPLE, *SMOKE, "--iterations", 1, "--communicator", "pure_nccl",
                    check=False)
    assert result.returncode != 0
    assert "the pure_nccl communicator needs GPUs; on the CPU use naive or auto" in \
        result.stderr


@pytest.mark.parametrize("args, message", [
    (["--iterations", 0], "--iterations must be at least 1, got 0"),
    (["--arch", "resnet50", "--insize", 4], "--insize 4 is too small for resnet50 (at least 8)"),
])
def test_example_rejects_bad_arguments(args, message):
    result = mpirun(1, EXAMPLE, "--device", -1, *args, check=False)
    assert result.returncode != 0
    assert message in result.stderr


def test_ctrl_c_stops_every_rank_with_one_line_and_no_hang():
    """Ctrl-C from the terminal (SIGINT to the whole job) while the ranks train: the job ends
    at once, exit status 130, with ``interrupted`` and no traceback; a rank that stopped
    used to wait in MPI's finalize for one still in a collective, which waited for it."""
    import signal
    import threading
    import time

    env = dict(os.environ, PYTHONWARNINGS="ignore")
    proc = subprocess.Popen([MPIEXEC, "-n", "2", sys.executable, EXAMPLE, *map(str, SMOKE),
                             "--iterations", "100000"], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)  # its own group, as a terminal's job
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 120
        while sum("of 2 on" in line for line in lines) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)  # both ranks have their pool: they train
        assert proc.poll() is None, "".join(lines)
        time.sleep(1.0)
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    reader.join(10)
    err = "".join(lines)
    assert proc.returncode == 130, err[-3000:]
    assert "train_mn.py: interrupted" in err and "Traceback" not in err


def test_each_rank_plans_its_own_trace_in_its_own_pool(tmp_path):
    iterations = 6
    mpirun(2, REPLAY, tmp_path, iterations)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert {r["trace"] for r in ranks} == {"synthetic-resnet50-infer-b1",
                                           "synthetic-seq2seq-train-b64"}
    for r in ranks:
        trace = bundled.load(r["trace"])
        stats = r["stats"]
        assert r["communicator"] == "NaiveCommunicator" and r["device"] == "@numpy"
        # Two warm-up iterations (ChainerMN's first update only broadcasts), one
        # profiled, then every hot iteration from the plan with no fallback at all.
        assert r["modes"] == ["warmup", "warmup", "profiling"] + ["optimized"] * (iterations - 3)
        assert stats["mode"] == "optimized"
        assert stats["departed_requests"] == 0 and stats["departures"] == 0
        assert stats["planned_requests"] == (iterations - 3) * len(trace)
        assert r["corrupted"] == 0 and r["overlaps"] == 0
        # The rank's plan is of its own requests, saved in its own file.
        assert r["plan_saved"]
        assert os.path.basename(r["plan_path"]) == f"pgmo-plan.rank{r['rank']}.json"
        plan = pgmo.read_plan(r["plan_path"])
        assert sorted(b.size for b in plan.trace.blocks) == \
            sorted(round_size(b.size) for b in trace.blocks)
        assert stats["lower_bound"] == plan.trace.lower_bound() <= stats["planned_peak"]
    assert ranks[0]["plan_path"] != ranks[1]["plan_path"]
    assert ranks[0]["stats"]["lower_bound"] != ranks[1]["stats"]["lower_bound"]
    # Rank 0 collected every rank's statistics, in rank order; the others got None.
    gathered = ranks[0]["gathered"]
    assert ranks[1]["gathered"] is None
    assert [g["rank"] for g in gathered] == [0, 1]
    assert [g["stats"]["planned_requests"] for g in gathered] == \
        [r["stats"]["planned_requests"] for r in ranks]
    assert [g["plan_path"] for g in gathered] == [r["plan_path"] for r in ranks]


def test_setup_rank_defaults_and_communicator_names():
    code = """
import json, pgmo.chainermn as mn
comm = mn.create_communicator(gpu=False)
rank = mn.setup_rank(comm, gpu=False)
late = mn.setup_rank(comm, gpu=False, warmup=5)
errors = []
for name, gpu in (("nope", False), ("flat", False)):
    try:
        mn.create_communicator(name, gpu=gpu)
    except ValueError as e:
        errors.append(str(e))
print(json.dumps({"communicator": type(comm).__name__, "auto": mn.choose_communicator(gpu=False),
                  "warmup": rank.pool.engine.options.warmup,
                  "late": late.pool.engine.options.warmup,
                  "plan_path": rank.plan_path, "device_id": rank.device_id, "errors": errors}))
"""
    got = json.loads(mpirun(1, "-c", code).stdout.splitlines()[-1])
    assert got == {"communicator": "NaiveCommunicator", "auto": "naive", "warmup": 2, "late": 5,
                   "plan_path": None, "device_id": -1,
                   "errors": ["unknown communicator 'nope'; choose from auto, host_staged, "
                              "pure_nccl, flat, naive, non_cuda_aware",
                              "the flat communicator needs GPUs; on the CPU use naive or auto"]}
