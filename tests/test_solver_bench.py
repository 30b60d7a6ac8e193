"""scripts/bench_solver.py: the tables and the time limit's verdict, on tiny inputs."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench_solver.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_solver_under_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_each_row_says_how_late_each_method_was_and_the_summary_counts_the_late(
        bench, tmp_path, capsys):
    trace = tmp_path / "tiny.csv"
    trace.write_text("id,lower,upper,size\n0,0,2,3\n1,1,3,2\n2,2,4,3\n")
    out = tmp_path / "table.md"
    bench.main([str(trace), "--random", "40", "--methods", "bestfit,best",
                "--time-limit", "0.5", "-o", str(out)])
    text = out.read_text()
    assert text == capsys.readouterr().out.lstrip("\n")
    rows = [line for line in text.splitlines() if line.startswith("| tiny")
            or line.startswith("| random-")]
    assert len(rows) == 3  # the file and the two random traces
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        for m in range(2):  # bestfit, best: peak, s, over, /LB, /best
            seconds, over = float(cells[5 + 5 * m]), cells[6 + 5 * m]
            assert float(over.split()[0]) == pytest.approx(seconds - 0.5, abs=0.011)
            assert over.endswith("LATE") == (seconds > 0.5 * 1.05 + 0.1)
        assert re.fullmatch(r"\d+\.\d\d", cells[-1])  # the load average
    assert re.search(r"\*\*best\*\* worst overrun past the 0.5 s limit: [-+]\d+\.\d\d s "
                     r"\(.+\); returned after 0.625 s \(limit x 1.05 \+ 0.1 s\): \d+ of 3", text)
    assert "Load average at the start" in text and "Load average at the end" in text
