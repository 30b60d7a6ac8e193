"""Blocks and traces: half-open lifetimes, the max-load lower bound, construction."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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


@st.composite
def logs(draw):
    """A pool's log: allocs in order on the event clock, some blocks never freed."""
    n = draw(st.integers(0, 12))
    lowers = sorted(draw(st.lists(st.integers(0, 40), min_size=n, max_size=n, unique=True)))
    uppers = [draw(st.one_of(st.none(), st.integers(lo + 1, 50))) for lo in lowers]
    sizes = draw(st.lists(st.integers(1, 64), min_size=n, max_size=n))
    return lowers, uppers, sizes


@settings(max_examples=120, deadline=None)
@given(log=logs(), extra=st.booleans())
def test_a_trace_from_columns_answers_as_one_made_of_blocks(log, extra):
    """The pool's profiles keep their columns and make no blocks until asked: every
    answer (open blocks, closing, the arena's share, bounds, equality) is the same."""
    lazy = Trace.from_columns(*log, {"m": 1})
    made = Trace(tuple(Block(i, lo, up, sz) for i, (lo, up, sz) in enumerate(zip(*log))),
                 {"m": 1})
    if extra:
        assert lazy.blocks == made.blocks  # made now: the answers stay the same
    assert lazy == made and made == lazy and len(lazy) == len(made)
    assert lazy.open_ids == made.open_ids and lazy.horizon == made.horizon
    assert lazy.total_bytes == made.total_bytes and lazy.lower_bound() == made.lower_bound()
    assert lazy.columns() == made.columns() and lazy.log_columns() == made.log_columns()
    assert [lazy.size_of(i) for i in range(len(lazy))] == [b.size for b in made]
    arena, arena_made = lazy.without_open(), made.without_open()
    assert arena.blocks == arena_made.blocks and arena.metadata == arena_made.metadata
    assert arena == arena_made and arena.columns() == arena_made.columns()
    assert lazy.closed() == made.closed()
    assert lazy.with_metadata(x=2) == made.with_metadata(x=2) != made
    other = Trace.from_columns(log[0], log[1], [s + 1 for s in log[2]], {"m": 1})
    assert (other == lazy) == (len(lazy) == 0)


def test_a_profile_of_many_requests_makes_no_object_per_request():
    """A burst of objects at an iteration's end can set off a full collection in the
    training thread: the profile keeps its requests as columns."""
    import gc

    n = 20_000
    lowers = list(range(0, 2 * n, 2))
    columns = (lowers, [lo + 3 for lo in lowers], [512] * n)
    collections = []

    def count(phase, info):
        collections.append(phase)

    def profile_of(columns):
        profile = Trace.from_columns(*columns, {"recorded_by": "pgmo"})
        return (profile, profile.without_open(), profile.open_ids, profile.size_of(7),
                profile.lower_bound())

    gc.callbacks.append(count)
    try:
        profile, arena, open_ids, size, bound = profile_of(columns)
        quiet = len(collections)
        blocks = profile.blocks  # made when asked: here, a burst of them
    finally:
        gc.callbacks.remove(count)
    assert arena is profile and open_ids == () and size == 512 and len(profile) == n
    assert bound == 2 * 512  # [2i, 2i + 3): two blocks live at a tick
    assert blocks[7] == Block(7, 14, 17, 512)
    assert quiet <= 2 < len(collections), (quiet, len(collections))  # the test can tell


def test_repr_shows_size_and_lower_bound():
    assert repr(Trace.from_tuples([(0, 2, 4), (1, 3, 4)])) == "Trace(n=2, lower_bound=8)"
    assert pgmo.Trace is Trace


@settings(max_examples=80, deadline=None)
@given(trace=traces(min_blocks=256, max_blocks=400, max_tick=600, max_size=1 << 40))
def test_the_max_load_of_a_long_trace_is_the_same_by_numpy(trace):
    """Long traces are measured in NumPy's arrays: the same answer as the events sorted
    one by one (frees at a tick before allocs), sizes up to the size rule's."""
    from pgmo.trace import _MAX_LOAD_WITH_NUMPY, _max_load_numpy

    lowers, uppers, sizes = trace.columns()
    assert len(sizes) >= _MAX_LOAD_WITH_NUMPY
    events = sorted([(u, -s) for u, s in zip(uppers, sizes)] +
                    [(lo, s) for lo, s in zip(lowers, sizes)])
    live = best = 0
    for _, delta in events:
        live += delta
        best = max(best, live)
    assert max_load(lowers, uppers, sizes) == _max_load_numpy(lowers, uppers, sizes) == best
