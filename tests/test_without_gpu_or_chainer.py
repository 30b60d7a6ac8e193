"""What a newcomer meets running a program where a GPU or Chainer is missing.

A program that needs a GPU, started where CuPy sees none, says so in one line
before any work (what it tried, how to run on the CPU), exit status 2, instead
of a traceback per step (:func:`pgmo.programs.require_gpu`).  A program whose
imports need Chainer, started where it is not installed, says so in one line,
also for ``--help``, exit status 2 (:func:`pgmo.programs.answer_missing_packages`; a
shared module run by mistake says it is no program, ``tests/test_scripts_package.py``).  Each runs as a user starts it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pgmo import programs
from scripts import needs_gpu

from .program_needs import skip_unless_installed

ROOT = Path(__file__).resolve().parents[1]
#: No GPU for CuPy, also on a machine with one.
NO_GPU = {"CUDA_VISIBLE_DEVICES": ""}


def _run(program: str, *argv: str, cwd: Path = ROOT, env: dict | None = None,
         timeout: float = 120) -> subprocess.CompletedProcess:
    command = [sys.executable, str(ROOT / "examples" / program)] if program.endswith(".py") \
        else [sys.executable, "-m", f"scripts.{program}"]
    environment = {k: v for k, v in os.environ.items() if k not in ("PGMO_DEBUG",
                                                                     "PYTHONWARNINGS")}
    extra = dict(env or {})
    environment["PYTHONPATH"] = os.pathsep.join([p for p in (extra.pop("PYTHONPATH", ""),
                                                             str(ROOT)) if p])
    environment.update(extra)
    return subprocess.run(command + list(argv), cwd=cwd, env=environment, text=True,
                          capture_output=True, timeout=timeout)


def _program_file(program: str) -> str:
    return program if program.endswith(".py") else f"{program}.py"


# ------------------------------------------------------------------ no GPU
def test_a_program_that_needs_a_gpu_checks_what_cupy_sees(monkeypatch):
    cupy = pytest.importorskip("cupy")
    from cupy_backends.cuda.api.runtime import CUDARuntimeError

    runtime = cupy.cuda.runtime
    monkeypatch.setattr(runtime, "getDeviceCount", lambda: 2)
    needs_gpu.require_gpu(1)  # sees it: no error
    with pytest.raises(programs.UsageError) as error:
        needs_gpu.require_gpu(2, instead="--device -1 runs it on the CPU")
    assert str(error.value) == ("needs CUDA GPU 2, and CuPy sees 2 GPU(s), numbered 0 to 1; "
                                "--device -1 runs it on the CPU")
    monkeypatch.setattr(runtime, "getDeviceCount", lambda: 0)
    with pytest.raises(programs.UsageError, match=r"sees no usable GPU \(cudaGetDeviceCount: "
                                                  r"0 devices\)$"):
        needs_gpu.require_gpu(0)

    def no_driver():
        raise CUDARuntimeError(35)  # cudaErrorInsufficientDriver

    monkeypatch.setattr(runtime, "getDeviceCount", no_driver)
    with pytest.raises(programs.UsageError, match=r"^needs CUDA GPU 0, and CuPy sees no usable "
                                                  r"GPU \(cudaGetDeviceCount: "
                                                  r"cudaErrorInsufficientDriver"):
        needs_gpu.require_gpu(0)


def test_a_program_that_needs_a_gpu_without_cupy_names_what_installs_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)
    with pytest.raises(programs.UsageError, match=r"needs CuPy \(pip install 'pgmo\[cuda13\]'"):
        needs_gpu.require_gpu(0)


def test_on_this_machine_require_gpu_agrees_with_cupy():
    """Not mocked: where CuPy sees no device (a CPU-only machine, CUDA_VISIBLE_DEVICES=""),
    the check refuses; where it sees one, it passes."""
    pytest.importorskip("cupy")
    count, why = needs_gpu.usable_gpus()
    if count:
        needs_gpu.require_gpu(0)
    else:
        assert why.startswith("cudaGetDeviceCount")
        with pytest.raises(programs.UsageError, match="sees no usable GPU"):
            needs_gpu.require_gpu(0)


#: (program, arguments, how it runs without a GPU, as its line says)
NEEDS_A_GPU = [
    ("bench_memory", [], "--device -1 runs it on the CPU (a dry run)"),
    ("record_traces", [], "--device -1 runs it on the CPU (a dry run)"),
    ("bench_malloc", ["--gpu"], "without --gpu it runs on the CPU"),
    ("gpu_quick_check", [], "--dry-run runs it on the CPU with stand-ins"),
]


@pytest.mark.parametrize("program, argv, instead", NEEDS_A_GPU)
def test_a_gpu_program_without_a_gpu_says_so_in_one_line_before_any_work(
        program, argv, instead, tmp_path):
    skip_unless_installed(program)
    pytest.importorskip("cupy", reason="without CuPy the line names CuPy (tested in-process)")
    done = _run(program, *argv, cwd=tmp_path, env=NO_GPU)
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stdout == "" and "Traceback" not in done.stderr
    line = done.stderr
    assert line.count("\n") == 1, line[-3000:]
    assert line.startswith(f"{_program_file(program)}: error: needs CUDA GPU 0, and CuPy "
                           "sees no usable GPU (cudaGetDeviceCount"), line
    assert line.rstrip().endswith(instead), line
    assert list(tmp_path.iterdir()) == []  # no report, no folder (./quick-check) left behind


# ------------------------------------------------------------------ no Chainer
NEEDS_CHAINER = ["train_imagenet.py", "seq2seq.py", "densenet.py", "train_mn.py",
                 "record_traces", "record_runs", "mirror_fidelity"]


@pytest.fixture(scope="module")
def without_chainer(tmp_path_factory) -> dict:
    """An environment in which ``import chainer`` fails as where it is not installed."""
    folder = tmp_path_factory.mktemp("no-chainer")
    (folder / "chainer").mkdir()
    (folder / "chainer" / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'chainer'\", name='chainer')\n")
    return {"PYTHONPATH": str(folder)}


@pytest.mark.parametrize("program", NEEDS_CHAINER)
def test_without_chainer_a_program_says_what_installs_it_in_one_line(program, without_chainer):
    done = _run(program, "--help", env=without_chainer)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1, done.stderr[-3000:]
    assert done.stderr.startswith(f"{_program_file(program)}: error: "), done.stderr
    assert "Chainer" in done.stderr and "install" in done.stderr, done.stderr


def test_without_chainer_pgmo_debug_keeps_the_traceback(without_chainer):
    done = _run("record_traces", "--help", env={**without_chainer, "PGMO_DEBUG": "1"})
    assert done.returncode == 1
    assert "Traceback" in done.stderr and "ImportError: pgmo.chainer needs Chainer" in done.stderr


# ------------------------------------------------------------------ the quick check's output
def test_the_quick_checks_default_output_folder_is_not_committed_by_mistake():
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    done = subprocess.run(["git", "check-ignore", "-q", "quick-check/quick-check.json"],
                          cwd=ROOT, capture_output=True)
    assert done.returncode == 0, "quick-check/ (gpu_quick_check's default --out) not ignored"
