"""Placing off-plan requests in the arena's gaps: best fit, merging, never over a live block."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pgmo.placement import Placer


def test_the_smallest_gap_that_holds_a_request_is_taken_at_its_start():
    # live: [100, 200) and [300, 350) in an arena of 1000: gaps of 100, 100 and 650
    placer = Placer(1000, [(300, 350), (100, 200)])
    assert placer.free_bytes() == 850
    assert placer.place(80) in (0, 200)  # a 100-byte gap, not the 650-byte one
    assert placer.place(100) in (0, 200)
    assert placer.place(600) == 350
    assert placer.place(60) == -1 and placer.overflowed == 1 and placer.placed == 3


def test_a_freed_range_merges_with_the_free_ranges_beside_it():
    placer = Placer(1000, [])
    a, b, c = placer.place(300), placer.place(300), placer.place(300)
    assert (a, b, c) == (0, 300, 600)
    placer.release(0, 300)
    placer.release(600, 900)
    assert placer.place(400) == 600  # 600..1000 merged with the tail
    placer.release(300, 600)
    assert placer.place(600) == 0  # 0..300 and 300..600 are one gap again


def test_live_blocks_given_overlapping_are_treated_as_one():
    placer = Placer(100, [(10, 40), (30, 60)])
    assert placer.free_bytes() == 50
    assert placer.place(41) == -1 and placer.place(40) == 60


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 64)), max_size=60),
       st.lists(st.tuples(st.integers(0, 255), st.integers(1, 32)), max_size=5))
def test_placed_blocks_never_overlap_each_other_or_the_live_ones(ops, live):
    size = 256
    fixed = [(lo, min(size, lo + n)) for lo, n in live]
    placer = Placer(size, fixed)
    taken: list[tuple[int, int]] = []
    for allocate, n in ops:
        if allocate or not taken:
            lo = placer.place(n)
            if lo < 0:
                continue
            span = (lo, lo + n)
            assert span[1] <= size
            for other in taken + fixed:
                assert span[1] <= other[0] or other[1] <= span[0], (span, other)
            taken.append(span)
        else:
            placer.release(*taken.pop(n % len(taken)))
    covered = set()
    for lo, hi in fixed + taken:
        covered.update(range(lo, hi))
    assert placer.free_bytes() == size - len(covered)


class _CtrlCAsPopReturns(dict):
    """A Placer's index of gap ends whose ``pop`` is followed by a Ctrl-C (a signal is
    delivered as a call returns)."""

    def pop(self, *args):
        super().pop(*args)
        raise KeyboardInterrupt


def test_a_ctrl_c_inside_a_placer_update_leaves_it_usable():
    """The page heap's and the arenas' free space, interrupted as a freed range merges with
    the gap after it (the three indexes used to stay split: the page heap's requests then
    raised KeyError): every later request gets a free range or -1, never a range given
    twice."""
    placer = Placer(100, [(10, 20), (30, 40)])
    placer._ends = _CtrlCAsPopReturns(placer._ends)
    with pytest.raises(KeyboardInterrupt):
        placer.release(10, 20)  # [10, 20) free again, with the gap [20, 30) after it
    placer._ends = dict(placer._ends)
    taken = []
    for nbytes in (10, 10, 10, 60, 10):
        lo = placer.place(nbytes)
        if lo >= 0:
            assert all(lo + nbytes <= a or b <= lo for a, b in taken)
            assert all(lo + nbytes <= a or b <= lo for a, b in [(10, 20), (30, 40)]) or \
                (lo, lo + nbytes) == (10, 20)
            taken.append((lo, lo + nbytes))
    assert taken  # the free space not being changed is still placed in


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(1, 64), min_size=1, max_size=40), data=st.data())
def test_releasing_many_spans_at_once_leaves_the_gaps_that_one_at_a_time_does(sizes, data):
    """A heap applies an iteration's frees at its boundary in one call: the free space after
    it is exactly what releasing them one by one gives, and every span is placeable again."""
    one, many = Placer(4096, []), Placer(4096, [])
    spans = []
    for size in sizes:
        lo = one.place(size)
        assert many.place(size) == lo
        if lo >= 0:
            spans.append((lo, lo + size))
    freed = data.draw(st.lists(st.sampled_from(spans), unique=True)) if spans else []
    for lo, hi in freed:
        one.release(lo, hi)
    many.release_many(list(reversed(freed)))  # any order
    assert sorted(many.free_spans()) == sorted(one.free_spans())
    assert many.free_bytes() == one.free_bytes()
    for lo, hi in freed:
        assert many.place(hi - lo) >= 0
