"""``pgmo analyze`` and :func:`pgmo.analyze`: will pgmo save me memory?"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys

import pytest

import pgmo
from pgmo.measure.analysis import at_granularity, human_bytes, parse_bytes
from pgmo.cli import main
from pgmo.synth_logs import pytorch_snapshot, rmm_logs

MIB = 1 << 20


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory):
    """A generated (synthetic) snapshot: 3 iterations of a bundled trace plus weights."""
    trace = pgmo.bundled.load("synthetic-alexnet-train-b32")
    path = tmp_path_factory.mktemp("snap") / "snap.pickle"
    path.write_bytes(pickle.dumps(pytorch_snapshot(trace, iterations=3, before=[64 * MIB])))
    return path


def test_a_snapshot_is_compared_with_what_pytorch_reserved(snapshot):
    result = pgmo.analyze(snapshot, time_limit=2)
    trace = pgmo.read_trace(snapshot)
    assert result.format == "pytorch-snapshot"
    assert result.requests == len(trace) == 3 * 51 + 1
    assert result.reserved == trace.metadata["reserved_peak"]
    assert result.reserved_by.startswith("PyTorch")
    # no plan beats the lower bound; best is never worse than the paper's best-fit
    assert result.lower_bound <= result.plans["best"]["peak"] <= result.plans["bestfit"]["peak"]
    assert result.lower_bound == at_granularity(trace, 512).lower_bound()
    saved, percent = result.saving(result.plans["best"]["peak"])
    assert saved == result.reserved - result.plans["best"]["peak"]
    assert percent == pytest.approx(100 * saved / result.reserved)
    assert any("never freed" in n for n in result.notes)  # the weights


def test_granularity_one_analyses_the_sizes_as_requested():
    trace = pgmo.Trace.from_rows([(0, 2, 100), (1, 3, 1000)])
    assert pgmo.analyze(trace, granularity=1, method="bestfit").lower_bound == 1100
    assert pgmo.analyze(trace, method="bestfit").lower_bound == 512 + 1024
    with pytest.raises(ValueError, match="granularity"):
        pgmo.analyze(trace, granularity=0)


def test_the_rounding_note_says_the_pools_rounding_only_when_it_is_the_pools():
    trace = pgmo.Trace.from_rows([(0, 2, 100), (1, 3, 1000)])
    notes = {g: pgmo.analyze(trace, granularity=g, method="bestfit").notes for g in (512, 256)}
    assert "sizes rounded up to 512 B as pgmo's pool rounds them" in notes[512][0]
    assert notes[256][0].startswith("sizes rounded up to 256 B as asked")
    assert not any("pool rounds" in n for n in notes[256])
    assert not any("rounded up" in n
                   for n in pgmo.analyze(trace, granularity=1, method="bestfit").notes)


def test_nothing_to_optimize_is_said_plainly():
    all_live = pgmo.Trace.from_rows([(0, 5, 512), (1, 5, 512), (2, 5, 1024)])
    result = pgmo.analyze(all_live, method="bestfit")
    assert result.lower_bound == result.plans["bestfit"]["peak"] == result.no_reuse
    assert any(n.startswith("nothing to optimize: all 3 requests are live at the same time")
               for n in result.notes)
    empty = pgmo.analyze(pgmo.Trace(()))
    assert empty.plans == {} and empty.plan is None
    assert "nothing to optimize: the trace has no allocation requests" in empty.notes


def test_a_segment_only_snapshot_has_nothing_to_optimize(tmp_path):
    seg = {"device": 0, "address": 4096, "total_size": 2 * MIB, "stream": 0,
           "blocks": [{"size": 1024, "requested_size": 1000, "state": "active_allocated"},
                      {"size": 2048, "requested_size": 2048, "state": "active_allocated"},
                      {"size": 2 * MIB - 3072, "requested_size": 0, "state": "inactive"}]}
    path = tmp_path / "state.pickle"
    path.write_bytes(pickle.dumps([seg]))
    result = pgmo.analyze(path, method="bestfit")
    assert result.reserved == 2 * MIB and result.lower_bound == 1024 + 2048
    text = " ".join(result.notes)
    assert "nothing to optimize" in text and "_record_memory_history" in text


def test_reserved_is_refused_for_a_file_that_records_its_own(snapshot, capsys):
    """A PyTorch snapshot says what PyTorch reserved: a number typed in would silently
    replace the one to compare with."""
    with pytest.raises(ValueError, match=r"records what was reserved: .+ by PyTorch .+; "
                                         r"--reserved \(reserved=\) is only for a file that "
                                         r"does not say"):
        pgmo.analyze(snapshot, reserved="12GB", method="bestfit")
    from pgmo.cli import main

    assert main(["analyze", str(snapshot), "--reserved", "12GB", "--method", "bestfit"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("pgmo: error: ") and err.count("\n") == 1


def test_reserved_can_be_given_as_bytes_or_as_the_log_under_a_pool(tmp_path):
    trace = pgmo.bundled.load("synthetic-alexnet-train-b32")
    requests, upstream = rmm_logs(trace, iterations=2)
    req, up = tmp_path / "req.csv", tmp_path / "up.csv"
    req.write_text(requests)
    up.write_text(upstream)
    unknown = pgmo.analyze(req, method="bestfit")
    assert unknown.reserved is None and unknown.saving(unknown.lower_bound) is None
    assert any("--reserved" in n for n in unknown.notes)
    from_log = pgmo.analyze(req, reserved=up, method="bestfit")
    assert from_log.reserved == pgmo.read_trace(up).lower_bound()
    assert "up.csv" in from_log.reserved_by
    assert pgmo.analyze(req, reserved="8 GiB", method="bestfit").reserved == 8 << 30
    assert pgmo.analyze(req, reserved=123456, method="bestfit").reserved == 123456


def test_a_reservation_that_cannot_be_this_traces_is_flagged(tmp_path):
    trace = pgmo.Trace.from_rows([(0, 2, 1024), (1, 3, 1024)])
    below = pgmo.analyze(trace, reserved=1024, method="bestfit")
    assert any("below the lower bound" in n and "savings mean nothing" in n
               for n in below.notes)
    fits = pgmo.analyze(trace, reserved=2048, method="bestfit")
    assert not any("below the lower bound" in n for n in fits.notes)
    with pytest.raises(ValueError, match=r"reserved must be >= 0 bytes, got '-5'"):
        pgmo.analyze(trace, reserved="-5")


def test_counts_are_written_in_the_singular_for_one(tmp_path):
    log = tmp_path / "one.csv"
    log.write_text("Thread,Time,Action,Pointer,Size,Stream\n1,t,allocate,0x10,8,0\n"
                   "1,t,allocate,0x20,0,0\n1,t,free,0x20,0,0\n")
    text = pgmo.analyze(log, method="bestfit").format_table()
    assert "\n1 request, sizes" in text
    assert "1 zero-size request takes no memory" in text


def test_output_into_a_closed_pipe_is_no_error(snapshot):
    """``pgmo analyze snap.pickle | head -1``: the reader has gone; pgmo says nothing."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # every write now fails with EPIPE, as after head exits
    try:
        proc = subprocess.run([sys.executable, "-m", "pgmo", "analyze", str(snapshot),
                               "--method", "bestfit"], stdout=write_end, stderr=subprocess.PIPE,
                              text=True, timeout=120)
    finally:
        os.close(write_end)
    assert proc.stderr == ""
    assert proc.returncode == 141


@pytest.mark.parametrize("text, nbytes", [("8589934592", 8 << 30), ("8GiB", 8 << 30),
                                          ("7.5 GB", 7_500_000_000), ("1_024", 1024),
                                          ("512 MiB", 512 * MIB), ("plan.csv", None),
                                          ("8 parsecs", None)])
def test_parse_bytes(text, nbytes):
    assert parse_bytes(text) == nbytes


def test_human_bytes():
    assert human_bytes(512) == "512 B"
    assert human_bytes(3 * MIB // 2) == "1.50 MiB"
    assert human_bytes(None) == "-"


def test_the_command_prints_one_table_with_the_savings(snapshot, capsys):
    assert main(["analyze", str(snapshot), "--time-limit", "1"]) == 0
    out = capsys.readouterr().out
    for text in ("pytorch-snapshot", "reserved by PyTorch", "lower bound", "bestfit plan",
                 "best plan", "no reuse", "saved vs reserved", "%", "rounded up to 512 B"):
        assert text in out
    best = next(line for line in out.splitlines() if line.startswith("best plan"))
    result = pgmo.analyze(snapshot, time_limit=1)
    assert f"{result.plans['best']['peak']:,}" in best


def test_json_output_is_machine_readable(snapshot, capsys):
    assert main(["analyze", str(snapshot), "--json", "--method", "bestfit"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc["plans"]) == {"bestfit"}
    assert doc["reserved"] - doc["plans"]["bestfit"]["peak"] == \
        doc["savings_vs_reserved"]["bestfit"]["bytes"]
    assert doc["import"]["device"] == 0 and doc["format"] == "pytorch-snapshot"


def test_plot_writes_the_picture_and_keeps_json_clean(snapshot, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    png = tmp_path / "plan.png"
    assert main(["analyze", str(snapshot), "--method", "bestfit", "--json",
                 "--plot", str(png)]) == 0
    captured = capsys.readouterr()
    json.loads(captured.out)
    assert f"wrote {png}" in captured.err
    assert png.read_bytes().startswith(b"\x89PNG")


def test_device_and_stream_flags_reach_the_reader(tmp_path, capsys):
    events = [[{"action": "alloc", "addr": 16, "size": 8, "stream": 0}],
              [{"action": "alloc", "addr": 16, "size": 4096, "stream": 3},
               {"action": "alloc", "addr": 99, "size": 1024, "stream": 4}]]
    path = tmp_path / "two.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": events}))
    assert main(["analyze", str(path), "--method", "bestfit", "--device", "0", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["requests"] == 1
    assert main(["analyze", str(path), "--method", "bestfit", "--stream", "4", "--json",
                 "--granularity", "1"]) == 0
    assert json.loads(capsys.readouterr().out)["lower_bound"] == 1024
    assert main(["solve", str(path), "--method", "bestfit", "--device", "0"]) == 0


def test_progress_is_shown_on_solves_when_asked(snapshot, capsys):
    assert main(["analyze", str(snapshot), "--progress", "--time-limit", "1"]) == 0
    assert "planning" in capsys.readouterr().err


def test_bad_input_is_one_line_without_traceback(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("Thread,Time,Action,Pointer,Size,Stream\n1,2,grow,0x1,8,0x0\n")
    proc = subprocess.run([sys.executable, "-m", "pgmo", "analyze", str(bad)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1
    assert "bad.csv, line 2, field 'Action': unknown action 'grow'" in proc.stderr


def test_the_docs_show_what_pgmo_prints_for_its_generated_snapshot(tmp_path, monkeypatch):
    """The example output of *Will pgmo save me memory?* (docs/analyze.rst), regenerated as
    the page says it was made."""
    from pathlib import Path

    from pgmo.synth_logs import main as synth_main

    readme = (Path(__file__).resolve().parents[1] / "docs" / "analyze.rst").read_text()
    block = readme.split("   $ pgmo analyze snapshot.pickle\n", 1)[1]
    shown = []
    for line in block.splitlines():
        if line and not line.startswith("   "):
            break
        shown.append(line[3:])
    monkeypatch.chdir(tmp_path)
    assert synth_main(["--iterations", "10", "--weights", "268435456",
                       "--pytorch", "snapshot.pickle"]) == 0
    printed = pgmo.analyze("snapshot.pickle").format_table()
    assert "\n".join(shown).strip() == printed.strip()
