"""Blocks and traces: half-open lifetimes, the max-load lower bound, construction."""

from __future__ import annotations

import pytest
from hypothesis import given, settings

import pgmo
from pgmo import Block, Trace, TraceFormatError
from pgmo.trace import max_load

from .strategies import event_traces, traces


def load_per_tick(trace: Trace) -> int:
    """Brute force: the bytes live at every integer tick, maximised."""
    return max(sum(b.size for b in trace if b.lower <= t < b.upper)
               for t in range(trace.horizon))


@settings(max_examples=150, deadline=None)
@given(trace=traces(max_blocks=25, max_tick=30))
def test_lower_bound_is_the_max_bytes_live_at_one_tick(trace):
    assert trace.lower_bound() == load_per_tick(trace)


@settings(max_examples=60, deadline=None)
@given(trace=event_traces(max_blocks=20))
def test_lower_bound_on_recorded_style_traces(trace):
    assert trace.lower_bound() == load_per_tick(trace)
    assert max_load(*trace.columns()) == trace.lower_bound()


def test_block_freed_at_t_and_block_allocated_at_t_are_not_live_together():
    freed, allocated = Block(0, 0, 4, 10), Block(1, 4, 8, 20)
    assert not freed.overlaps_in_time(allocated)
    assert not allocated.overlaps_in_time(freed)
    assert Trace((freed, allocated)).lower_bound() == 20
    longer = Block(2, 3, 5, 1)
    assert longer.overlaps_in_time(freed) and longer.overlaps_in_time(allocated)


def test_lifetime_and_sequence_protocol():
    trace = Trace.from_tuples([(0, 2, 4), (1, 5, 8), (5, 6, 2)])
    assert len(trace) == 3
    assert [b.id for b in trace] == [0, 1, 2]  # 3-tuples get their row index as id
    assert trace[1] == Block(1, 1, 5, 8) and trace[1].lifetime == 4
    assert trace.columns() == ([0, 1, 5], [2, 5, 6], [4, 8, 2])
    assert trace.horizon == 6 and trace.total_bytes == 14
    assert trace.lower_bound() == 12


def test_from_tuples_keeps_given_ids_and_metadata():
    trace = Trace.from_tuples([("conv1", 0, 2, 4), (7, 1, 3, 8)], {"model": "toy"})
    assert [b.id for b in trace] == ["conv1", 7]
    assert trace.metadata == {"model": "toy"}
    tagged = trace.with_metadata(batch=32)
    assert tagged.metadata == {"model": "toy", "batch": 32}
    assert trace.metadata == {"model": "toy"}  # the original is unchanged
    assert tagged.blocks == trace.blocks


@pytest.mark.parametrize("rows, field, reason", [
    ([(0, 2, 0)], "size", "size must be > 0"),
    ([(3, 3, 4)], "upper", "upper must be > lower"),
    ([(0, "2", 4), (0, "two", 4)], "upper", "expected an integer"),
    ([(-1, 2, 4)], "lower", "lower must be >= 0"),
    ([(5, 0, 2, 4), (5, 1, 3, 4)], "id", "duplicate id 5"),
])
def test_from_tuples_validates_like_the_readers(rows, field, reason):
    with pytest.raises(TraceFormatError, match=reason) as err:
        Trace.from_tuples(rows)
    assert err.value.field == field
    assert str(err.value).startswith("<trace>")


def test_from_tuples_rejects_rows_of_the_wrong_length():
    with pytest.raises(TraceFormatError, match=r"row 1: expected \(lower, upper, size\)"):
        Trace.from_tuples([(0, 1, 2), (0, 1)])


def test_empty_trace_needs_no_memory():
    trace = Trace(())
    assert len(trace) == 0 and trace.lower_bound() == 0 and trace.horizon == 0


def test_trace_is_immutable_and_compares_by_content():
    a = Trace.from_tuples([(0, 2, 4)], {"m": 1})
    b = Trace.from_tuples([(0, 2, 4)], {"m": 1})
    assert a == b
    with pytest.raises(AttributeError):
        a.blocks = ()
    assert isinstance(Trace([Block(0, 0, 1, 1)]).blocks, tuple)


def test_repr_shows_size_and_lower_bound():
    assert repr(Trace.from_tuples([(0, 2, 4), (1, 3, 4)])) == "Trace(n=2, lower_bound=8)"
    assert pgmo.Trace is Trace
