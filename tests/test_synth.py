"""The synthetic generator and the bundled traces it made."""

from __future__ import annotations

import pytest

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
    assert shipped.blocks == synth.bundled_specs()[name]().blocks


def test_every_bundled_trace_says_how_it_was_made():
    assert bundled.names(), "no bundled traces"
    for name in bundled.names():
        meta = bundled.load(name).metadata
        assert meta.get("synthetic") is True or meta.get("device"), name


def test_unknown_bundled_trace_names_the_choices():
    with pytest.raises(KeyError, match="available: .*synthetic-"):
        bundled.load("no-such-trace")


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
