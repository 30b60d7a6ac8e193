"""Requests that leave their plan: larger than planned, beyond the planned count, a
block freed late; both paths (inline and slow) make the same hand-out decision.

Tests pgmo.engine.core (departures) and pgmo.engine.handout.
"""

from __future__ import annotations

from pgmo.units import round_size

from .engine_bench import Checked, HOT, hot_path  # noqa: F401 (hot_path: a fixture)


def test_block_kept_past_its_planned_free_sends_the_request_off_the_plan(hot_path):
    c = Checked(hot_path, warmup=0)
    c.iteration([1000, ("f", 0), 1000, ("f", 1)])  # request 1 reuses request 0's bytes
    e = c.engine
    assert e.plan.offsets == (0, 0)
    late = [1000, 1000, ("f", 1), ("f", 0)]  # request 0 now outlives request 1's start
    e.begin_iteration()
    blocks = [c.malloc(1000), c.malloc(1000)]
    assert c.in_plan(blocks[0]) and not c.in_plan(blocks[1])
    assert not blocks[1].in_stock  # memory of its own: nothing cached after it
    st = e.stats()
    assert st.departures == 1 and st.departed_requests == 1 and st.exact_bytes == 1024
    c.live.clear()
    blocks.clear()
    e.end_iteration()
    assert e.stats().reoptimizations == 1  # re-solved with the later free
    c.iteration(late)
    c.iteration([1000, ("f", 0), 1000, ("f", 1)])  # the old pattern still fits
    st = e.stats()
    assert st.departures == 1 and st.reoptimizations == 1
    assert st.planned_requests == 1 + 4


def test_block_from_last_iteration_still_alive_is_never_overwritten(hot_path):
    c = Checked(hot_path, warmup=0)
    c.iteration(HOT)
    e = c.engine
    kept = c.iteration([1000, 2000, ("f", 1), 3000, ("f", 2), 500, ("f", 3)])  # keeps block 0
    loss = kept[0]
    assert loss is not None and c.in_plan(loss)
    for _ in range(4):  # the ledger in Checked.malloc fails on any overlap
        c.iteration(HOT)
    c.free(loss)
    del loss, kept
    c.iteration(HOT)
    assert e.stats().reoptimizations >= 1  # the survivor was pinned by a re-solve


def test_bigger_request_diverges_the_rest_and_is_resolved_at_the_boundary(hot_path):
    c = Checked(hot_path, warmup=0)
    c.iteration(HOT)
    e = c.engine
    peak = e.plan.peak
    bigger = [1000, 9000, ("f", 0), 3000, ("f", 1), 500, ("f", 2), ("f", 3)]
    c.iteration(bigger)
    st = e.stats()
    assert st.departures == 1 and st.reoptimizations == 1
    assert st.departed_requests == 3  # request 1 and the rest of the iteration
    assert e.plan.peak > peak
    assert e.profile.blocks[1].size == round_size(9000)
    before = st.planned_requests
    c.iteration(bigger)
    c.iteration(HOT)  # smaller again: still fits
    st = e.stats()
    assert st.planned_requests == before + 8
    assert st.reoptimizations == 1


def _run_with_every_request_slow(c, hooked):
    """Send every request of ``c`` through the engine's slow path (as memory hooks do)."""
    calls = []

    def serve(size):
        calls.append(size)
        return c.engine.serve_unhooked(size)

    if hooked:
        c.engine.report_to_hooks(lambda: {"hook": object()}, serve)
    return calls


def test_the_inline_and_the_slow_path_make_the_same_hand_out_decision(hot_path):
    """Planned, late-freed, larger, extra and surviving requests: served alike (the same
    addresses, the same counts) whether the inline path or the slow path decides."""
    late = [1000, 2000, 3000, ("f", 0), ("f", 1), 500, ("f", 2), ("f", 3)]
    bigger = [1000, 9000, ("f", 0), 3000, ("f", 1), 500, ("f", 2), ("f", 3)]
    more = HOT + [700, ("f", 4)]
    outcomes = []
    for hooked in (False, True):
        c = Checked(hot_path, warmup=0)
        calls = _run_with_every_request_slow(c, hooked)
        kept, pointers = [], []
        for ops in (HOT, HOT, late, HOT, bigger, more, HOT, HOT + [64], HOT + [64]):
            blocks = c.iteration(ops)
            pointers.append([b.ptr for b in blocks if b is not None])
            kept.append(blocks[-1])
        st = c.engine.stats()
        assert (len(calls) > 0) == hooked  # the hooked engine served every request slowly
        outcomes.append((pointers, st))
    (inline, inline_stats), (slow, slow_stats) = outcomes
    assert inline == slow
    assert inline_stats == slow_stats
    assert inline_stats.departures >= 3 and inline_stats.departed_requests >= 3
    assert inline_stats.pinned_requests >= 1 and inline_stats.planned_requests > 0


def test_a_departure_is_counted_once_on_either_path(hot_path):
    for hooked in (False, True):
        c = Checked(hot_path, warmup=0)
        _run_with_every_request_slow(c, hooked)
        c.iteration(HOT)
        c.iteration([1000, 9000, ("f", 0), 3000, ("f", 1), 500, ("f", 2), ("f", 3)])
        st = c.engine.stats()
        assert (st.departures, st.departed_requests, st.planned_requests) == (1, 3, 1)


def test_more_requests_than_planned_are_recorded_and_planned_next_time(hot_path):
    c = Checked(hot_path, warmup=0)
    c.iteration(HOT)
    e = c.engine
    longer = HOT + [700, 800, ("f", 4), ("f", 5)]
    c.iteration(longer)
    assert e.stats().reoptimizations == 1 and len(e.profile) == 6
    hits = e.stats().planned_requests
    c.iteration(longer)
    assert e.stats().planned_requests == hits + 6
