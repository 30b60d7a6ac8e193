"""RMM allocation logs (``rmm.mr.LoggingResourceAdaptor``), written here in RMM's CSV format."""

from __future__ import annotations

import pytest
from hypothesis import given, settings

import pgmo
from pgmo.formats import TraceFormatError, detect
from pgmo.synth_logs import rmm_logs

from .strategies import event_traces

HEADER = "Thread,Time,Action,Pointer,Size,Stream\n"
T = "140573312345856"


def line(action, pointer, size, stream="0x0", time="12:00:00.000001"):
    return f"{T},{time},{action},{pointer},{size},{stream}\n"


def write(tmp_path, text, name="log.csv"):
    path = tmp_path / name
    path.write_text(text)
    return path


def rows(trace):
    return [(b.lower, b.upper, b.size) for b in trace.blocks]


def report(trace):
    return trace.metadata["import"]


def test_allocations_and_frees_become_blocks(tmp_path):
    text = HEADER + line("allocate", "0x7f8a40000000", 1024) + \
        line("allocate", "0x7f8a40000400", 2048) + line("free", "0x7f8a40000000", 1024) + \
        line("free", "0x7f8a40000400", 2048)
    path = write(tmp_path, text)
    assert detect(path).name == "rmm-log"
    trace = pgmo.read_trace(path)
    assert rows(trace) == [(0, 2, 1024), (1, 3, 2048)]
    assert trace.metadata["source_format"] == "rmm-log"
    assert trace.lower_bound() == 3072


def test_pointer_reuse_makes_a_new_block(tmp_path):
    text = HEADER + "".join(line(a, "0x1000", s) for a, s in
                            [("allocate", 256), ("free", 256), ("allocate", 512),
                             ("free", 512)])
    assert rows(pgmo.read_trace(write(tmp_path, text))) == [(0, 1, 256), (2, 3, 512)]


def test_frees_before_allocs_are_blocks_allocated_before_logging(tmp_path):
    text = HEADER + line("free", "0x5000", 4096) + line("allocate", "0x1000", 100) + \
        line("free", "0x1000", 100)
    trace = pgmo.read_trace(write(tmp_path, text))
    assert rows(trace) == [(0, 1, 4096), (2, 3, 100)]
    assert report(trace)["before_freed"] == {"count": 1, "bytes": 4096}


def test_blocks_never_freed_stay_open(tmp_path):
    trace = pgmo.read_trace(write(tmp_path, HEADER + line("allocate", "0x1000", 64)))
    assert rows(trace) == [(0, None, 64)]
    assert report(trace)["live_at_end"] == {"count": 1, "bytes": 64}


def test_failures_and_zero_sizes_are_counted_not_kept(tmp_path):
    text = HEADER + line("allocate failure", "(nil)", 1 << 40) + \
        line("allocate failure", "0x0", 8) + line("allocate", "0x1000", 0) + \
        line("free", "0x1000", 0) + line("allocate", "0x2000", 8) + line("free", "0x2000", 8)
    trace = pgmo.read_trace(write(tmp_path, text))
    assert rows(trace) == [(0, 1, 8)]
    assert report(trace)["failed_requests"] == {"count": 2, "bytes": (1 << 40) + 8}
    assert report(trace)["zero_size_requests"] == 1  # one request: its free is not another


def test_deallocate_as_in_rmms_documentation_is_a_free(tmp_path):
    text = HEADER + line("allocate", "0x1000", 8) + line("deallocate", "0x1000", 8)
    assert rows(pgmo.read_trace(write(tmp_path, text))) == [(0, 1, 8)]


def test_streams_are_read_together_unless_one_is_chosen(tmp_path):
    text = HEADER + line("allocate", "0x1000", 8, "0x0") + \
        line("allocate", "0x2000", 16, "0x7f8a38001020") + line("free", "0x1000", 8, "0x0")
    path = write(tmp_path, text)
    assert [b.size for b in pgmo.read_trace(path).blocks] == [8, 16]
    assert report(pgmo.read_trace(path))["streams"] == [0, 0x7F8A38001020]
    assert [b.size for b in pgmo.read_trace(path, stream=0x7F8A38001020).blocks] == [16]
    with pytest.raises(TraceFormatError, match="no stream 0x5 in the log"):
        pgmo.read_trace(path, stream=5)


@pytest.mark.parametrize("pointer, stream, null, default", [
    ("0x7f8a40000000", "0x5587a000", "0x0", "0x0"),  # spdlog/fmt releases (fmt::ptr)
    ("7f8a40000000", "5587a000", "0", "0"),  # first rapids-logger releases (%llx)
    ("0x7f8a40000000", "0x5587a000", "(nil)", "0"),  # 25.x/26.x (%p, format_stream)
], ids=["fmt", "llx", "current"])
def test_every_form_rmm_has_written_reads_the_same(tmp_path, pointer, stream, null, default):
    text = HEADER + line("allocate", pointer, 8, stream) + \
        line("allocate failure", null, 1 << 40, default) + \
        line("allocate", "1000", 16, default) + line("free", pointer, 8, stream) + \
        line("free", "1000", 16, default)
    path = write(tmp_path, text)
    trace = pgmo.read_trace(path)
    assert rows(trace) == [(0, 2, 8), (1, 3, 16)]
    assert report(trace)["streams"] == [0, 0x5587A000]
    assert report(trace)["failed_requests"]["count"] == 1
    # a stream is chosen as the log writes it, hexadecimal with or without 0x
    for chosen in ("5587a000", "0x5587a000", 0x5587A000):
        assert rows(pgmo.read_trace(path, stream=chosen)) == [(0, 1, 8)]
    assert [b.size for b in pgmo.read_trace(path, stream="0").blocks] == [16]


def test_a_stream_that_looks_decimal_is_still_hexadecimal(tmp_path):
    """RMM writes streams in hex; without 0x, '55870000' is 0x55870000, not 55,870,000."""
    text = HEADER + line("allocate", "1000", 8, "55870000") + line("allocate", "2000", 8, "0")
    path = write(tmp_path, text)
    assert report(pgmo.read_trace(path))["streams"] == [0, 0x55870000]
    assert len(pgmo.read_trace(path, stream="55870000").blocks) == 1
    with pytest.raises(TraceFormatError, match=r"no stream 0x7 in the log \(streams: 0, "
                                               r"0x55870000\)"):
        pgmo.read_trace(path, stream="7")


def test_a_device_cannot_be_chosen_in_a_per_device_log(tmp_path):
    path = write(tmp_path, HEADER + line("allocate", "0x1000", 8))
    with pytest.raises(TraceFormatError, match=r"RMM writes one log per device "
                                               r"\(rmm_log.dev0.csv"):
        pgmo.read_trace(path, device=1)


# -- bad input: file, line and field ---------------------------------------------------
@pytest.mark.parametrize("bad, field, reason", [
    (line("resize", "0x1000", 8), "Action", "unknown action 'resize'"),
    (line("allocate", "0x1000", -8), "Size", "size must be >= 0, got -8"),
    (line("allocate", "0x1000", "8.5"), "Size", "expected an integer, got '8.5'"),
    (line("allocate", "nowhere", 8), "Pointer", "expected a hexadecimal pointer"),
    (line("allocate", "0x0", 8), "Pointer", "null pointer"),
    (line("allocate", "0x2000", 8), "Pointer", "0x2000 allocated again without a free "
                                                "since line 2"),
    (line("free", "0x2000", 16), "Size", "free of 0x2000 with size 16, but line 2 allocated "
                                         "it with size 4"),
])
def test_bad_lines_are_named(tmp_path, bad, field, reason):
    path = write(tmp_path, HEADER + line("allocate", "0x2000", 4) + bad +
                 line("free", "0x2000", 4))
    with pytest.raises(TraceFormatError, match=reason) as e:
        pgmo.read_trace(path)
    assert (e.value.path, e.value.line, e.value.field) == (str(path), 3, field)
    assert str(e.value).startswith(f"{path}, line 3, field '{field}':")


def test_a_log_cut_off_mid_line_says_so(tmp_path):
    text = HEADER + line("allocate", "0x1000", 8) + f"{T},12:00:00.000002,fr"
    with pytest.raises(TraceFormatError, match="got 3 .*ends mid-line: flush it") as e:
        pgmo.read_trace(write(tmp_path, text))
    assert e.value.line == 3


def test_a_short_line_in_the_middle_is_not_called_a_cut_off(tmp_path):
    text = HEADER + "1,2,allocate\n" + line("allocate", "0x1000", 8)
    with pytest.raises(TraceFormatError, match="expected 6 fields") as e:
        pgmo.read_trace(write(tmp_path, text))
    assert "mid-line" not in str(e.value) and e.value.line == 2


@pytest.mark.parametrize("text, line_no, reason", [
    ("", 1, "empty file"),
    (HEADER, 2, "no allocations after the header"),
    (HEADER + "\n\n", 2, "no allocations after the header"),
])
def test_empty_logs_are_errors(tmp_path, text, line_no, reason):
    with pytest.raises(TraceFormatError, match=reason) as e:
        pgmo.read_trace(write(tmp_path, text), format="rmm-log")
    assert e.value.line == line_no


def test_a_header_without_the_needed_columns_names_the_missing_one(tmp_path):
    path = write(tmp_path, "Thread,Time,Action,Ptr,Size,Stream\n1,2,allocate,0x1,8,0\n")
    with pytest.raises(TraceFormatError, match="missing column") as e:
        pgmo.read_trace(path, format="rmm-log")
    assert (e.value.line, e.value.field) == (1, "Pointer")


def test_an_rmm_log_is_recognised_by_its_header_whatever_its_name(tmp_path):
    path = write(tmp_path, "\ufeff\n" + HEADER + line("allocate", "0x1", 8), name="log.txt")
    assert detect(path).name == "rmm-log"


# -- generated logs read back --------------------------------------------------------------
@settings(max_examples=40)
@given(event_traces())
def test_a_trace_written_as_an_rmm_log_reads_back_unchanged(tmp_path_factory, trace):
    requests, _ = rmm_logs(trace)
    path = tmp_path_factory.mktemp("rmm") / "log.csv"
    path.write_text(requests)
    assert rows(pgmo.read_trace(path)) == rows(trace)


def test_the_upstream_log_of_a_pool_peaks_at_its_reservation(tmp_path):
    trace = pgmo.bundled.load("synthetic-alexnet-train-b32")
    requests, upstream = rmm_logs(trace, iterations=3)
    up = pgmo.read_trace(write(tmp_path, upstream, "up.csv"))
    back = pgmo.read_trace(write(tmp_path, requests, "req.csv"))
    assert len(back) == 3 * len(trace)
    assert up.lower_bound() >= back.lower_bound() > 0
    assert all(b.upper is None for b in up.blocks)  # a pool keeps its memory
