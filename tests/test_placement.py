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


class _CtrlCAfterChange(dict):
    """A Placer's index of gap ends that raises a Ctrl-C after its ``at``-th change (a
    signal is acted on as a call returns, or between two statements)."""

    def __init__(self, ends, at):
        super().__init__(ends)
        self.at = at

    def _changed(self):
        self.at -= 1
        if self.at == 0:
            raise KeyboardInterrupt

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        self._changed()

    def __delitem__(self, key):
        super().__delitem__(key)
        self._changed()

    def pop(self, *args):
        value = super().pop(*args)
        self._changed()
        return value


@pytest.mark.parametrize("change", ["release", "release between", "place", "place snug",
                                    "take inside"])
@pytest.mark.parametrize("at", [1, 2, 3])
def test_a_ctrl_c_inside_a_placer_update_gives_nothing_twice_and_loses_at_most_its_block(
        change, at):
    """The page heap's and the arenas' free space, interrupted after any change of a gap's
    ends (the gap after a freed range, the one before, the rest of a gap a block is cut
    from): the free space listed is free, and what is lost is at most the range being
    placed or freed; every later request gets a free range or -1, never one given twice."""
    live = [(10, 20), (30, 40), (60, 64)]
    placer = Placer(100, live, snug=change == "place snug")
    block = {"release": (10, 20), "release between": (30, 40), "place": (0, 4),
             "place snug": (6, 10), "take inside": (44, 50)}[change]
    placer._ends = _CtrlCAfterChange(placer._ends, at)
    try:
        if change.startswith("release"):
            placer.release(*block)
        elif change.startswith("place"):
            assert placer.place(4) == block[0]
        else:
            placer.take(40, 44, 6)
    except KeyboardInterrupt:
        pass
    placer._ends = dict(placer._ends)
    freed = [] if change.startswith("release") else [block]
    held = [span for span in live if span != block or not change.startswith("release")]
    free = set(range(100)) - {b for lo, hi in held + freed for b in range(lo, hi)}
    listed = {b for lo, hi in placer.free_spans() for b in range(lo, hi)}
    lost = free - listed
    # the range being placed or freed may be listed free (a request cut short hands
    # nothing out) or lost; every other byte is listed exactly when it is free
    assert listed - free <= set(range(*block)) and lost <= set(range(*block))
    taken = []
    for nbytes in (10, 10, 10, 20, 4, 2):
        lo = placer.place(nbytes)
        if lo >= 0:
            span = set(range(lo, lo + nbytes))
            assert span <= listed and not any(span & set(range(*t)) for t in taken)
            taken.append((lo, lo + nbytes))
    assert taken


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


def test_a_ctrl_c_as_the_range_grows_never_lists_the_new_span_free_twice():
    """A placer that grows its range, cut short as the new span's release returns: the span
    is listed free once, inside the range's size (a block placed there is never freed again
    by the next growth)."""
    size = [100]

    def grow(extra):
        size[0] += max(extra, 50)
        return size[0]

    class CtrlC(Exception):
        pass

    placer = Placer(100, [(0, 100)], grow=grow)
    release = placer.release

    def cut_short(lo, hi):  # a Ctrl-C as the release returns
        release(lo, hi)
        raise CtrlC

    placer.release = cut_short
    with pytest.raises(CtrlC):
        placer.place(30)
    placer.release = release
    taken = []
    for nbytes in (30, 200, 10):
        lo = placer.place(nbytes)
        assert all(lo + nbytes <= a or b <= lo for a, b in [(0, 100)] + taken)
        taken.append((lo, lo + nbytes))


def test_empty_spans_change_nothing():
    placer = Placer(100, [(10, 20)])
    before = placer.free_spans()
    placer.release(40, 40)
    placer.take(20, 20, 0)
    assert placer.free_spans() == before and placer.place(80) == 20
