"""The ``pgmo`` command answers a contradictory or misdirected command with one line
naming the problem (exit status 2), and its messages name the files they are about."""

from __future__ import annotations

import pytest

from pgmo.cli import main


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("pgmo: error: ") and err.count("\n") == 1, err
    return err


# -- pgmo cache ---------------------------------------------------------------------
def test_cache_list_with_clear_is_refused_and_clears_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PGMO_CACHE_DIR", str(tmp_path))
    entry = tmp_path / "device" / "a.plan.json"
    entry.parent.mkdir()
    entry.write_text("{}")
    assert main(["cache", "list", "--clear"]) == 2
    assert "'list' and --clear contradict each other" in one_error_line(capsys)
    assert entry.exists()
    assert main(["cache", "clear", "--clear"]) == 0  # the same request twice is no conflict
    assert not entry.exists()


@pytest.mark.parametrize("action", [[], ["list"], ["clear"], ["--clear"]])
def test_a_cache_dir_that_is_a_file_is_named_as_not_a_folder(tmp_path, monkeypatch, capsys,
                                                            action):
    afile = tmp_path / "plans"
    afile.write_text("not a folder")
    monkeypatch.setenv("PGMO_CACHE_DIR", str(afile))
    assert main(["cache", *action]) == 2
    err = one_error_line(capsys)
    assert f"{afile} ($PGMO_CACHE_DIR) is not a folder" in err
    assert afile.read_text() == "not a folder"


# -- messages that name what they are about -----------------------------------------
GOOD = "id,lower,upper,size\n0,0,5,512\n1,1,3,1024\n"
ONE = "id,lower,upper,size,offset\n0,0,5,512,0\n"
OVERLAP = "id,lower,upper,size,offset\n0,0,5,512,0\n1,1,3,1024,0\n"


@pytest.fixture
def files(tmp_path):
    out = {}
    for name, text in (("good", GOOD), ("one", ONE), ("overlap", OVERLAP)):
        out[name] = tmp_path / f"{name}.csv"
        out[name].write_text(text)
    return out


def test_a_folder_given_as_reserved_is_named_as_the_reserved_input(files, tmp_path, capsys):
    folder = tmp_path / "adir"
    folder.mkdir()
    assert main(["analyze", str(files["good"]), "--reserved", str(folder),
                 "--method", "bestfit"]) == 2
    err = one_error_line(capsys)
    assert "reserved:" in err and "is a folder" in err and "trace file" not in err


@pytest.mark.parametrize("trace, plan, counts", [
    ("good", "one", "the plan has 1 block, the trace 2 blocks"),
    ("one", "overlap", "the plan has 2 blocks, the trace 1 block"),
])
def test_a_plan_of_another_trace_names_both_files_and_counts_in_words(files, capsys, trace,
                                                                      plan, counts):
    assert main(["check", str(files[trace]), str(files[plan])]) == 2
    err = one_error_line(capsys)
    assert f"{files[plan]} does not belong to {files[trace]}: {counts}" in err


def test_plot_names_the_plan_file_whose_packing_is_invalid(files, tmp_path, capsys):
    picture = tmp_path / "p.png"
    assert main(["plot", str(files["good"]), "--plan", str(files["overlap"]),
                 "-o", str(picture)]) == 2
    err = one_error_line(capsys)
    assert f"invalid plan {files['overlap']}: block id=0" in err
    assert not picture.exists()


def test_demo_takes_none_as_its_time_limit_as_solve_does(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for argv in (["solve", "h100-alexnet-infer-b1"], ["demo"]):
        assert main([*argv, "--time-limit", "none"]) == 2  # best needs something to stop it
        assert "method 'best' needs a time limit or a budget to stop" in one_error_line(capsys)
    assert not (tmp_path / "pgmo-demo.png").exists()


def test_demo_with_no_time_limit_and_a_budget_runs(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    out = tmp_path / "demo.png"
    assert main(["demo", "--trace", "synthetic-alexnet-train-b32", "-o", str(out),
                 "--time-limit", "none", "--budget", "200"]) == 0
    text = capsys.readouterr().out
    assert "corrupted blocks          0" in text and "overlapping blocks        0" in text
    assert out.read_bytes().startswith(b"\x89PNG")


# -- --inclusive --------------------------------------------------------------------
def test_inclusive_lifetimes_are_refused_for_a_file_that_records_its_own_events(capsys):
    """``--inclusive`` converts the lifetimes of CSV and JSON traces; a PyTorch snapshot's
    events have no such reading, so asking for it is a mistake, not silently ignored."""
    from pathlib import Path

    snapshot = Path(__file__).parent / "data" / "pytorch-snapshot-small-cnn-h100.pickle"
    assert main(["analyze", str(snapshot), "--inclusive"]) == 2
    assert "inclusive lifetimes are read from CSV and pgmo JSON traces" in \
        one_error_line(capsys)


def test_inclusive_lifetimes_of_a_csv_trace_end_one_tick_later(tmp_path, capsys):
    trace = tmp_path / "iree.csv"
    trace.write_text("id,lower,upper,size\n0,0,4,100\n1,5,7,50\n")
    assert main(["solve", str(trace), "--method", "bestfit"]) == 0
    assert "peak        100 B" in capsys.readouterr().out  # [0, 4) and [5, 7): apart
    trace.write_text("id,lower,upper,size\n0,0,5,100\n1,5,7,50\n")
    assert main(["solve", str(trace), "--method", "bestfit", "--inclusive"]) == 0
    assert "peak        150 B" in capsys.readouterr().out  # [0, 5] and [5, 7]: both at 5
