"""Hypothesis strategies for DSA instances, shared by the solver and pool tests."""

from __future__ import annotations

from hypothesis import strategies as st

from pgmo import Trace


@st.composite
def traces(draw, max_blocks: int = 30, max_tick: int = 40, max_size: int = 64,
           min_blocks: int = 1) -> Trace:
    """Random traces: half-open lifetimes inside [0, max_tick), sizes in [1, max_size]."""
    n = draw(st.integers(min_blocks, max_blocks))
    rows = []
    for i in range(n):
        lower = draw(st.integers(0, max_tick - 1))
        upper = draw(st.integers(lower + 1, max_tick))
        size = draw(st.integers(1, max_size))
        rows.append((i, lower, upper, size))
    return Trace.from_tuples(rows, {"generator": "hypothesis"})


@st.composite
def event_traces(draw, max_blocks: int = 30, max_size: int = 4096) -> Trace:
    """Traces as pgmo records them: one tick per alloc and per free, block i = request i."""
    n = draw(st.integers(1, max_blocks))
    sizes = draw(st.lists(st.integers(1, max_size), min_size=n, max_size=n))
    # An interleaving of allocs and frees: free j may happen only after alloc j.
    order = []
    pending: list[int] = []
    nxt = 0
    while nxt < n or pending:
        if nxt < n and (not pending or draw(st.booleans())):
            order.append(("a", nxt))
            pending.append(nxt)
            nxt += 1
        else:
            j = pending.pop(draw(st.integers(0, len(pending) - 1)))
            order.append(("f", j))
    lower = {}
    upper = {}
    for tick, (kind, j) in enumerate(order):
        (lower if kind == "a" else upper)[j] = tick
    rows = [(i, lower[i], upper[i], sizes[i]) for i in range(n)]
    return Trace.from_tuples(rows, {"generator": "hypothesis-events"})
