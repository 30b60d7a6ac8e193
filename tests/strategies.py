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


@st.composite
def workloads(draw, max_variants: int = 3, max_iterations: int = 10, max_ops: int = 24,
              max_size: int = 20000):
    """Non-hot pool workloads: a base iteration and mutated variants in a drawn order.

    An iteration is ``(ops, hold)``: ops are ``("a", size)`` allocate,
    ``("f", k)`` free live block ``k % live`` (blocks held from earlier
    iterations included), ``("i", 0)`` toggle interrupt; with ``hold`` the
    blocks still live at the end are kept into the next iteration.  The base
    runs twice first so the pool profiles and optimizes; the variants (a size
    changed, an op inserted, deleted or moved: other sizes, order and count, held
    references, interrupts) then make it depart from its plan.
    """
    size = st.one_of(st.sampled_from([100, 1000, 1500, 4096, 9000, max_size]),
                     st.integers(1, max_size))
    op = st.one_of(
        st.tuples(st.just("a"), size),
        st.tuples(st.just("a"), size),
        st.tuples(st.just("f"), st.integers(0, 10_000)),
        st.tuples(st.just("f"), st.integers(0, 10_000)),
        st.tuples(st.just("i"), st.just(0)),
    )
    hold = st.sampled_from([False, False, False, True])
    base = draw(st.lists(op, min_size=1, max_size=max_ops))
    variants = [(base, draw(hold))]
    for _ in range(draw(st.integers(0, max_variants))):
        ops = list(base)
        for _ in range(draw(st.integers(1, 3))):
            pos = draw(st.integers(0, len(ops)))
            how = draw(st.sampled_from(["replace", "insert", "delete", "swap"]))
            if how == "insert" or not ops:
                ops.insert(pos, draw(op))
            elif how == "delete":
                del ops[pos % len(ops)]
            elif how == "swap":
                j = pos % len(ops)
                k = min(j + 1, len(ops) - 1)
                ops[j], ops[k] = ops[k], ops[j]
            else:
                ops[pos % len(ops)] = draw(op)
        variants.append((ops, draw(hold)))
    order = [0, 0] + draw(st.lists(st.integers(0, len(variants) - 1),
                                   max_size=max_iterations - 2))
    return [variants[k] for k in order]
