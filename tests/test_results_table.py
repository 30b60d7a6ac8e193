"""docs/results.md is generated from a GPU session's output folder, never typed in."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "scripts"
#: The GPU session's output, kept in the repository (tests/data/gpu-evidence/README.rst).
EVIDENCE = ROOT / "tests" / "data" / "gpu-evidence" / "2026-11-25-h100"
RESULTS = ROOT / "docs" / "results.md"


def _script(name):
    sys.path.insert(0, str(SCRIPTS))
    try:
        return __import__(name)
    finally:
        sys.path.remove(str(SCRIPTS))


def headline(text: str) -> str:
    [line] = [line for line in text.splitlines() if line.startswith("**Headline.**")]
    return line


def test_the_readme_states_the_results_headline_and_links_them():
    readme = (ROOT / "README.rst").read_text()
    said = headline(RESULTS.read_text()).replace("**Headline.**", "").strip()
    assert " ".join(said.split()) in " ".join(readme.split())
    assert "docs/results.md" in readme


def test_the_results_page_is_what_the_h100_session_gives():
    done = subprocess.run([sys.executable, str(SCRIPTS / "results_table.py"), str(EVIDENCE),
                           "-o", str(RESULTS), "--check"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr


def test_the_h100_page_says_where_pgmo_loses():
    text = RESULTS.read_text()
    assert "Measured on 2026-11-25 on one NVIDIA H100 80GB HBM3" in text
    assert headline(text).endswith("today pgmo loses on memory.")
    for section in ("Figures 2 and 3", "Largest batch under a memory limit", "seq2seq",
                    "DenseNet-BC with recomputation", "malloc+free against CuPy's pool",
                    "ChainerMN: two ranks", "compute-sanitizer", "Where pgmo loses today"):
        assert f"## {section}" in text, section
    assert "| resnet50 | train | 128 | 16,873.2 / 30,628.3 | 17,526.8 / 16,632.8 " \
           "| 17,527 / 31,283 | 13,755.1 | 1.000 | 914.8 / 911.8 | 0.997 |" in text


# -- a session in today's formats, as the next GPU run will write it -----------------------
SESSION_LOG = """\
[00:00:01 +0s] setup
name, memory.total [MiB], driver_version
NVIDIA H200, 143771 MiB, 590.10
python 3.12.3 numpy 2.5.2 cupy 14.3.0
pgmo 0.3.0 from <checkout>/pgmo/__init__.py chainer 7.8.1
pgmo hot path: compiled
pgmo commit: abc1234
[00:00:05 +4s] BEGIN tests (timeout 150s): python3 -m pytest -m gpu -q tests
[00:00:35 +34s] END tests: exit 0 after 30s
[00:00:35 +34s] pytest: 10 passed, 760 deselected in 29.00s
"""


def _next_session(tmp_path) -> Path:
    """A folder as gpu_session.sh will leave it: session.log, and results.md from step bench."""
    bm = _script("bench_memory")
    from tests.test_gpu_scripts import _child_result

    args = bm.parse_args(["--device", "0", "--arch", "resnet50", "--batchsize", "32"])
    base = {"arch": "resnet50", "workload": "cnn-train", "batch": 32}
    runs = [({**base, "pool": "stock"}, bm.combine([_child_result("stock", 800, ms, nvml_mib=1500)
                                                    for ms in (100.0, 96.0, 103.0)])),
            ({**base, "pool": "pgmo"}, bm.combine([_child_result("pgmo", 600, ms, nvml_mib=1200)
                                                   for ms in (101.0, 99.0)]))]
    text = bm.report(args, {"device": "NVIDIA H200", "device memory": "139.8 GiB",
                            "CUDA runtime": 13020, "nvml": "process peaks sampled every 10 ms"},
                     (runs, [], [], []), {"total": 60.0}, "python scripts/bench_memory.py")
    folder = tmp_path / "results-gpu"
    folder.mkdir()
    (folder / "results.md").write_text(text + "\n")
    (folder / "session.log").write_text(SESSION_LOG)
    return folder


def test_the_next_sessions_folder_gives_its_page(tmp_path):
    folder = _next_session(tmp_path)
    out = tmp_path / "results.md"
    done = subprocess.run([sys.executable, str(SCRIPTS / "results_table.py"), str(folder),
                           "-o", str(out)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    text = out.read_text()
    assert "on one NVIDIA H200 (driver 590.10, CUDA runtime 13020): Python 3.12.3" in text
    assert "pgmo 0.3.0 at commit abc1234, hot path compiled" in text
    # the bench report's own numbers, NVML from its own column, time with its runs' range
    assert "| resnet50 | train | 32 | 800.0 / 600.0 | 1,400.0 / 1,200.0 | 1,500 / 1,200 " \
           "| 250.0 | 1.200 | 100.0 (96.0-103.0, 3 runs) / 100.0 (99.0-101.0, 2 runs) " \
           "| 1.000 (0.96-1.05) |" in text
    assert re.search(r"pgmo's plans reached the lower bound in 0 of 1 CNN configurations, "
                     r"yet pgmo held more device memory than CuPy's stock pool in 0 of 1", text)
    # what the folder lacks reads as not measured, never as a number
    assert "## ChainerMN: two ranks\n\nnot measured (no step mn in session.log)." in text
    assert "## malloc+free against CuPy's pool\n\nnot measured" in text
    assert "- `pytest -m gpu` (`pytest-gpu.log`): 10 passed, 760 deselected in 29.00s." in text


def test_a_folder_that_is_no_session_is_refused(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPTS / "results_table.py"), str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "neither session.log nor results.md" in done.stderr
