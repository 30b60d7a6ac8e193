"""The independent validator: finds every collision, names both blocks, allows touching."""

from __future__ import annotations

import itertools
import re

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from pgmo import Block, PlanError, Trace
from pgmo.validate import check_offsets, find_conflict

from .strategies import event_traces, traces


def stack_on_neighbours(trace: Trace) -> list[int]:
    """A valid packing built without the solver: each block on top of its live predecessors."""
    offsets: list[int] = []
    for i, b in enumerate(trace.blocks):
        offsets.append(max((offsets[j] + trace[j].size for j in range(i)
                            if b.overlaps_in_time(trace[j])), default=0))
    return offsets


def collides_pairwise(trace: Trace, offsets) -> bool:
    """Brute force over all pairs: live together and sharing an address."""
    return any(a.overlaps_in_time(b) and oa < ob + b.size and ob < oa + a.size
               for (a, oa), (b, ob) in itertools.combinations(zip(trace, offsets), 2))


@settings(max_examples=80, deadline=None)
@given(trace=st.one_of(traces(), event_traces()))
def test_valid_packing_is_accepted(trace):
    offsets = stack_on_neighbours(trace)
    assert find_conflict(trace.blocks, offsets) is None
    check_offsets(trace.blocks, offsets)  # does not raise


@settings(max_examples=100, deadline=None)
@given(trace=st.one_of(traces(min_blocks=2), event_traces()), data=st.data())
def test_moving_a_block_onto_a_live_neighbour_is_caught_naming_both(trace, data):
    pairs = [(i, j) for i, j in itertools.permutations(range(len(trace)), 2)
             if trace[i].overlaps_in_time(trace[j])]
    assume(pairs)
    i, j = data.draw(st.sampled_from(pairs))
    offsets = stack_on_neighbours(trace)
    # Anywhere that shares at least one byte with block j.
    offsets[i] = data.draw(st.integers(max(0, offsets[j] - trace[i].size + 1),
                                       offsets[j] + trace[j].size - 1))
    why = find_conflict(trace.blocks, offsets)
    assert why is not None
    named = [index_of[name] for name in re.findall(r"block id=(\S+) \(", why)
             for index_of in [{str(b.id): k for k, b in enumerate(trace)}]]
    # Two blocks that really collide; the first one found may be a third block
    # sharing addresses with i rather than j, but block i is always one of them.
    assert len(named) == 2 and i in named
    a, b = named
    assert collides_pairwise(Trace((trace[a], trace[b])), [offsets[a], offsets[b]])
    with pytest.raises(PlanError, match="invalid packing: block id=") as err:
        check_offsets(trace.blocks, offsets)
    assert why in str(err.value)


@settings(max_examples=150, deadline=None)
@given(trace=traces(max_blocks=10, max_tick=10, max_size=8), data=st.data())
def test_agrees_with_a_pairwise_check_on_arbitrary_offsets(trace, data):
    offsets = data.draw(st.lists(st.integers(0, 20), min_size=len(trace), max_size=len(trace)))
    assert (find_conflict(trace.blocks, offsets) is not None) == collides_pairwise(trace, offsets)


def test_collision_message_names_both_blocks_and_their_extents():
    blocks = (Block("a", 0, 4, 8), Block("b", 2, 6, 8))
    why = find_conflict(blocks, [0, 4])
    assert why == ("block id=a (lifetime [0, 4), addresses [0, 8)) overlaps "
                   "block id=b (lifetime [2, 6), addresses [4, 12))")


def test_touching_lifetimes_may_share_addresses():
    # Freed at tick 4, allocated at tick 4: half-open lifetimes never meet.
    blocks = (Block(0, 0, 4, 8), Block(1, 4, 8, 8), Block(2, 8, 9, 16))
    assert find_conflict(blocks, [0, 0, 0]) is None


def test_touching_addresses_are_fine_one_byte_more_is_not():
    blocks = (Block(0, 0, 4, 8), Block(1, 1, 3, 8))
    assert find_conflict(blocks, [0, 8]) is None
    assert find_conflict(blocks, [0, 7]) is not None
    assert find_conflict(blocks, [8, 0]) is None
    assert find_conflict(blocks, [7, 0]) is not None


def test_same_offset_same_time_is_a_collision():
    blocks = (Block(0, 0, 4, 8), Block(1, 0, 4, 8))
    assert "overlaps" in find_conflict(blocks, [16, 16])


def test_block_inside_another_is_a_collision():
    blocks = (Block("big", 0, 10, 100), Block("small", 3, 4, 1))
    assert find_conflict(blocks, [0, 50]) is not None


@pytest.mark.parametrize("offsets, reason", [
    ([0, -8], "invalid offset -8"),
    ([0, 1.5], "invalid offset 1.5"),
    ([0, "8"], "invalid offset '8'"),
    ([0, True], "invalid offset True"),
    ([0], "1 offsets for 2 blocks"),
    ([0, 8, 16], "3 offsets for 2 blocks"),
])
def test_bad_offsets_are_named(offsets, reason):
    blocks = (Block(0, 0, 4, 8), Block("x", 10, 12, 8))
    why = find_conflict(blocks, offsets)
    assert why is not None and reason in why
    if len(offsets) == 2:
        assert "block id=x" in why
    with pytest.raises(PlanError):
        check_offsets(blocks, offsets)
