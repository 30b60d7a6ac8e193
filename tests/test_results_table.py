"""docs/results.md is generated from a GPU session's output folder, never typed in."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: The GPU session's output, kept in the repository (tests/data/gpu-evidence/README.rst).
EVIDENCE = ROOT / "tests" / "data" / "gpu-evidence" / "2026-11-25-h100"
RESULTS = ROOT / "docs" / "results.md"


def _script(name):
    return importlib.import_module(f"scripts.{name}")


def headline(text: str) -> str:
    [line] = [line for line in text.splitlines() if line.startswith("**Headline.**")]
    return line


def test_the_readme_states_the_results_headline_and_links_them():
    readme = (ROOT / "README.rst").read_text()
    said = headline(RESULTS.read_text()).replace("**Headline.**", "").strip()
    assert " ".join(said.split()) in " ".join(readme.split())
    assert "docs/results.md" in readme


def test_the_results_page_is_what_the_h100_session_gives():
    done = subprocess.run([sys.executable, "-m", "scripts.results_table", str(EVIDENCE),
                           "-o", str(RESULTS), "--check"], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr


def test_the_h100_page_says_where_pgmo_loses():
    text = RESULTS.read_text()
    assert "Measured on 2026-11-25 on one NVIDIA H100 80GB HBM3" in text
    assert headline(text).endswith("today pgmo loses on memory.")
    for section in ("Figures 2 and 3", "Largest batch under a memory limit", "seq2seq",
                    "DenseNet-BC with recomputation", "malloc+free against CuPy's pool",
                    "ChainerMN: two ranks", "compute-sanitizer", "Where pgmo loses today"):
        assert f"## {section}" in text, section
    assert "| resnet50 | train | 128 | 17,527 / 31,283 | 1.78x | 13,755.1 | 1.000 " \
           "| 914.8 / 911.8 | 0.997 | 16,873.2 / 30,628.3 | 17,526.8 / 16,632.8 |" in text


def test_the_h100_page_compares_the_pools_only_on_what_both_were_measured_by():
    """The session's only symmetric memory figure is the outside probe's NVML peak over each
    whole process: the headline and every ratio come from it; the readings at iteration
    ends (pgmo's only once it had a plan) are labelled and never compared."""
    text = RESULTS.read_text()
    said = headline(text)
    assert "over the whole process (NVML, one process per pool)" in said
    assert "in 6 of 7 CNN configurations (up to 1.78x, resnet50 train b128: 31,283 vs " \
           "17,527 MiB) and in seq2seq at least 7.5x" in said
    # the ratios of the asymmetric columns (30,628.3 / 16,873.2 = 1.82x) appear nowhere
    assert "1.82x" not in text and "pool memory saved" not in text
    header = [line for line in text.splitlines() if line.startswith("| model | task | batch")]
    assert header[0].count("not comparable:") == 2
    assert "| pgmo / stock |" in header[0]


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


def _next_session(tmp_path, taken=600, own=300) -> Path:
    """A folder as gpu_session.sh will leave it: session.log, and results.md from step bench;
    pgmo's run took ``taken`` MiB seen from outside the pool and counted ``own`` MiB itself,
    the stock pool's 800 and 400."""
    bm = _script("bench_memory")
    from tests.test_gpu_scripts import _child_result

    args = bm.parse_args(["--device", "0", "--arch", "resnet50", "--batchsize", "32"])
    base = {"arch": "resnet50", "workload": "cnn-train", "batch": 32}
    runs = [({**base, "pool": "stock"}, bm.combine([_child_result("stock", 800, ms, nvml_mib=1500)
                                                    for ms in (100.0, 96.0, 103.0)])),
            ({**base, "pool": "pgmo"}, bm.combine([_child_result("pgmo", taken, ms, nvml_mib=1200,
                                                                 own_mib=own)
                                                   for ms in (101.0, 99.0)]))]
    text = bm.report(args, {"device": "NVIDIA H200", "device memory": "139.8 GiB",
                            "CUDA runtime": 13020, "nvml": "process peaks sampled every 10 ms"},
                     (runs, [], [], []), {"total": 60.0}, "python -m scripts.bench_memory")
    folder = tmp_path / "results-gpu"
    folder.mkdir()
    (folder / "results.md").write_text(text + "\n")
    (folder / "session.log").write_text(SESSION_LOG)
    return folder


def test_the_next_sessions_folder_gives_its_page(tmp_path):
    folder = _next_session(tmp_path)
    out = tmp_path / "results.md"
    done = subprocess.run([sys.executable, "-m", "scripts.results_table", str(folder),
                           "-o", str(out)], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    text = out.read_text()
    assert "on one NVIDIA H200 (driver 590.10, CUDA runtime 13020): Python 3.12.3" in text
    assert "pgmo 0.3.0 at commit abc1234, hot path compiled" in text
    # the bench report's own numbers: the memory taken compared, the pools' own counts last,
    # time with its runs' range
    assert "| resnet50 | train | 32 | 800.0 / 600.0 | 0.75x | 1,500.0 / 1,200.0 " \
           "| 250.0 / 250.0 | 250.0 | 1.200 | 100.0 (96.0-103.0, 3 runs) / 100.0 " \
           "(99.0-101.0, 2 runs) | 1.000 (0.96-1.05) | 400.0 / 300.0 |" in text
    assert re.search(r"over the whole run \(`cudaMemGetInfo`\), pgmo took no more device memory "
                     r"than CuPy's stock pool in any of 1 CNN configurations \(at most 0.75x\); "
                     r"its plans reached the lower bound in 0 of 1\.", text)
    # what the folder lacks reads as not measured, never as a number
    assert "## ChainerMN: two ranks\n\nnot measured (no step mn in session.log)." in text
    assert "## malloc+free against CuPy's pool\n\nnot measured" in text
    assert "- `pytest -m gpu` (`pytest-gpu.log`): 10 passed, 760 deselected in 29.00s." in text


def test_the_headline_follows_the_outside_view_not_the_pools_own_count(tmp_path):
    """pgmo's own count says it held 100 MiB against the stock pool's 400, but seen from
    outside its run took 1,000 MiB against 800: the page says pgmo took more."""
    folder = _next_session(tmp_path, taken=1000, own=100)
    text = page_of(folder)
    assert "pgmo took more device memory than CuPy's stock pool in 1 of 1 CNN configurations " \
           "(up to 1.25x, resnet50 train b32: 1,000 vs 800 MiB)" in headline(text)
    assert headline(text).endswith("today pgmo loses on memory.")


def test_the_quick_check_in_a_sessions_folder_joins_its_page(tmp_path):
    import json

    qc = _script("quick_check_report")
    folder = _next_session(tmp_path)
    (folder / "quick-check").mkdir()
    data = {"command": "python -m scripts.gpu_quick_check --device 0", "dry_run": False,
            "date": "2027-01-05 10:00 UTC", "environment": {"device": "NVIDIA H200"},
            "steps": [{"name": "allocation calls' costs", "status": "done", "limit_s": 90,
                       "seconds": 20, "key": "costs"}],
            "results": {"costs": {
                "info": {"behind_ms": 5, "kernels": 5, "repeats": 5},
                "rows": [{"way": "cudaMalloc", "op": "cudaFree", "size": 512, "idle_us": 3.0,
                          "behind_us": 5012.0, "waited": True, "waits": "5/5",
                          "other_us": 5010.0, "other_waited": True, "other_waits": "5/5"}],
                "problems": []}}}
    (folder / "quick-check" / "quick-check.json").write_text(json.dumps(data))
    text = page_of(folder)
    assert "## pgmo quick GPU check" in text and "### Verdicts" in text
    assert "**quick check: PASS: every check held**" in text
    assert "| cudaMalloc: does `cudaFree` wait for queued kernels? | idle 3.0 us; behind 5 ms " \
           "of kernels 5,012.0 us, on another stream 5,010.0 us | its stream: waits at every " \
           "size: it synchronizes; another stream: waits at every size: it synchronizes |" \
        in text
    assert qc.render(data, "##") in text


def page_of(folder: Path) -> str:
    return _script("results_table").page(_script("evidence").Session.read(folder))


def test_a_folder_that_is_no_session_is_refused(tmp_path):
    done = subprocess.run([sys.executable, "-m", "scripts.results_table", str(tmp_path)],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 2
    assert "neither session.log nor results.md" in done.stderr
