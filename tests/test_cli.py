"""The ``pgmo`` command end to end."""

from __future__ import annotations

import csv
import importlib.util
import json
import re
import subprocess
import sys

import pytest

import pgmo
from pgmo import bundled, read_plan
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


def test_solve_and_check_write_bytes_as_analyze_does(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    name = "h100-alexnet-train-b32"
    assert main(["solve", name, "--method", "bestfit", "-o", "plan.csv"]) == 0
    out = capsys.readouterr().out
    assert "lower bound 1,013,874,176 B (966.91 MiB)" in out
    assert "peak        1,013,874,176 B (966.91 MiB)  (optimal)" in out
    assert main(["check", name, "plan.csv"]) == 0
    assert ("peak 1,013,874,176 B (966.91 MiB), lower bound 1,013,874,176 B (966.91 MiB)"
            in capsys.readouterr().out)
    assert main(["analyze", name, "--method", "bestfit"]) == 0
    assert re.search(r"lower bound \(most live at once, whole recording\)\s+"
                     r"1,013,874,176\s+966.91 MiB",
                     capsys.readouterr().out)


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


def _pool_plan_doc(tmp_path) -> dict:
    path, _ = saved_pool_plan(tmp_path)
    return json.loads(path.read_bytes())


def _bad_files(tmp_path):
    """(name, content, what the one line says) for input that once ended in a traceback."""
    import gzip

    from pgmo.formats.files import EXPANSION_FLOOR
    from pgmo.formats.planfile import _checksum

    deep = b"[" * 1100 + b"]" * 1100
    doc = _pool_plan_doc(tmp_path)
    doc["payload"]["offsets"][0] = 10 ** 30  # a consistent checksum, an impossible offset
    doc["sha256"] = _checksum(doc["payload"])
    yield "deep.json", deep, "nested too deeply"
    yield ("deep-trace.json", b'{"format":"pgmo-trace","version":1,"metadata":%s}' % deep,
           "nested too deeply")
    yield ("deep-plan.json", b'{"format":"pgmo-pool-plan","version":1,"payload":%s}' % deep,
           "nested too deeply")
    yield "far.json", json.dumps(doc).encode(), "more than any device holds"
    rows = b"[0,0,1,512]," * ((EXPANSION_FLOOR + (1 << 20)) // 12)
    yield ("bomb.json.gz", gzip.compress(b'{"format":"pgmo-trace","version":1,"columns":'
                                         b'["id","lower","upper","size"],"rows":[' + rows
                                         + b'[0,0,1,512]]}'),
           "decompression bomb")


@pytest.mark.parametrize("case", ["deep.json", "deep-trace.json", "deep-plan.json", "far.json",
                                  "bomb.json.gz"])
def test_hostile_files_are_one_line_and_exit_2(tmp_path, case):
    name, content, said = next(c for c in _bad_files(tmp_path) if c[0] == case)
    path = tmp_path / name
    path.write_bytes(content)
    for command in (["solve", str(path)], ["check", str(path), str(path)]):
        proc = subprocess.run([sys.executable, "-m", "pgmo", *command], capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 2, proc.stderr[-1000:]
        assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
        assert proc.stderr.startswith(f"pgmo: error: {path}") and said in proc.stderr


def test_missing_file(capsys):
    assert main(["solve", "does-not-exist.csv"]) == 2
    assert "no such file" in capsys.readouterr().err


def test_plot_writes_a_picture(trace_file, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    out = tmp_path / "plan.png"
    assert main(["plot", str(trace_file), "-o", str(out)]) == 0
    assert out.read_bytes().startswith(b"\x89PNG")


def test_plot_says_the_name_it_wrote(trace_file, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    assert main(["plot", str(trace_file), "-o", str(tmp_path / "pic")]) == 0
    assert f"wrote {tmp_path / 'pic.png'} " in capsys.readouterr().out
    assert (tmp_path / "pic.png").read_bytes().startswith(b"\x89PNG")


def test_an_output_that_is_a_folder_is_named_as_such(trace_file, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    folder = tmp_path / "out"
    folder.mkdir()
    for command in ("solve", "plot"):
        with pytest.raises(SystemExit) as stop:
            main([command, str(trace_file), "--method", "bestfit", "-o", str(folder)])
        assert stop.value.code == 2
        assert f"{folder} is a folder; give a file name" in capsys.readouterr().err
    assert list(folder.iterdir()) == []  # no temporary file left behind


def test_plot_with_a_given_plan(trace_file, tmp_path):
    pytest.importorskip("matplotlib")
    plan_csv, png = tmp_path / "p.csv", tmp_path / "p.png"
    assert main(["solve", str(trace_file), "--method", "bestfit", "-o", str(plan_csv)]) == 0
    assert main(["plot", str(trace_file), "--plan", str(plan_csv), "-o", str(png)]) == 0
    assert png.stat().st_size > 1000


def _listing(lines):
    """``pgmo traces`` rows by name: (kind, origin)."""
    rows = {}
    for line in lines[1:]:
        parts = line.split()
        if len(parts) > 4 and parts[1] in ("real", "synthetic"):
            rows[parts[0]] = (parts[1], line.split("  ")[-1].strip())
    return rows


def test_bundled_traces_are_listed_real_or_synthetic_with_their_origin(capsys):
    assert main(["traces"]) == 0
    out = capsys.readouterr().out
    assert "provenance:" not in out  # every shipped trace says how it was made
    rows = _listing(out.splitlines())
    assert set(rows) == set(bundled.names())
    assert rows["h100-alexnet-train-b32"] == (
        "real", "NVIDIA H100 80GB HBM3, 2026-11-25, under pgmo's profiling mode "
                "(session 2026-11-25-h100)")
    assert rows["h100-densenet-bc100-k12-train-b64-recompute-on-stock"][1].endswith(
        "under CuPy's stock pool (session 2026-11-25-h100)")
    assert rows["synthetic-resnet50-train-b32"] == (
        "synthetic", "generated by pgmo.synth, not a measurement")
    assert sorted(n for n, (kind, _) in rows.items() if kind == "real") == sorted(
        bundled.RECORDINGS)
    assert main(["demo", "--list"]) == 0  # the demo's own listing is the same
    assert capsys.readouterr().out == out


def test_the_top_level_help_says_how_to_list_the_bundled_traces(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "traces list the bundled traces: real (recorded on a GPU) or synthetic" in text
    assert "`pgmo traces` lists them" in text


@pytest.mark.parametrize("name", ["synthetic-resnet50-train-b32", "h100-alexnet-train-b32"])
def test_every_command_takes_a_bundled_trace_by_name(name, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no file of that name here
    # h100-alexnet-train-b32 has open blocks: `check` takes the plan `solve -o` wrote for it
    n = len(bundled.load(name))
    assert main(["solve", name, "--method", "bestfit", "-o", "plan.csv"]) == 0
    assert f"n           {n}" in capsys.readouterr().out
    assert main(["check", name, "plan.csv"]) == 0
    assert "valid: " in capsys.readouterr().out
    assert main(["analyze", name, "--method", "bestfit", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["requests"] == n
    if importlib.util.find_spec("matplotlib"):
        assert main(["plot", name, "--plan", "plan.csv", "-o", "p.png"]) == 0


def test_a_file_wins_over_a_bundled_trace_of_the_same_name(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "synthetic-resnet50-train-b32").write_text(TRACE)
    assert main(["solve", "synthetic-resnet50-train-b32", "--method", "bestfit"]) == 0
    assert "n           5" in capsys.readouterr().out


def test_demo_list_shows_what_a_trace_fails_to_record(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bundled, "TRACE_DIR", tmp_path)
    meta = {"synthetic": False, "model": "resnet50", "kind": "training", "batch_size": 32,
            "device": "NVIDIA H100 80GB HBM3", "pool": "pgmo"}
    pgmo.write_trace(pgmo.Trace.from_rows([(0, 0, 2, 1024)], metadata=meta),
                     tmp_path / "resnet50-train-b32.json.gz")
    assert main(["demo", "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("resnet50-train-b32 real") and \
        lines[1].endswith("NVIDIA H100 80GB HBM3, date unknown, under pgmo's profiling mode")
    problems = [line.split("provenance: ")[1] for line in lines if "provenance: " in line]
    assert problems == [
        f"a recorded trace must record {key!r}: {bundled.RECORDED_FIELDS[key]}"
        for key in ("command", "cupy", "numpy", "python", "chainer", "pgmo", "date",
                    "recorded_by")]


def test_demo_runs_end_to_end(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    out = tmp_path / "demo.png"
    assert main(["demo", "--trace", "synthetic-alexnet-train-b32", "-o", str(out),
                 "--time-limit", "1"]) == 0
    text = capsys.readouterr().out
    assert "bestfit" in text and "best" in text and "no reuse" in text
    assert out.read_bytes().startswith(b"\x89PNG")
    _assert_a_clean_replay(text)


def _assert_a_clean_replay(text):
    """The replay's report: no corruption, optimized, the pool's peak beside the plan's, and
    the lower bound printed once, at the top, under one name."""
    rows = {key: value.split("  (")[0] for key, value in _replay_rows(text).items()}
    assert rows["corrupted blocks"] == rows["overlapping blocks"] == "0"
    assert rows["mode"] == "optimized"
    [bound] = re.findall(r"^lower bound: (.+ B \(.+\)) \(the most bytes live at once", text,
                         re.M)
    planned, held = (_bytes(rows[key]) for key in ("planned peak (the arena)", "peak held"))
    assert planned <= held
    assert len(re.findall(r"lower bound.*\d B \(", text)) == 1  # no second, third label
    assert "no two live blocks share an address" in text


def _replay_rows(text: str) -> dict[str, str]:
    """The replay block's ``  key  value`` rows."""
    start = text.index("\nreplay: ")
    return dict(re.split(r"\s{2,}", line.strip(), maxsplit=1)
                for line in text[start:].splitlines() if re.match(r"  \S.*\S\s{2,}\S", line))


def _bytes(text: str) -> int:
    """``1,013,874,176 B (966.91 MiB)`` -> 1013874176, checking the one byte format."""
    m = re.fullmatch(r"([\d,]+) B( \([\d,.]+ [KMGT]iB\))?", text.strip())
    assert m, f"not the byte format: {text!r}"
    return int(m.group(1).replace(",", ""))


def test_demo_names_each_lower_bound_and_shows_the_pinned_bytes(tmp_path, monkeypatch,
                                                                capsys):
    """A trace with blocks never freed: the pool plans the others and pins these beside the
    arena; the demo prints the lower bound once, the plan against what its own blocks
    allow, the pinned bytes, and how they add up."""
    monkeypatch.setattr(bundled, "TRACE_DIR", tmp_path)
    mib = 1 << 20
    rows = [(0, 0, 4, 3 * mib), (1, 1, None, 2 * mib), (2, 2, 3, 4 * mib), (3, 5, 6, 1 * mib)]
    pgmo.write_trace(pgmo.Trace.from_rows(rows, metadata={"synthetic": True}),
                     tmp_path / "pinned.json.gz")
    assert main(["demo", "--trace", "pinned", "-o", str(tmp_path / "d.png"),
                 "--time-limit", "1", "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "1 of them never freed in the iteration (2,097,152 B (2.00 MiB))" in text
    assert "lower bound: 9,437,184 B (9.00 MiB) (the most bytes live at once" in text
    _assert_a_clean_replay(text)
    rows = _replay_rows(text)
    assert rows["planned peak (the arena)"] == \
        "7,340,032 B (7.00 MiB)  (as low as the 3 blocks freed in the iteration allow)"
    assert rows["+ pinned outside the arena"].startswith("2,097,152 B (2.00 MiB)  (kept bytes")
    assert rows["= held for the plan"] == \
        "9,437,184 B (9.00 MiB)  (the lower bound: pinning costs nothing here)"
    assert "lower_bound" not in text  # one name per quantity, as a person reads it
    for number in re.findall(r"(?<![\d,.])\d{4,}(?![\d,])", text):
        pytest.fail(f"a byte count without the byte format: {number}")


def test_demo_times_each_method_after_a_warm_up(tmp_path, monkeypatch, capsys):
    """A process's first solve pays for imports and caches: the demo's table times each
    method only after a solve of the same method, so that the times compare the methods."""
    from pgmo import demo

    calls = []

    def solve(trace, **options):
        calls.append((options["method"], len(trace)))
        return real(trace, **options)

    real = demo.solve
    monkeypatch.setattr(demo, "solve", solve)
    assert main(["demo", "--trace", "synthetic-alexnet-train-b32", "-o",
                 str(tmp_path / "d.png"), "--time-limit", "1", "--no-progress"]) == 0
    assert calls[-2:] == [("bestfit", 51), ("best", 51)]  # the two in the table
    assert {method for method, _ in calls[:-2]} == {"bestfit", "best"}  # each warmed up
    assert "time (after a warm-up)" in capsys.readouterr().out


def test_demo_shows_progress_and_verbose_details(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "pgmo", "demo", "--trace",
                           "synthetic-alexnet-train-b32", "-o", str(tmp_path / "d.png"),
                           "--time-limit", "1", "--progress", "-v"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    n_events = 4 * (2 * 51)  # four iterations of 51 blocks, each allocated and freed
    assert f"replay: 100%" in proc.stderr and f"{n_events}/{n_events}" in proc.stderr
    assert "pgmo memory summary" in proc.stdout  # -v: the pool's summary after the replay
    assert "best: what the search did" in proc.stdout and "  proved_optimal" in proc.stdout


def test_traces_verbose_shows_each_file_and_its_metadata(capsys):
    assert main(["traces"]) == 0
    plain = capsys.readouterr().out
    # the lower bound of one iteration, labelled so (bench_footprint's covers a whole run)
    assert plain.split()[:4] == ["name", "kind", "blocks", "bound/iter"]
    assert "bound/iter: the lower bound, the most bytes live at once in the trace's one " \
           "iteration" in plain
    assert main(["traces", "-v"]) == 0
    verbose = capsys.readouterr().out
    path = bundled.path("h100-alexnet-train-b32")
    assert f"file      {path}" in verbose and "file      " not in plain
    assert f"sha256    {bundled.RECORDINGS['h100-alexnet-train-b32'].sha256}" in verbose
    assert "command   record_traces.py --device 0 " in verbose


def test_demo_replays_through_the_engine_without_cupy(tmp_path):
    """No CuPy (a 'cupy' import fails): the demo still replays, through host_engine."""
    code = ("import sys\n"
            "sys.modules['cupy'] = None  # as if CuPy were not installed\n"
            "from pgmo.cli import main\n"
            f"sys.exit(main(['demo', '--trace', 'synthetic-alexnet-train-b32', '-o', "
            f"{str(tmp_path / 'demo.png')!r}, '--time-limit', '1']))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "through pgmo's engine (CuPy is not installed) on host memory" in proc.stdout
    _assert_a_clean_replay(proc.stdout)
    # no progress bar (output not a terminal): a line after each iteration instead
    assert re.findall(r"^  iteration (\d) of 4 replayed \((.+)\), [\d.]+ s$", proc.stdout,
                      re.M) == [("1", "warm-up"), ("2", "profiling"), ("3", "from the plan"),
                                ("4", "from the plan")]


# -- every format pgmo writes, everywhere a trace is taken -------------------------------
def saved_pool_plan(tmp_path):
    """A pool's saved plan file, made without the pool: a profile with an open block."""
    import pgmo
    from pgmo.formats import planfile

    profile = pgmo.Trace.from_columns([0, 1, 3, 5], [2, 4, 6, None], [1024, 2048, 3072, 512])
    plan = pgmo.solve(profile.without_open(), method="bestfit")
    path = tmp_path / "pool-plan.json"
    planfile.save(path, profile, plan.offsets, plan.method)
    return path, profile


def test_commands_read_the_pools_saved_plans(tmp_path, capsys):
    path, profile = saved_pool_plan(tmp_path)
    assert main(["solve", str(path), "--method", "bestfit"]) == 0
    assert "n           4" in capsys.readouterr().out  # the open block counts, live to the end
    assert main(["check", str(path), str(path)]) == 0
    assert "valid: 3 blocks" in capsys.readouterr().out  # the plan places the closed ones
    if importlib.util.find_spec("matplotlib"):
        assert main(["plot", str(path), "--plan", str(path), "-o", str(tmp_path / "p.png")]) == 0


def test_a_folder_is_named_as_such(tmp_path, capsys):
    assert main(["solve", str(tmp_path)]) == 2
    assert "is a directory, not a trace file" in capsys.readouterr().err


def test_unknown_content_names_the_known_formats(tmp_path, capsys):
    path = tmp_path / "x.bin"
    path.write_bytes(b"\x00\x01\x02binary")
    assert main(["solve", str(path)]) == 2
    err = capsys.readouterr().err
    assert "unrecognised trace format" in err and "MiniMalloc CSV" in err and "--format" in err


def test_format_flag_overrides_detection(trace_file, capsys):
    assert main(["solve", str(trace_file), "--format", "pgmo-json"]) == 2
    assert "not valid JSON" in capsys.readouterr().err


# -- the solver flags are the API's options -------------------------------------------------
def test_every_solver_option_has_a_flag_with_the_same_default(capsys):
    import dataclasses

    from pgmo.solver.options import SolverOptions

    for command in ("solve", "plot"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        for field in dataclasses.fields(SolverOptions):
            if field.metadata.get("cli"):
                flag = "--" + field.name.replace("_", "-")
                shown = "none" if field.default is None else field.default
                assert flag in text and f"(default: {shown})" in text, (command, flag)


def test_solver_flags_reach_the_solver_and_bad_values_are_named(trace_file, capsys):
    assert main(["solve", str(trace_file), "--time-limit", "2", "--budget", "50",
                 "--seed", "3", "--method", "best", "-v"]) == 0
    out = capsys.readouterr().out
    assert "(best)" in out and "strategy" in out  # --verbose prints the solver's report
    with pytest.raises(SystemExit):
        main(["solve", str(trace_file), "--time-limit", "soon"])
    assert "--time-limit expects a number or none, got 'soon'" in capsys.readouterr().err
    # The option's own check, spelled as the command line spells it (none, not None).
    with pytest.raises(SystemExit):
        main(["solve", str(trace_file), "--time-limit", "-1"])
    assert ("argument --time-limit: must be a number of seconds >= 0 (or none for no limit), "
            "got '-1'") in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["solve", str(trace_file), "--budget", "0"])
    assert "argument --budget: must be a positive number of search steps (or none), got '0'" \
        in capsys.readouterr().err
    with pytest.raises(SystemExit):  # the demo checks its limit as solve does
        main(["demo", "--time-limit", "-1"])
    assert ("argument --time-limit: must be a number of seconds >= 0 (or none for no limit), "
            "got '-1'") in capsys.readouterr().err


def test_reserved_that_is_neither_a_size_nor_a_file_says_both_are_accepted(trace_file,
                                                                           capsys):
    assert main(["analyze", str(trace_file), "--method", "bestfit", "--reserved", "lots"]) == 2
    err = capsys.readouterr().err
    assert "'lots' is neither a size (bytes, or with a unit: '12GiB', '8 GB') nor a file" in err
    assert err.count("\n") == 1


def test_plot_and_solve_share_one_default_method(trace_file, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    from pgmo.solver.options import SolverOptions

    assert main(["plot", str(trace_file), "-o", str(tmp_path / "p.png")]) == 0
    assert f"({SolverOptions().method}," in capsys.readouterr().out


@pytest.mark.parametrize("name", ["h100-densenet-bc100-k12-train-b64-recompute-on-stock",
                                  "pytorch-snapshot-small-cnn-h100.pickle"])
def test_the_plot_title_stays_inside_the_picture(name, tmp_path):
    """Two pictures: a long trace name once cut the title at both edges."""
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from pgmo.measure.plot import plan_figure

    blocks = [(i, i, i + 3, (i % 7 + 1) << 20) for i in range(50)]
    trace = pgmo.Trace(pgmo.Trace.from_tuples(blocks).blocks, source=f"/some/where/{name}")
    fig = plan_figure(pgmo.solve(trace, method="bestfit"))
    try:
        fig.canvas.draw()
        title = fig.axes[0].title
        box, page = title.get_window_extent(), fig.bbox
        assert name in title.get_text()
        assert page.x0 <= box.x0 and box.x1 <= page.x1 and box.y1 <= page.y1
    finally:
        plt.close(fig)


def test_the_plot_says_what_it_shows():
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    import pgmo
    from pgmo.measure.plot import plan_figure

    trace = pgmo.Trace.from_tuples([(0, 4, 3 << 20), (1, 3, 2 << 20), (3, 6, 4 << 20)])
    plan = pgmo.solve(trace, method="bestfit")
    fig = plan_figure(plan)
    try:
        blocks, live = fig.axes[0], fig.axes[1]
        assert "bestfit" in blocks.get_title() and "peak 7.00 MiB" in blocks.get_title()
        assert "lower bound 7.00 MiB" in blocks.get_title()
        assert blocks.get_ylabel() == "address (MiB)" and live.get_ylabel() == "live (MiB)"
        assert live.get_xlabel().startswith("event tick")
        assert {t.get_text() for t in blocks.get_legend().get_texts()} == {
            "peak 7.00 MiB", "lower bound 7.00 MiB"}
        colour_bar = fig.axes[2]
        assert colour_bar.get_ylabel() == "block size (MiB)"
    finally:
        plt.close(fig)
