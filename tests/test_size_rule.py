"""The one rule for sizes: every reader, the API and the command line refuse a request
larger than any device holds, or a trace whose sizes together could overflow the solvers'
64-bit sums, naming the file, the line (or record) and the field."""

from __future__ import annotations

import json
import pickle

import pytest

import pgmo
from pgmo.cli import main
from pgmo.errors import PlanFileError, TraceFormatError
from pgmo.formats import planfile
from pgmo.measure.analysis import at_granularity
from pgmo.units import MAX_DEVICE_BYTES, MAX_TRACE_BYTES

HUGE = 99999999999999999999999999999
HEADER = "id,lower,upper,size\n"


def csv_file(tmp_path, sizes, name="t.csv"):
    """Blocks all live together, one per size."""
    path = tmp_path / name
    path.write_text(HEADER + "".join(f"{i},0,5,{s}\n" for i, s in enumerate(sizes)))
    return path


def test_the_rule_keeps_the_solvers_sums_inside_int64():
    assert MAX_DEVICE_BYTES == 1 << 48  # the plan files' bound, the same constant
    # any offset plus a size plus a big-M of the total stays below the sentinels of 2**62
    assert 2 * MAX_TRACE_BYTES + MAX_DEVICE_BYTES < 1 << 62


@pytest.mark.parametrize("size", [HUGE, 1 << 62, MAX_DEVICE_BYTES + 1])
def test_a_csv_size_beyond_any_device_is_refused_naming_line_and_field(tmp_path, size):
    path = csv_file(tmp_path, [512, size])
    with pytest.raises(TraceFormatError) as err:
        pgmo.read_trace(path)
    assert (err.value.path, err.value.line, err.value.field) == (str(path), 3, "size")
    assert "more than any device holds" in str(err.value)


def test_sizes_that_together_exceed_the_trace_bound_are_refused_where_they_do(tmp_path):
    n = MAX_TRACE_BYTES // MAX_DEVICE_BYTES  # exactly the bound: accepted
    assert len(pgmo.read_trace(csv_file(tmp_path, [MAX_DEVICE_BYTES] * n))) == n
    path = csv_file(tmp_path, [MAX_DEVICE_BYTES] * (n + 1), "over.csv")
    with pytest.raises(TraceFormatError) as err:
        pgmo.read_trace(path)
    assert (err.value.line, err.value.field) == (n + 2, "size")
    assert "total" in str(err.value)


def test_a_json_size_beyond_any_device_names_the_block(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"format": "pgmo-trace", "version": 1, "metadata": {},
                                "columns": ["id", "lower", "upper", "size"],
                                "rows": [[0, 0, 5, 512], [1, 0, 5, HUGE]]}))
    with pytest.raises(TraceFormatError) as err:
        pgmo.read_trace(path)
    assert err.value.field == "size" and "block 1:" in str(err.value)
    assert str(err.value).startswith(str(path))


def test_an_rmm_size_beyond_any_device_names_the_line(tmp_path):
    path = tmp_path / "log.csv"
    path.write_text("Thread,Time,Action,Pointer,Size,Stream\n"
                    "1,12:00:00,allocate,0x7f0000000000,1024,0x0\n"
                    f"1,12:00:01,allocate,0x7f0000001000,{HUGE},0x0\n")
    with pytest.raises(TraceFormatError) as err:
        pgmo.read_trace(path)
    assert (err.value.line, err.value.field) == (3, "Size")
    assert "more than any device holds" in str(err.value)


@pytest.mark.parametrize("where", ["event", "segment"])
def test_a_pytorch_size_beyond_any_device_names_the_record(tmp_path, where):
    events = [{"action": "alloc", "addr": 0x1000, "size": 512, "stream": 0}]
    segments = []
    if where == "event":
        events.append({"action": "alloc", "addr": 0x2000, "size": HUGE, "stream": 0})
        place = "device_traces[0][1]"
    else:
        segments.append({"device": 0, "address": 0x9000, "total_size": HUGE, "stream": 0,
                         "blocks": [{"size": HUGE, "requested_size": HUGE,
                                     "state": "active_allocated"}]})
        place = "segments[0]"
    path = tmp_path / "snap.pickle"
    path.write_bytes(pickle.dumps({"segments": segments, "device_traces": [events]}))
    with pytest.raises(TraceFormatError) as err:
        pgmo.read_trace(path)
    assert place in str(err.value) and "more than any device holds" in str(err.value)
    assert err.value.path == str(path)


def test_a_trace_built_in_python_refuses_such_a_size_as_a_value_error():
    with pytest.raises(ValueError, match="row 1.*more than any device holds|"
                                         "line 1.*more than any device holds"):
        pgmo.Trace.from_rows([(0, 5, 512), (0, 5, HUGE)])
    assert pgmo.Trace.from_rows([(0, 5, MAX_DEVICE_BYTES)]).lower_bound() == MAX_DEVICE_BYTES


def test_a_plan_file_whose_sizes_total_too_much_is_refused():
    n = MAX_TRACE_BYTES // MAX_DEVICE_BYTES + 1  # one after another: each fits, peak fits
    profile = pgmo.Trace.from_columns(list(range(n)), list(range(1, n + 1)),
                                      [MAX_DEVICE_BYTES] * n)
    data = planfile.dumps(profile, [0] * n, "file")
    with pytest.raises(PlanFileError, match="total"):
        planfile.loads(data, "plan.json")


def test_rounding_to_a_granularity_obeys_the_rule_too():
    trace = pgmo.Trace.from_rows([(i, i + 1, 1) for i in range(4096)])
    assert at_granularity(trace, MAX_DEVICE_BYTES).total_bytes == MAX_TRACE_BYTES
    over = pgmo.Trace.from_rows([(i, i + 1, 1) for i in range(4097)])
    with pytest.raises(TraceFormatError, match="granularity"):
        at_granularity(over, MAX_DEVICE_BYTES)


def test_the_commands_answer_a_huge_size_with_one_line(tmp_path, capsys):
    huge = csv_file(tmp_path, [HUGE])
    big3 = csv_file(tmp_path, [1 << 62] * 3, "big3.csv")
    for argv in (["solve", str(huge)], ["solve", "--method", "exact", str(big3)],
                 ["plot", str(huge), "-o", str(tmp_path / "p.png")]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("pgmo: error: ") and err.count("\n") == 1, err
        assert "line 2, field 'size'" in err
    assert not (tmp_path / "p.png").exists()


def test_the_largest_sizes_solve_exactly_and_plot(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    path = csv_file(tmp_path, [MAX_DEVICE_BYTES] * 3)
    assert main(["solve", "--method", "exact", "--time-limit", "30", str(path)]) == 0
    assert f"{3 * MAX_DEVICE_BYTES:,} B" in capsys.readouterr().out
    assert main(["plot", str(path), "--method", "bestfit", "-o", str(tmp_path / "p.png")]) == 0


@pytest.mark.parametrize("value", ["99999999999999999999", str(MAX_DEVICE_BYTES + 1), "0",
                                   "-5", "x"])
def test_analyze_refuses_a_granularity_no_device_has(value, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["analyze", "h100-alexnet-train-b32", "--granularity", value])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "argument --granularity: expects a number of bytes" in err
