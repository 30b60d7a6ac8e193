"""Hypothesis strategies for DSA instances, shared by the solver and pool tests.

The solver's strategies keep sizes small (exact solvers enumerate them); the
pool's draw what a pool meets (:func:`request_sizes`): size 0, sizes within
one 512-byte unit, at its boundaries, across many units and now and then
hundreds of MiB, with open blocks (never freed) among them.
"""

from __future__ import annotations

from hypothesis import strategies as st

from pgmo import Trace

MIB = 1 << 20
UNIT = 512  # the pools' rounding


def request_sizes(max_size: int = 256 * MIB, zero: bool = True) -> st.SearchStrategy[int]:
    """Sizes of pool requests: 0 (a null pointer, not a request), within one unit, a byte
    either side of a unit boundary, across many units, and (one draw in eight) up to
    ``max_size``.  Host memory is real: callers bound the bytes live at once."""
    boundary = st.integers(1, 64).flatmap(
        lambda k: st.sampled_from([UNIT * k - 1, UNIT * k, UNIT * k + 1]))
    many = st.integers(UNIT + 1, MIB)
    return st.one_of(st.integers(1, UNIT), boundary, boundary, many, many, many,
                     st.integers(MIB, max_size), *([st.just(0)] if zero else []))


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
def event_traces(draw, max_blocks: int = 30, max_size: int = 4096,
                 sizes: st.SearchStrategy[int] | None = None, max_total: int | None = None,
                 open_blocks: bool = False) -> Trace:
    """Traces as pgmo records them: one tick per alloc and per free, block i = request i.

    Sizes come from ``sizes`` (0 counts as 1) or are in [1, max_size]; a
    size that would take the trace's bytes past ``max_total`` is cut down to
    what is left (at least 1).  With ``open_blocks`` some blocks are never
    freed (``upper`` None), as a model's weights and gradients.
    """
    n = draw(st.integers(1, max_blocks))
    drawn = draw(st.lists(sizes if sizes is not None else st.integers(1, max_size),
                          min_size=n, max_size=n))
    total, cut = 0, []
    for size in drawn:
        size = max(1, size if max_total is None else min(size, max_total - total))
        cut.append(size)
        total += size
    is_open = draw(st.lists(st.booleans() if open_blocks else st.just(False),
                            min_size=n, max_size=n))
    # An interleaving of allocs and frees: free j may happen only after alloc j.
    order = []
    pending: list[int] = []
    nxt = 0
    while nxt < n or pending:
        if nxt < n and (not pending or draw(st.booleans())):
            order.append(("a", nxt))
            if not is_open[nxt]:
                pending.append(nxt)
            nxt += 1
        else:
            j = pending.pop(draw(st.integers(0, len(pending) - 1)))
            order.append(("f", j))
    lower = {}
    upper = dict.fromkeys(range(n))
    for tick, (kind, j) in enumerate(order):
        (lower if kind == "a" else upper)[j] = tick
    rows = [(i, lower[i], upper[i], cut[i]) for i in range(n)]
    return Trace.from_tuples(rows, {"generator": "hypothesis-events"})


@st.composite
def workloads(draw, max_variants: int = 3, max_iterations: int = 10, max_ops: int = 24,
              sizes: st.SearchStrategy[int] | None = None):
    """Non-hot pool workloads: a base iteration and mutated variants in a drawn order.

    An iteration is ``(ops, hold)``: ops are ``("a", size)`` allocate,
    ``("f", k)`` free live block ``k % live`` (blocks held from earlier
    iterations included), ``("k", size)`` allocate a block never freed (until
    the workload ends), ``("i", 0)`` toggle interrupt, ``("s", 0)`` let a
    background planner finish its work (see ``tests/held_planner.py``); with
    ``hold`` the blocks still live at the end are kept into the next
    iteration.  The base runs twice first so the pool profiles and
    optimizes; the variants (a size changed, an op inserted, deleted or
    moved: other sizes, order and count, held references, interrupts) then
    make it depart from its plan.  Sizes come from ``sizes``
    (:func:`request_sizes` by default).
    """
    size = sizes if sizes is not None else request_sizes()
    alloc = st.tuples(st.just("a"), size)
    free = st.tuples(st.just("f"), st.integers(0, 10_000))
    op = st.one_of(alloc, alloc, alloc, free, free, st.tuples(st.just("k"), size),
                   st.tuples(st.just("i"), st.just(0)), st.tuples(st.just("s"), st.just(0)))
    hold = st.sampled_from([False, False, False, True])
    base = draw(st.lists(op, max_size=max_ops - 1))
    # At least one request to plan for (an empty base iteration is still met: a
    # variant may delete it).
    base.insert(draw(st.integers(0, len(base))),
                ("a", draw(size.filter(bool))))
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
    order = [0, 0] + draw(st.lists(st.integers(0, len(variants) - 1), min_size=1,
                                   max_size=max_iterations - 2))
    return [variants[k] for k in order]
