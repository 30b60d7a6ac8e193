"""One entry point for every packing method: :func:`solve`.

Methods (see :class:`~pgmo.solver.options.SolverOptions`):

``bestfit``
    The paper's heuristic (Sekiyama et al. 2018, Section 3.2), see
    :mod:`pgmo.solver.bestfit`.
``best`` (default)
    Several greedy orderings and tie-breaks plus searches within a time limit
    or a step budget; keeps the lowest peak found.  See :mod:`pgmo.solver.best`.
``exact``
    The paper's MIP / a CP-SAT model for small instances, warm-started from
    ``best``; reports whether optimality was proven.  See
    :mod:`pgmo.solver.exact`.

Each method is a function ``solve(trace, options, deadline, clock) -> Packing``
of its module; ``deadline`` is a time on ``clock`` (None: no limit) that
already leaves time for the validation every plan goes through here.

The time limit holds for the whole call: the clock starts before anything
else, the methods check it in every loop that can run long, and the
validation's time is reserved out of the limit.
"""

from __future__ import annotations

import importlib
from typing import Any

from ..plan import Plan
from ..trace import Trace
from .budget import WALL_CLOCK, Clock
from .options import BACKENDS, METHODS, SolverOptions, solver_options
from .packing import Packing

__all__ = ["solve", "METHODS", "BACKENDS", "SolverOptions", "Packing", "deadline_for"]

#: Seconds the end of a solve (the plan, its validation) takes per block, reserved out of
#: the limit: it grows with the trace (1.3 us measured per block on 28 000 blocks, 3.8 us
#: on 62 000, twice that with the machine's other core busy), so the reserve per block is
#: this plus :data:`_TAIL_SECONDS_PER_PAIR` per block more (2.1 us per block on 10 000
#: blocks, 3.8 on 28 000, 7.2 on 62 000).
_TAIL_SECONDS_PER_BLOCK = 1e-6
_TAIL_SECONDS_PER_PAIR = 1e-10
#: Most of the limit reserved so (half: a 1 s limit on 62 000 blocks).
_TAIL_MAX_SHARE = 0.5


def deadline_for(options: SolverOptions, n_blocks: int, start: float) -> float | None:
    """When a method must stop so that :func:`solve` returns within the time limit."""
    if options.time_limit is None:
        return None
    tail = n_blocks * (_TAIL_SECONDS_PER_BLOCK + _TAIL_SECONDS_PER_PAIR * n_blocks)
    reserve = min(_TAIL_MAX_SHARE * options.time_limit, 0.02 + tail)
    return start + options.time_limit - reserve


def solve(trace: Trace, options: SolverOptions | None = None, *, clock: Clock = WALL_CLOCK,
          **changes: Any) -> Plan:
    """Pack ``trace``; return a validated :class:`~pgmo.plan.Plan`.

    ``options`` (default :class:`SolverOptions`) with keyword ``changes``:
    ``solve(trace, method="bestfit")``.  Open blocks (never freed) are packed
    as live until the end of the trace.  ``clock`` (seconds, monotonic) is
    what the time limit is kept on: the wall clock, or a test's own.
    """
    start = clock()
    options = solver_options(options, **changes)
    trace = trace.closed()
    if len(trace) == 0:
        return Plan(trace, (), method=options.method, optimal=True)
    method = importlib.import_module(f".{options.method}", __name__)
    packing: Packing = method.solve(trace, options, deadline_for(options, len(trace), start),
                                    clock)
    plan = Plan(trace, tuple(packing.offsets), method=options.method,
                seconds=clock() - start, optimal=packing.optimal, info=packing.info)
    return plan.validate()
