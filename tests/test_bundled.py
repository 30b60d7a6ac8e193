"""The real traces shipped in ``pgmo/traces/``: tied to the GPU session that recorded them."""

from __future__ import annotations

from pathlib import Path

import pytest

from pgmo import bundled

ROOT = Path(__file__).resolve().parent.parent
#: The GPU sessions' output, kept in the repository (tests/data/gpu-evidence/README.rst).
EVIDENCE = ROOT / "tests" / "data" / "gpu-evidence"

REAL = [name for name in bundled.names() if bundled.is_real(bundled.load(name).metadata)]


def test_the_real_traces_are_exactly_the_listed_recordings():
    assert sorted(REAL) == sorted(bundled.RECORDINGS)
    assert all(name.startswith("h100-") for name in REAL)  # told apart from synthetic-*
    assert len(REAL) == 7


@pytest.mark.parametrize("name", sorted(bundled.RECORDINGS))
def test_a_real_trace_keeps_the_bytes_its_session_wrote(name):
    recording = bundled.RECORDINGS[name]
    assert recording.session in bundled.SESSIONS
    assert bundled.checksum(bundled.path(name)) == recording.sha256
    original = EVIDENCE / recording.session / recording.file
    assert bundled.checksum(original) == recording.sha256


@pytest.mark.parametrize("name", sorted(bundled.RECORDINGS))
def test_a_real_trace_says_where_when_and_under_which_pool_it_was_recorded(name):
    trace = bundled.load(name)
    meta = trace.metadata
    assert bundled.provenance_problems(meta) == []
    assert meta["device"] == "NVIDIA H100 80GB HBM3" and meta["date"].startswith("2026-11-25")
    assert meta["command"].startswith("record_traces.py --device 0 ")
    assert (meta["cupy"], meta["chainer"], meta["numpy"], meta["python"], meta["pgmo"]) == (
        "14.2.0", "7.8.1", "2.5.2", "3.12.3", "0.2.0")
    assert meta["pool"] == ("stock" if name.endswith("-stock") else "pgmo")
    assert ("TraceRecorder" in meta["recorded_by"]) == (meta["pool"] == "stock")
    # the numbers recorded beside the blocks are the blocks' own
    assert meta["requests"] == len(trace) and meta["lower_bound"] == trace.lower_bound()


def test_a_name_resolves_to_its_file_unless_a_file_of_that_name_is_there(tmp_path,
                                                                          monkeypatch):
    monkeypatch.chdir(tmp_path)
    name = "h100-alexnet-train-b32"
    assert bundled.resolve(name) == str(bundled.path(name))
    assert bundled.resolve("no-such-trace") == "no-such-trace"  # left to the reader
    (tmp_path / name).write_text("id,lower,upper,size\n0,0,1,512\n")
    assert bundled.resolve(name) == name


def test_the_python_api_takes_bundled_names_as_the_commands_do(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no file of that name here
    import pgmo

    trace = pgmo.read_trace("synthetic-seq2seq-train-b64")
    assert trace.blocks == bundled.load("synthetic-seq2seq-train-b64").blocks
    result = pgmo.analyze("h100-alexnet-train-b32", method="bestfit")
    assert result.lower_bound == 1_013_874_176 and result.format == "pgmo-json"
    assert "bundled" in pgmo.__all__ and "pgmo.bundled.names()" in pgmo.__doc__
    with pytest.raises(pgmo.TraceFormatError, match="no-such-trace: no such file"):
        pgmo.read_trace("no-such-trace")
