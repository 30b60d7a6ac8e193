"""The ``pgmo`` command end to end."""

from __future__ import annotations

import csv
import subprocess
import sys

import pytest

from pgmo import read_plan
from pgmo.cli import main

TRACE = "id,lower,upper,size\n0,0,4,3\n1,1,3,2\n2,3,6,4\n3,5,8,1\n4,0,8,2\n"


@pytest.fixture
def trace_file(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text(TRACE)
    return path


def test_solve_prints_the_plan_and_writes_a_checkable_csv(trace_file, tmp_path, capsys):
    out = tmp_path / "plan.csv"
    assert main(["solve", str(trace_file), "--method", "bestfit", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    for word in ("n ", "lower bound", "peak", "peak/LB", "time"):
        assert word in text
    with open(out) as fh:
        assert next(csv.reader(fh)) == ["id", "lower", "upper", "size", "offset"]
    assert read_plan(out).is_valid()
    assert main(["check", str(trace_file), str(out)]) == 0
    assert "valid: 5 blocks" in capsys.readouterr().out


def test_solve_verbose_reports_the_search(trace_file, capsys):
    assert main(["solve", str(trace_file), "--verbose", "--time-limit", "none",
                 "--budget", "500"]) == 0
    text = capsys.readouterr().out
    for key in ("strategy", "nodes", "restarts", "proved_optimal", "gap", "proven_bound"):
        assert f"  {key} " in text


@pytest.mark.parametrize("method", ["bestfit", "best", "exact"])
def test_every_method_from_the_command_line(trace_file, capsys, method):
    if method == "exact":
        pytest.importorskip("ortools")
    assert main(["solve", str(trace_file), "--method", method, "--time-limit", "2"]) == 0
    assert f"({method})" in capsys.readouterr().out


def test_check_rejects_overlapping_blocks_naming_both(trace_file, tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    rows = TRACE.strip().splitlines()
    bad.write_text("\n".join([rows[0] + ",offset"] + [r + ",0" for r in rows[1:]]) + "\n")
    assert main(["check", str(trace_file), str(bad)]) == 1
    err = capsys.readouterr().err
    assert err.count("block id=") == 2 and "overlaps" in err


def test_check_rejects_a_plan_of_another_trace(trace_file, tmp_path, capsys):
    other = tmp_path / "other.csv"
    other.write_text("id,lower,upper,size,offset\n0,0,4,3,0\n")
    assert main(["check", str(trace_file), str(other)]) == 2
    assert "does not belong" in capsys.readouterr().err


def test_bad_input_is_one_line_on_stderr_without_traceback(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("id,lower,upper,size\n0,0,4,3\n1,5,2,1\n")
    proc = subprocess.run([sys.executable, "-m", "pgmo", "solve", str(bad)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert "bad.csv, line 3, field 'upper'" in proc.stderr


def test_missing_file(capsys):
    assert main(["solve", "does-not-exist.csv"]) == 2
    assert "no such file" in capsys.readouterr().err


def test_plot_writes_a_picture(trace_file, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    out = tmp_path / "plan.png"
    assert main(["plot", str(trace_file), "-o", str(out)]) == 0
    assert out.read_bytes().startswith(b"\x89PNG")


def test_plot_with_a_given_plan(trace_file, tmp_path):
    pytest.importorskip("matplotlib")
    plan_csv, png = tmp_path / "p.csv", tmp_path / "p.png"
    assert main(["solve", str(trace_file), "--method", "bestfit", "-o", str(plan_csv)]) == 0
    assert main(["plot", str(trace_file), "--plan", str(plan_csv), "-o", str(png)]) == 0
    assert png.stat().st_size > 1000


def test_demo_lists_bundled_traces(capsys):
    assert main(["demo", "--list"]) == 0
    assert "synthetic-resnet50-train-b32" in capsys.readouterr().out


def test_demo_runs_end_to_end(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    out = tmp_path / "demo.png"
    assert main(["demo", "--trace", "synthetic-alexnet-train-b32", "-o", str(out),
                 "--time-limit", "1"]) == 0
    text = capsys.readouterr().out
    assert "bestfit" in text and "best" in text and "no reuse" in text
    assert out.read_bytes().startswith(b"\x89PNG")
    if "pool replay skipped" not in text:
        assert "corrupted blocks   0" in text
