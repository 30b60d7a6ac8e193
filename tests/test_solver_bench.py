"""scripts.bench_solver: the tables and the time limit's verdict, on tiny inputs."""

from __future__ import annotations

import re

import pytest

import pgmo


@pytest.fixture(scope="module")
def bench():
    from scripts import bench_solver

    return bench_solver


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


def test_bestfit_timing_times_best_fit_alone_on_fixed_random_traces_and_files(
        bench, tmp_path, capsys):
    trace = tmp_path / "Y_1.csv"
    trace.write_text("id,lower,upper,size\n0,0,2,3\n1,1,3,2\n2,2,4,3\n")
    assert bench.main(["--bestfit-timing", "--n", "200", "--dist", "long", "--repeat", "1",
                       str(trace)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("bestfit wall time, best of 1; Python ")
    assert lines[2] == "| trace | n | LB | peak | peak/LB | seconds |"
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines[4:6]]
    # the seed is fixed per size and distribution: the same rows on every machine
    assert rows[0][:2] == ["random-long (seed 200001)", "200"]
    assert rows[1][:5] == [f"{tmp_path.name}/Y_1", "3", "5", "5", "1.0000"]
    assert re.fullmatch(r"Targets: 10k-block rows: none; Y_1 <= 15 s: yes \(\d\.\d{3} s\)",
                        lines[-1])
    bench.main(["--bestfit-timing", "--n", "200", "--dist", "long", "--repeat", "1"])
    again = capsys.readouterr().out.splitlines()  # the same random trace, the same peak
    assert again[4].rsplit("|", 2)[0] == lines[4].rsplit("|", 2)[0]


def test_bestfit_timing_reads_the_files_given_before_timing_anything(bench, tmp_path, capsys):
    not_a_trace = tmp_path / "notes.csv"
    not_a_trace.write_text("name,value\nx,1\n")
    with pytest.raises(pgmo.TraceFormatError, match="notes.csv"):
        bench.main(["--bestfit-timing", "--n", "200", "--dist", "long", "--repeat", "1",
                    str(not_a_trace)])
    assert capsys.readouterr().out == ""  # no table begun, no random trace timed


def test_the_timing_options_go_only_with_bestfit_timing(bench, capsys):
    with pytest.raises(SystemExit) as stop:
        bench.main(["--n", "100"])
    assert stop.value.code == 2
    assert "--n: only with --bestfit-timing" in capsys.readouterr().err


def test_several_time_limits_are_printed_side_by_side_and_bestfit_runs_once(bench, tmp_path,
                                                                             capsys):
    trace = tmp_path / "tiny.csv"
    trace.write_text("id,lower,upper,size\n0,0,2,3\n1,1,3,2\n2,2,4,3\n")
    bench.main([str(trace), "--methods", "bestfit,best", "--time-limit", "0.3,0.1"])
    text = capsys.readouterr().out
    header = next(line for line in text.splitlines() if line.startswith("| instance"))
    assert [c.strip() for c in header.strip("|").split("|")][4:-1:5] == [
        "bestfit peak", "best 0.1s peak", "best 0.3s peak"]
    assert "**best 0.1s** worst overrun past the 0.1 s limit" in text
    assert "**best 0.3s** worst overrun past the 0.3 s limit" in text


@pytest.mark.parametrize("argv, said", [
    (["--random", "0"], "argument --random: expects an integer >= 1, got '0'"),
    (["--random", "-5"], "argument --random: expects an integer >= 1"),
    (["--bestfit-timing", "--n", "0"], "argument --n: expects an integer >= 1"),
    (["--bestfit-timing", "--repeat", "0"], "argument --repeat: expects an integer >= 1"),
    (["--time-limit", "-1"], "argument --time-limit: must be a number of seconds >= 0"),
    (["--time-limit", "1,-1"], "argument --time-limit: must be a number of seconds >= 0"),
    (["--budget", "0"], "argument --budget: must be a positive number of search steps"),
    (["--best-known", "no-such-file.csv"], "argument --best-known: no such file"),
])
def test_a_value_no_run_can_use_is_an_argument_error(bench, capsys, argv, said):
    with pytest.raises(SystemExit) as stop:
        bench.main(argv)
    assert stop.value.code == 2
    assert said in capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.parametrize("text, said", [
    ("hello world\n", "not a best-known file (needs a header 'instance,peak')"),
    ("instance,peak\nfoo,abc\n", "line 2: expected an instance and a positive peak"),
    (b"instance,peak\n\xff\xfe,1\n", "cannot be read as a best-known CSV"),
])
def test_a_best_known_file_that_cannot_be_read_is_named_in_one_line(bench, tmp_path, capsys,
                                                                    text, said):
    from pgmo import programs

    known = tmp_path / "known.txt"
    known.write_bytes(text if isinstance(text, bytes) else text.encode())
    code = programs.run(lambda: bench.main(["--random", "2", "--methods", "bestfit",
                                            "--best-known", str(known)]), name="bench_solver")
    assert code == 2
    err = capsys.readouterr().err
    assert err == f"bench_solver: error: {known}{err.split(str(known), 1)[1]}"
    assert said in err and err.count("\n") == 1
