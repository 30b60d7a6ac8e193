"""CPU dry runs of the GPU scripts, so that a session with a GPU runs them right the first time.

``scripts/record_traces.py`` and ``scripts/bench_memory.py`` are run as the
device session runs them, in a subprocess, with ``--device -1`` at tiny
sizes.  The checks: every output is labelled a dry run, no file could pass
for a recording, the tables have the columns the issue asks for, and no GPU
number is made up.  ``scripts/gpu_session.sh`` gets a syntax check.
"""

import gzip
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from pgmo import _chainer_compat

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = os.path.join(ROOT, "scripts")


def run_script(script, *args, timeout=240):
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    result = subprocess.run([sys.executable, os.path.join(SCRIPTS, script), *map(str, args)],
                            capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    assert result.returncode == 0, \
        f"{script} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result.stdout, result.stderr


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("script", ["gpu_session.sh", "fetch_gpu_wheels.sh"])
def test_shell_scripts_parse(script):
    subprocess.run(["bash", "-n", os.path.join(SCRIPTS, script)], check=True)


def test_gpu_session_writes_at_most_eight_files():
    """The device returns at most 8 files from $OUT: the script must not name more."""
    with open(os.path.join(SCRIPTS, "gpu_session.sh")) as fh:
        text = fh.read()
    outputs = set(re.findall(r'\$OUT/([A-Za-z0-9_.-]+)', text))
    assert "session.log" in outputs and "traces.tar.gz" in outputs
    assert len(outputs) <= 8, sorted(outputs)


needs_chainer = pytest.mark.chainer


def _chainer_or_skip():
    pytest.importorskip("cupy")
    _chainer_compat.apply()
    pytest.importorskip("chainer")


@needs_chainer
def test_record_traces_dry_run_is_labelled(tmp_path):
    _chainer_or_skip()
    out, _ = run_script("record_traces.py", "--device", -1, "--out-dir", tmp_path,
                        "--arch", "alexnet", "--batchsize", 2, "--inference", "--seq2seq", 2,
                        "--classes", 10, "--vocab", 50, "--units", 16, "--layers", 1,
                        "--seq2seq-batchsize", 4, "--sentences", 20, "--max-output", 5)
    assert "CPU DRY RUN" in out
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == sorted(f"{n}.dry-run.json.gz" for n in (
        "alexnet-train-b2", "alexnet-infer-b1", "seq2seq-train-b4-1", "seq2seq-train-b4-2",
        "seq2seq-infer-b1-1", "seq2seq-infer-b1-2"))
    import pgmo

    for name in names:
        with gzip.open(tmp_path / name, "rt") as fh:
            meta = json.load(fh)["metadata"]
        assert meta["dry_run"] is True and meta["synthetic"] is True
        assert "dry run" in meta["recorded_by"].lower() and "no GPU recording" in meta["note"]
        assert meta["device"].startswith("CPU")
        for key in ("model", "kind", "batch_size", "cupy", "chainer", "numpy", "date"):
            assert key in meta, key
        trace = pgmo.read_trace(tmp_path / name)  # a valid trace the solver accepts
        assert len(trace) == meta["requests"] > 0
        assert trace.lower_bound() == meta["lower_bound"]
    # Variable-length seq2seq batches give different profiles.
    a = pgmo.read_trace(tmp_path / "seq2seq-train-b4-1.dry-run.json.gz")
    b = pgmo.read_trace(tmp_path / "seq2seq-train-b4-2.dry-run.json.gz")
    assert a.metadata["source_lengths"] != b.metadata["source_lengths"]
    assert len(a) != len(b) or a.blocks != b.blocks


@needs_chainer
def test_record_traces_dry_run_refuses_the_bundled_folder():
    _chainer_or_skip()
    result = subprocess.run([sys.executable, os.path.join(SCRIPTS, "record_traces.py"),
                             "--device", "-1", "--out-dir", os.path.join(ROOT, "pgmo", "traces")],
                            capture_output=True, text=True, timeout=120, cwd=ROOT,
                            env=dict(os.environ, PYTHONWARNINGS="ignore"))
    assert result.returncode == 2 and "must not write into pgmo/traces" in result.stderr


MEMORY_HEADER = ("| model | task | batch | pool | peak device in use (MiB) "
                 "| peak pool total (MiB) | planned peak (MiB) | lower bound (MiB) "
                 "| planned / bound | ms/iter | pgmo mode | fallback reqs |")


@needs_chainer
def test_bench_memory_dry_run_prints_labelled_tables(tmp_path):
    _chainer_or_skip()
    report = tmp_path / "results.md"
    out, err = run_script("bench_memory.py", "--device", -1, "--arch", "alexnet",
                          "--no-inference", "--search-arch", "alexnet", "--search-probes", 1,
                          "--seq2seq-iterations", 2, "-o", report)
    assert report.read_text().strip() == out.strip()
    assert "CPU DRY RUN" in out and "- command: `python scripts/bench_memory.py --device -1" in out
    lines = out.splitlines()
    assert MEMORY_HEADER in lines
    rows = [line.split(" | ") for line in lines if line.startswith("| alexnet | train | 2 | ")]
    assert [r[3] for r in rows] == ["n/a (CPU)", "stock", "pgmo"]  # side by side, then each
    assert rows[0][3:] == ["n/a (CPU)"] * 4 + ["n/a (CPU) |"]
    rows = rows[1:]
    for row in rows:  # every measured cell is n/a on the CPU: no stand-in number leaks out
        cells = [c.strip(" |") for c in row[4:]]
        assert cells == ["n/a (CPU)"] * 8, row
    search = [line for line in lines if line.startswith("| alexnet | 96.0 |")]
    assert [line.split(" | ")[2] for line in search] == ["stock", "pgmo"]
    assert all(line.endswith("| n/a (CPU) | 1 |") for line in search)
    assert sum(1 for line in lines if re.match(r"- alexnet (stock|pgmo) batch \d+: "
                                               r"(fits|does not fit)$", line)) == 2
    seq = [line for line in lines if re.match(r"\| (stock|pgmo) \| 4 \| 2 \|", line)]
    assert len(seq) == 2 and all(line.count("n/a (CPU)") == 6 for line in seq)
    assert "skipped" not in out and "failed" not in err
    assert re.search(r"time per part: memory and time, first batch size and inference \d+ s, "
                     r"seq2seq \d+ s, largest batch \d+ s, memory and time, other batch "
                     r"sizes \d+ s, total \d+ s", out)


def test_largest_fitting_batch_bisects_within_the_probe_budget():
    sys.path.insert(0, SCRIPTS)
    try:
        from bench_memory import fit_text, largest_fitting_batch
    finally:
        sys.path.remove(SCRIPTS)
    for true_max in (0, 1, 7, 100, 1023, 1024):
        asked = []

        def fits(batch):
            asked.append(batch)
            return batch <= true_max

        lo, hi, used = largest_fitting_batch(fits, 1024, 20)
        assert (lo, hi) == (true_max, true_max + 1) and used == len(asked) <= 20
        assert len(set(asked)) == len(asked)
    lo, hi, used = largest_fitting_batch(lambda b: b <= 300, 1024, 3)
    assert used == 3 and lo <= 300 < hi and hi - lo > 1
    assert fit_text(lo, hi, 1024).startswith("between")
    assert fit_text(0, 1025, 1024) == "unknown (no probe ran)"
    assert fit_text(1024, 1025, 1024) == ">= 1024 (search max)"
    assert fit_text(0, 1, 1024) == "none (batch 1 does not fit)"
    assert fit_text(0, 40, 1024) == "below 40"
    lo, hi, used = largest_fitting_batch(lambda b: None, 1024, 5)
    assert (lo, hi, used) == (0, 1025, 1)


def _import_bench_memory():
    sys.path.insert(0, SCRIPTS)
    try:
        import bench_memory
    finally:
        sys.path.remove(SCRIPTS)
    return bench_memory


def _child_result(pool, pool_mib, ms, oom=False):
    """The dict a GPU child prints (shape of ``bench_memory.run_child``), with chosen values."""
    result = {"ok": not oom, "oom": oom, "iterations": 3 if oom else 7, "fits": not oom,
              "ms_per_iter": ms, "timed_iterations": 5, "peak_pool_bytes": pool_mib * 2**20,
              "peak_device_bytes": (pool_mib + 600) * 2**20,
              "baseline_device_bytes": 500 * 2**20, "final_pool_bytes": pool_mib * 2**20,
              "final_device_bytes": (pool_mib + 600) * 2**20}
    if pool == "pgmo":
        result["pgmo"] = {"mode": "optimized", "planned_peak": 300 * 2**20,
                          "lower_bound": 250 * 2**20, "arena_bytes": 300 * 2**20,
                          "fallback_requests": 0, "reoptimizations": 2, "departures": 3,
                          "planned_requests": 5000, "arena_failures": 0,
                          "total_bytes": pool_mib * 2**20}
    return result


def test_gpu_report_formats_child_results():
    """The GPU-only formatting path, fed the result shape a GPU child prints."""
    bm = _import_bench_memory()
    args = bm.parse_args(["--device", "0", "--arch", "resnet50", "--batchsize", "32", "64"])
    base = {"arch": "resnet50", "workload": "cnn-train"}
    runs = [({**base, "batch": 64, "pool": "pgmo"}, _child_result("pgmo", 400, 110.0)),
            ({**base, "batch": 32, "pool": "stock"}, _child_result("stock", 800, 100.0)),
            ({**base, "batch": 32, "pool": "pgmo"}, _child_result("pgmo", 400, 110.0)),
            ({**base, "batch": 64, "pool": "stock"}, _child_result("stock", 0, None, oom=True))]
    runs.sort(key=bm.run_order)
    assert [(c["batch"], c["pool"]) for c, _ in runs] == [
        (32, "stock"), (32, "pgmo"), (64, "stock"), (64, "pgmo")]
    seq = [bm.seq2seq_row(args, {"pool": "pgmo", "batch": 64}, _child_result("pgmo", 900, 50.0))]
    search = [("resnet50", bm.mib(args.memory_limit), "pgmo", bm.fit_text(90, 91, 1024), 6)]
    text = bm.report(args, {"device": "NVIDIA H100 80GB HBM3", "device memory": "79.1 GiB",
                            "CUDA runtime": 13000, "cupy": "14.2.0"},
                     (runs, seq, search, ["resnet50 pgmo batch 90: fits"]),
                     {"total": 12.0}, "python scripts/bench_memory.py --device 0")
    lines = text.splitlines()
    assert "n/a (CPU)" not in text and "DRY RUN" not in text
    assert "- device: NVIDIA H100 80GB HBM3 (79.1 GiB, CUDA runtime 13000)" in lines
    # side by side: only batch 32 ran to the end with both pools
    assert "| resnet50 | train | 32 | 1,400.0 / 1,000.0 | 800.0 / 400.0 | 50.0 % | " \
           "100.0 / 110.0 | 1.100 |" in lines
    assert "| resnet50 | train | 32 | pgmo | 1,000.0 | 400.0 | 300.0 | 250.0 | 1.200 | 110.0 " \
           "| optimized | 0 |" in lines
    assert any(line.startswith("| resnet50 | train | 64 | stock | out of memory at iteration 4")
               for line in lines)
    assert "| resnet50 | 4,096.0 | pgmo | 90 | 6 |" in lines
    assert "| pgmo | 64 | 7 | 900.0 | 1,500.0 | 50.0 | 2 | 0 | 3 |" in lines
