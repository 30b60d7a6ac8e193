"""Reading and writing traces: every bad input is named by file, line and field."""

from __future__ import annotations

import gzip
import json
import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pgmo
from pgmo.formats import TraceFormatError, load as read_trace_and_offsets

from .strategies import event_traces, traces
from .benchmarks import BENCH, needs_bench



HEADER = "id,lower,upper,size\n"


def write(tmp_path: Path, name: str, text: str | bytes) -> Path:
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def assert_names(err: TraceFormatError, path: Path, line: int | None, field: str | None):
    """The message (not just the attributes) tells the user where to look."""
    message = str(err)
    assert message.startswith(str(path))
    assert err.path == str(path)
    assert err.line == line
    assert err.field == field
    if line is not None:
        assert f"line {line}" in message
    if field is not None:
        assert f"field '{field}'" in message


# -- CSV: every bad input ------------------------------------------------------
CSV_ERRORS = [
    # (name, text, line, field, reason)
    ("missing column", "id,lower,size\n0,0,4\n", 1, "upper", "missing column"),
    ("unknown column", "id,lower,upper,size,colour\n0,0,1,4,red\n", 1, "colour",
     "unknown column"),
    ("column twice", "id,lower,upper,size,size\n0,0,1,4,4\n", 1, "size", "twice"),
    ("no header", "0,0,1,4\n1,1,2,4\n", 1, "id", "missing column"),
    ("non-integer lower", HEADER + "0,0,1,4\n1,x,2,4\n", 3, "lower", "expected an integer, got 'x'"),
    ("fractional size", HEADER + "0,0,1,4.5\n", 2, "size", "expected an integer, got '4.5'"),
    ("empty size", HEADER + "0,0,1,\n", 2, "size", "expected an integer"),
    ("zero size", HEADER + "0,0,1,0\n", 2, "size", "size must be > 0, got 0"),
    ("negative size", HEADER + "0,0,1,-8\n", 2, "size", "size must be > 0, got -8"),
    ("upper equals lower", HEADER + "0,3,3,4\n", 2, "upper", "upper must be > lower"),
    ("upper below lower", HEADER + "0,5,2,4\n", 2, "upper", "lower=5 upper=2"),
    ("negative lower", HEADER + "0,-1,2,4\n", 2, "lower", "lower must be >= 0"),
    ("duplicate id", HEADER + "7,0,1,4\n7,1,2,4\n", 3, "id", r"duplicate id 7 \(first seen at line 2\)"),
    ("duplicate string id", HEADER + "b1,0,1,4\nb1,1,2,4\n", 3, "id", "duplicate id b1"),
    ("empty id", HEADER + ",0,1,4\n", 2, "id", "empty id"),
    ("too few fields", HEADER + "0,0,1,4\n1,0,1\n", 3, None, "expected 4 fields .*got 3"),
    ("too many fields", HEADER + "0,0,1,4,9\n", 2, None, "expected 4 fields .*got 5"),
    ("empty file", "", 1, None, "empty file"),
    ("blank lines only", "\n \n\n", 1, None, "empty file"),
    ("header only", HEADER, 2, None, "no blocks after the header"),
    ("negative offset", "id,lower,upper,size,offset\n0,0,1,4,0\n1,0,1,4,-4\n", 3, "offset",
     "offset must be >= 0, got -4"),
    ("non-integer offset", "id,lower,upper,size,offset\n0,0,1,4,0x10\n", 2, "offset",
     "expected an integer, got '0x10'"),
    ("missing offset", "id,lower,upper,size,offset\n0,0,1,4,0\n1,1,2,4,\n", 3, "offset",
     "every row needs one"),
    # Line numbers are file lines: blank lines count.
    ("line after blank lines", HEADER + "0,0,1,4\n\n\n1,1,1,4\n", 5, "upper", "upper must be > lower"),
]


@pytest.mark.parametrize("text, line, field, reason", [c[1:] for c in CSV_ERRORS],
                         ids=[c[0] for c in CSV_ERRORS])
def test_bad_csv_is_named_by_file_line_and_field(tmp_path, text, line, field, reason):
    path = write(tmp_path, "bad.csv", text)
    with pytest.raises(TraceFormatError, match=reason) as err:
        pgmo.read_trace(path)
    assert_names(err.value, path, line, field)


def test_bad_input_error_is_a_value_error(tmp_path):
    path = write(tmp_path, "bad.csv", HEADER + "0,0,1,0\n")
    with pytest.raises(ValueError):
        pgmo.read_trace(path)


def test_missing_file_is_named(tmp_path):
    path = tmp_path / "nope.csv"
    with pytest.raises(TraceFormatError, match="no such file") as err:
        pgmo.read_trace(path)
    assert_names(err.value, path, None, None)


def test_non_utf8_csv_is_a_trace_error(tmp_path):
    path = write(tmp_path, "latin.csv", HEADER.encode() + b"0,0,1,4\n\xff\xfe,1,2,3\n")
    with pytest.raises(TraceFormatError, match="UTF-8") as err:
        pgmo.read_trace(path)
    assert err.value.path == str(path)


def test_header_is_flexible_about_case_order_spaces_and_bom(tmp_path):
    path = write(tmp_path, "t.csv", "\ufeff Size ,UPPER,lower,Id\n4,2,0,a\n8, 3 ,1,b\n")
    trace = pgmo.read_trace(path)
    assert trace.blocks == (pgmo.Block("a", 0, 2, 4), pgmo.Block("b", 1, 3, 8))
    assert trace.source == str(path)


def test_minimalloc_string_ids_are_accepted(tmp_path):
    path = write(tmp_path, "ids.csv", HEADER + "b1,0,2,4\nb2,1,3,4\n3,2,4,1\n")
    trace = pgmo.read_trace(path)
    assert [b.id for b in trace] == ["b1", "b2", 3]
    out = tmp_path / "out.csv"
    pgmo.write_trace(trace, out)
    assert pgmo.read_trace(out).blocks == trace.blocks


def test_offset_column_is_read_and_checked(tmp_path):
    path = write(tmp_path, "plan.csv", "id,lower,upper,size,offset\n0,0,2,4,0\n1,1,3,4,4\n")
    trace, offsets = read_trace_and_offsets(path)
    assert offsets == [0, 4] and len(trace) == 2
    assert pgmo.read_trace(path) == trace  # read_trace ignores the offsets


# -- inclusive lifetimes (IREE) -----------------------------------------------
def test_inclusive_lifetimes_become_half_open(tmp_path):
    path = write(tmp_path, "iree.csv", HEADER + "0,0,0,4\n1,0,3,2\n2,3,5,1\n")
    trace = pgmo.read_trace(path, inclusive=True)
    assert trace.blocks == (pgmo.Block(0, 0, 1, 4), pgmo.Block(1, 0, 4, 2),
                            pgmo.Block(2, 3, 6, 1))
    # Blocks 1 and 2 share tick 3 when both ends are inclusive.
    assert trace.lower_bound() == 6
    with pytest.raises(TraceFormatError, match="upper must be > lower") as err:
        pgmo.read_trace(path)  # a one-tick inclusive lifetime is empty half-open
    assert_names(err.value, path, 2, "upper")


def test_inclusive_upper_below_lower_is_still_an_error(tmp_path):
    path = write(tmp_path, "iree.csv", HEADER + "0,4,2,4\n")
    with pytest.raises(TraceFormatError, match="lower=4 upper=2") as err:
        pgmo.read_trace(path, inclusive=True)
    assert_names(err.value, path, 2, "upper")


@needs_bench
def test_iree_trace_reads_inclusive_with_its_own_valid_offsets():
    path = BENCH / "idealloc" / "iree" / "iree_mobilenet.csv"
    plan = pgmo.read_plan(path, inclusive=True)
    assert len(plan.trace) == 56
    assert plan.lower_bound == 7311744  # the README's inclusive max load


# -- JSON: every bad input -----------------------------------------------------
def good_doc(**changes):
    doc = {"format": "pgmo-trace", "version": 1, "metadata": {"model": "toy"},
           "columns": ["id", "lower", "upper", "size"],
           "rows": [[0, 0, 2, 4], [1, 1, 3, 8]]}
    doc.update(changes)
    return doc


JSON_ERRORS = [
    # (name, document, field, reason)
    ("not an object", [1, 2], "format", "not a pgmo trace"),
    ("wrong format tag", good_doc(format="minimalloc"), "format", "not a pgmo trace"),
    ("no format tag", {k: v for k, v in good_doc().items() if k != "format"}, "format",
     "not a pgmo trace"),
    ("future version", good_doc(version=2), "version", "unsupported version 2"),
    ("unknown column", good_doc(columns=["id", "lower", "upper", "size", "colour"]), "columns",
     "must list fields"),
    ("missing column", good_doc(columns=["id", "lower", "upper"], rows=[[0, 0, 1]]), "size",
     "missing column"),
    ("rows not a list", good_doc(rows={"0": [0, 0, 1, 4]}), "rows", "non-empty list"),
    ("no rows", good_doc(rows=[]), "rows", "non-empty list"),
    ("short row", good_doc(rows=[[0, 0, 2, 4], [1, 1, 3]]), "rows", "block 1: expected a list of 4"),
    ("row not a list", good_doc(rows=[[0, 0, 2, 4], "1,1,3,8"]), "rows", "block 1"),
    ("string size", good_doc(rows=[[0, 0, 2, "big"]]), "size", "block 0: expected an integer"),
    ("float size", good_doc(rows=[[0, 0, 2, 4.5]]), "size", "block 0: expected an integer"),
    ("boolean lower", good_doc(rows=[[0, True, 2, 4]]), "lower", "block 0: expected an integer"),
    ("zero size", good_doc(rows=[[0, 0, 2, 4], [1, 1, 3, 0]]), "size", "block 1: size must be > 0"),
    ("empty lifetime", good_doc(rows=[[0, 2, 2, 4]]), "upper", "block 0: upper must be > lower"),
    ("duplicate id", good_doc(rows=[[5, 0, 2, 4], [5, 1, 3, 8]]), "id",
     r"block 1: duplicate id 5 \(first seen at block 0\)"),
    ("negative offset", good_doc(columns=["id", "lower", "upper", "size", "offset"],
                                 rows=[[0, 0, 2, 4, -1]]), "offset", "block 0: offset must be >= 0"),
    ("null offset", good_doc(columns=["id", "lower", "upper", "size", "offset"],
                             rows=[[0, 0, 2, 4, 0], [1, 1, 3, 8, None]]), "offset",
     "block 1: missing value"),
    ("metadata not an object", good_doc(metadata=[1]), "metadata", "'metadata' must be an object"),
]


@pytest.mark.parametrize("suffix", [".json", ".json.gz"])
@pytest.mark.parametrize("doc, field, reason", [c[1:] for c in JSON_ERRORS],
                         ids=[c[0] for c in JSON_ERRORS])
def test_bad_json_is_named_by_file_and_field(tmp_path, suffix, doc, field, reason):
    path = tmp_path / ("bad" + suffix)
    data = json.dumps(doc).encode()
    path.write_bytes(gzip.compress(data) if suffix.endswith(".gz") else data)
    with pytest.raises(TraceFormatError, match=reason) as err:
        pgmo.read_trace(path)
    assert_names(err.value, path, None, field)


def test_invalid_json_names_the_line(tmp_path):
    path = write(tmp_path, "bad.json", '{"format": "pgmo-trace",\n "version": 1,,\n}')
    with pytest.raises(TraceFormatError, match="not valid JSON") as err:
        pgmo.read_trace(path)
    assert_names(err.value, path, 2, None)


def test_truncated_json_gz_is_a_trace_error(tmp_path):
    data = gzip.compress(json.dumps(good_doc()).encode())
    path = write(tmp_path, "cut.json.gz", data[: len(data) // 2])
    with pytest.raises(TraceFormatError, match="cannot be read") as err:
        pgmo.read_trace(path)
    assert_names(err.value, path, None, None)


def test_compression_is_recognised_by_content_not_by_name(tmp_path):
    plain = write(tmp_path, "plain.json.gz", json.dumps(good_doc()))
    packed = tmp_path / "packed.json"
    packed.write_bytes(gzip.compress(json.dumps(good_doc()).encode()))
    assert pgmo.read_trace(plain).blocks == pgmo.read_trace(packed).blocks


# -- round trips -----------------------------------------------------------------
def _offsets_strategy(trace_strategy):
    return trace_strategy.flatmap(lambda t: st.tuples(
        st.just(t), st.one_of(st.none(), st.lists(st.integers(0, 10**12), min_size=len(t),
                                                  max_size=len(t)))))


@settings(max_examples=40, deadline=None)
@given(case=_offsets_strategy(st.one_of(traces(), event_traces())),
       suffix=st.sampled_from([".csv", ".json", ".json.gz"]))
def test_round_trip_keeps_blocks_offsets_and_json_metadata(case, suffix):
    trace, offsets = case
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / ("trace" + suffix)
        pgmo.write_trace(trace, path, offsets=offsets)
        back, back_offsets = read_trace_and_offsets(path)
    assert back.blocks == trace.blocks
    assert back_offsets == offsets
    if suffix != ".csv":
        assert back.metadata == trace.metadata  # CSV has nowhere to keep it
    assert back.lower_bound() == trace.lower_bound()


def test_json_gz_is_really_gzip_and_json_is_not(tmp_path):
    trace = pgmo.Trace.from_tuples([(0, 2, 4)], {"model": "toy"})
    pgmo.write_trace(trace, tmp_path / "t.json.gz")
    pgmo.write_trace(trace, tmp_path / "t.json")
    assert json.loads(gzip.decompress((tmp_path / "t.json.gz").read_bytes()))["rows"]
    assert json.loads((tmp_path / "t.json").read_text())["metadata"] == {"model": "toy"}


def test_writing_wrong_number_of_offsets_is_refused(tmp_path):
    trace = pgmo.Trace.from_tuples([(0, 2, 4), (1, 3, 4)])
    with pytest.raises(ValueError, match="1 offsets for 2 blocks"):
        pgmo.write_trace(trace, tmp_path / "t.csv", offsets=[0])
    assert not (tmp_path / "t.csv").exists()


FAILED_WRITES = [
    (".csv", "offset"), (".json", "offset"), (".json.gz", "offset"),
    (".json", "metadata"), (".json.gz", "metadata"),
]


@pytest.mark.parametrize("suffix, what", FAILED_WRITES)
def test_failed_write_leaves_existing_file_intact(tmp_path, suffix, what):
    path = tmp_path / ("t" + suffix)
    pgmo.write_trace(pgmo.Trace.from_tuples([(0, 2, 4), (1, 3, 4)]), path)
    before = path.read_bytes()
    if what == "offset":  # an offset that is not a number
        bad, offsets, error = pgmo.Trace.from_tuples([(0, 2, 4), (1, 3, 4)]), [0, "four"], ValueError
    else:  # metadata that JSON cannot hold
        bad, offsets, error = pgmo.Trace.from_tuples([(0, 2, 4)], {"device": object()}), None, TypeError
    with pytest.raises(error):
        pgmo.write_trace(bad, path, offsets=offsets)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]  # no temp files left


@pytest.mark.skipif(os.name != "posix", reason="POSIX permissions")
def test_written_file_has_ordinary_permissions(tmp_path):
    umask = os.umask(0o022)
    try:
        path = tmp_path / "t.csv"
        pgmo.write_trace(pgmo.Trace.from_tuples([(0, 2, 4)]), path)
        assert path.stat().st_mode & 0o777 == 0o644
        path.chmod(0o640)
        pgmo.write_trace(pgmo.Trace.from_tuples([(0, 2, 8)]), path)  # overwriting keeps the mode
        assert path.stat().st_mode & 0o777 == 0o640
    finally:
        os.umask(umask)


def test_write_failing_at_the_disk_leaves_no_temp_file(tmp_path, monkeypatch):
    path = tmp_path / "t.csv"
    pgmo.write_trace(pgmo.Trace.from_tuples([(0, 2, 4)]), path)
    before = path.read_bytes()

    def disk_full(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pgmo.formats.files.os, "replace", disk_full)
    with pytest.raises(OSError, match="No space left"):
        pgmo.write_trace(pgmo.Trace.from_tuples([(0, 2, 8)]), path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]


# -- the pool's plan files, without the pool --------------------------------------------
def _saved_plan() -> tuple[pgmo.Trace, bytes]:
    from pgmo.formats import planfile

    profile = pgmo.Trace.from_columns([0, 1, 3, 5], [2, 4, 6, None], [1024, 2048, 3072, 512])
    plan = pgmo.solve(profile.without_open(), method="bestfit")
    return profile, planfile.dumps(profile, plan.offsets, plan.method, {"note": "test"})


def test_plan_file_round_trip_keeps_open_blocks_and_offsets(tmp_path):
    from pgmo.formats import planfile

    profile, data = _saved_plan()
    saved = planfile.loads(data)
    assert saved.profile.blocks == profile.blocks and saved.profile.open_ids == (3,)
    assert saved.method == "bestfit" and saved.extra == {"note": "test"}
    path = tmp_path / "plan.pgmo.gz"
    path.write_bytes(gzip.compress(data))
    assert pgmo.read_trace(path).blocks == profile.blocks  # every command reads it
    plan = pgmo.read_plan(path)
    assert plan.trace.blocks == profile.without_open().blocks
    assert list(plan.offsets) == saved.offsets


@pytest.mark.parametrize("damage, reason", [
    (lambda d: d[: len(d) // 2], "damaged or truncated"),
    (lambda d: d.replace(b'"offsets":[', b'"offsets":[1', 1), "checksum mismatch"),
    (lambda d: d.replace(b'"version":1', b'"version":7'), "version 7"),
])
def test_a_damaged_plan_file_is_refused_with_the_reason(damage, reason):
    from pgmo.formats import planfile

    _, data = _saved_plan()
    with pytest.raises(pgmo.PlanFileError, match=reason):
        planfile.loads(damage(data), "plan.json")


def test_a_trace_of_numpy_columns_is_written_as_plain_integers(tmp_path):
    import numpy as np

    trace = pgmo.Trace.from_columns(np.array([0, 1]), np.array([2, 4]), np.array([4, 4]))
    for name in ("t.json", "t.csv"):
        pgmo.write_trace(trace, tmp_path / name)
        back = pgmo.read_trace(tmp_path / name)
        assert [(b.lower, b.upper, b.size) for b in back] == [(0, 2, 4), (1, 4, 4)]
        assert all(type(b.size) is int for b in back)


@pytest.mark.parametrize("columns, field", [(([0], [0], [4]), "upper"),
                                            (([0], [2], [0]), "size"),
                                            (([-1], [2], [4]), "lower")])
def test_a_trace_the_readers_would_refuse_is_not_written(tmp_path, columns, field):
    """A file written by pgmo reads back: a block the readers refuse is named, and no
    file is left."""
    trace = pgmo.Trace.from_columns(*columns)
    path = tmp_path / "bad.json"
    with pytest.raises(ValueError, match=rf"bad.json: block 0 \(id 0\) cannot be written: "
                                         rf"field '{field}'"):
        pgmo.write_trace(trace, path)
    assert not path.exists()


def test_a_trace_of_tuples_is_refused_at_once_with_the_way_to_make_one():
    with pytest.raises(TypeError, match="Trace.from_rows"):
        pgmo.Trace([(0, 1, 4)])
