"""The synthetic generator and the bundled traces it made."""

from __future__ import annotations

import pytest

import pgmo
from pgmo import bundled, synth
from pgmo.synth import Recorder


def _one_event_per_tick(trace) -> bool:
    ticks = sorted([b.lower for b in trace] + [b.upper for b in trace])
    return ticks == list(range(len(ticks)))


@pytest.mark.parametrize("name", sorted(synth.bundled_specs()))
def test_generated_traces_follow_the_event_clock(name):
    trace = synth.bundled_specs()[name]()
    assert _one_event_per_tick(trace)
    assert [b.id for b in trace] == list(range(len(trace)))  # block i is request i
    assert all(b.size % synth.ROUND == 0 for b in trace)
    assert trace.lower_bound() < trace.total_bytes  # memory is reused over time


@pytest.mark.parametrize("name", sorted(synth.bundled_specs()))
def test_bundled_synthetic_traces_are_labelled_and_reproducible(name):
    shipped = bundled.load(name)
    assert shipped.metadata["synthetic"] is True
    assert "not a measurement" in shipped.metadata["recorded_by"]
    made = synth.bundled_specs()[name]()
    assert shipped.blocks == made.blocks
    assert shipped.metadata == made.metadata  # the generator labels what it makes, too
    assert "not a measurement" in made.metadata["recorded_by"]


def test_every_bundled_trace_says_how_it_was_made():
    assert bundled.names(), "no bundled traces"
    for name in bundled.names():
        meta = bundled.load(name).metadata
        assert bundled.provenance_problems(meta) == [], name
        if meta["synthetic"]:  # a generated trace is the generator's, exactly
            assert name in synth.bundled_specs(), f"{name}: no pgmo.synth generator makes it"
        else:
            assert not name.startswith("synthetic-"), name


#: Metadata as ``scripts/record_traces.py`` writes it on a GPU.
RECORDED = {"model": "resnet50", "kind": "training", "batch_size": 32, "input_size": 224,
            "command": "record_traces.py --device 0 --arch resnet50 --batchsize 32",
            "device": "NVIDIA H100 80GB HBM3", "cupy": "14.2.0", "numpy": "2.5.0",
            "python": "3.12.3", "chainer": "7.8.1", "pgmo": "0.1.0",
            "date": "2025-06-01T12:00:00+00:00", "recorded_by": "pgmo profiling mode",
            "pool": "pgmo", "synthetic": False, "dry_run": False}


#: What a recording must name: the workload, how it was recorded, where, with what, when.
MUST_RECORD = ("model", "batch_size", "kind", "command", "device", "cupy", "numpy", "python",
               "chainer", "pgmo", "date", "pool", "recorded_by")
#: What a generated trace must name: how it was made, and what pgmo.synth needs to redo it.
MUST_SAY_SYNTHETIC = ("recorded_by", "model", "batch_size", "kind")


def test_a_complete_recording_may_be_bundled():
    assert bundled.provenance_problems(RECORDED) == []
    assert set(bundled.RECORDED_FIELDS) == set(MUST_RECORD)
    assert set(bundled.SYNTHETIC_FIELDS) == set(MUST_SAY_SYNTHETIC)


@pytest.mark.parametrize("field", MUST_RECORD)
@pytest.mark.parametrize("blank", [None, "", "  "])
def test_a_recording_without_each_field_is_refused(field, blank):
    meta = dict(RECORDED)
    if blank is None:
        del meta[field]
    else:
        meta[field] = blank
    assert bundled.provenance_problems(meta) == [
        f"a recorded trace must record {field!r}: {bundled.RECORDED_FIELDS[field]}"]


@pytest.mark.parametrize("name", sorted(synth.bundled_specs()))
@pytest.mark.parametrize("field", MUST_SAY_SYNTHETIC)
def test_a_synthetic_trace_without_each_field_is_refused(name, field):
    meta = dict(bundled.load(name).metadata)
    del meta[field]
    assert bundled.provenance_problems(meta) == [
        f"a synthetic trace must record {field!r}: {bundled.SYNTHETIC_FIELDS[field]}"]


@pytest.mark.parametrize("change, problem", [
    ({"synthetic": None}, "'synthetic' must be true (generated) or false (recorded on a GPU), "
                          "got None"),
    ({"synthetic": "no"}, "'synthetic' must be true (generated) or false (recorded on a GPU), "
                          "got 'no'"),
    ({"batch_size": 0}, "'batch_size' must be an integer >= 1, got 0"),
    ({"batch_size": "32"}, "'batch_size' must be an integer >= 1, got '32'"),
    ({"kind": "train"}, "'kind' must be one of training, inference, got 'train'"),
    ({"date": "yesterday"}, "'date' must be ISO 8601 (e.g. 2025-01-31T12:00:00+00:00), "
                            "got 'yesterday'"),
    ({"date": 20250601}, "'date' must be ISO 8601 (e.g. 2025-01-31T12:00:00+00:00), "
                         "got 20250601"),
])
def test_a_recording_with_a_bad_value_is_refused(change, problem):
    assert bundled.provenance_problems({**RECORDED, **change}) == [problem]


def test_a_dry_run_is_no_recording():
    meta = {**RECORDED, "synthetic": True, "dry_run": True, "device": "CPU (x86_64), dry run"}
    assert bundled.provenance_problems(meta) == [
        "a CPU dry run (dry_run: true), not a recording"]
    del meta["cupy"]  # and it is still held to what a recording must say
    assert bundled.provenance_problems(meta)[1:] == [
        "a recorded trace must record 'cupy': CuPy's version"]


def test_provenance_of_something_not_metadata_is_a_type_error():
    with pytest.raises(TypeError, match="trace metadata must be a mapping, got list"):
        bundled.provenance_problems([("synthetic", True)])


def test_unknown_bundled_trace_names_the_choices():
    with pytest.raises(KeyError, match="no bundled trace 'no-such-trace'; choose from "
                                       ".*synthetic-"):
        bundled.load("no-such-trace")
    with pytest.raises(pgmo.UnknownTraceError, match="did you mean 'synthetic-seq2seq-train-b64'"):
        bundled.load("seq2seq")  # the closest, where one is close


def test_recorder_rejects_double_free():
    rec = Recorder()
    h = rec.alloc(10)
    rec.free(h)
    with pytest.raises(ValueError, match="freed twice"):
        rec.free(h)


def test_seq2seq_lengths_vary_with_seed():
    lengths = {(t.metadata["src_len"], t.metadata["tgt_len"])
               for t in (synth.seq2seq_training(8, hidden=16, vocab=32, seed=s) for s in range(6))}
    assert len(lengths) > 1


# -- python -m pgmo.synth_logs (docs/analyze.rst tells users to run it) ----------------
@pytest.mark.parametrize("argv, said", [
    (["--iterations", "-1", "--pytorch", "x.pickle"], "argument --iterations: expects an "
                                                      "integer >= 1, got '-1'"),
    (["--iterations", "0", "--rmm", "r.csv"], "argument --iterations: expects an integer"),
    (["--weights", "-5", "--pytorch", "x.pickle"], "argument --weights: expects a number of "
                                                   "bytes from 0"),
    (["--max-entries", "0", "--pytorch", "x.pickle"], "argument --max-entries: expects an "
                                                      "integer >= 1"),
    (["--frames", "-1", "--pytorch", "x.pickle"], "argument --frames: expects an integer"),
    (["--iterations", "1"], "nothing to write: give --pytorch, --rmm or --rmm-upstream"),
    (["--pytorch", "no-such-folder/x.pickle"], "argument --pytorch: cannot write "
                                               "no-such-folder/x.pickle: no folder"),
    (["--rmm-upstream", "no-such-folder/u.csv"], "argument --rmm-upstream: cannot write"),
])
def test_synth_logs_answers_a_mistake_with_one_line_and_writes_nothing(
        tmp_path, monkeypatch, capsys, argv, said):
    from pgmo.synth_logs import main

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("python -m pgmo.synth_logs: error: ") and said in err[-1]
    assert list(tmp_path.iterdir()) == []  # no file written, no folder made


def test_synth_logs_names_an_unknown_trace_in_one_line(tmp_path, monkeypatch, capsys):
    from pgmo.synth_logs import main

    monkeypatch.chdir(tmp_path)
    assert main(["--trace", "nope", "--pytorch", "x.pickle"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("python -m pgmo.synth_logs: error: no bundled trace 'nope'")
    assert err.count("\n") == 1 and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []
