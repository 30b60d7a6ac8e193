"""One entry point for every packing method: :func:`solve`.

Methods:

``bestfit``
    The paper's heuristic (Sekiyama et al. 2018, Section 3.2), see
    :mod:`pgmo.solver.bestfit`.
``best`` (default)
    Several greedy orderings and tie-breaks plus local repacking within a time
    budget; keeps the lowest peak found.  See :mod:`pgmo.solver.best`.
``exact``
    The paper's MIP / a CP-SAT model for small instances, warm-started from
    ``best``; reports whether optimality was proven.  See
    :mod:`pgmo.solver.exact`.

Every plan leaving :func:`solve` has passed the independent validator.
"""

from __future__ import annotations

import time

from ..plan import Plan
from ..trace import Trace

__all__ = ["solve", "METHODS", "DEFAULT_TIME_LIMIT"]

METHODS = ("bestfit", "best", "exact")
DEFAULT_TIME_LIMIT = 10.0  # seconds, for "best" and "exact"


def solve(trace: Trace, method: str = "best", time_limit: float | None = None,
          progress: bool = False, backend: str = "auto") -> Plan:
    """Pack ``trace``; return a validated :class:`~pgmo.plan.Plan`.

    ``time_limit`` bounds ``best`` and ``exact`` (default 10 s); ``bestfit``
    ignores it.  ``progress`` shows a tqdm bar on long solves.  ``backend``
    picks the exact solver: ``auto``, ``cpsat`` or ``highs``.
    """
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
    if len(trace) == 0:
        return Plan(trace, (), method=method, optimal=True)
    limit = DEFAULT_TIME_LIMIT if time_limit is None else float(time_limit)
    start = time.perf_counter()
    optimal = None
    info: dict = {}
    if method == "bestfit":
        from .bestfit import bestfit_offsets

        offsets = bestfit_offsets(*trace.columns())
    elif method == "best":
        from .best import best_offsets

        offsets, info = best_offsets(trace, time_limit=limit, progress=progress)
    else:
        from .exact import exact_offsets

        offsets, optimal, info = exact_offsets(trace, time_limit=limit, progress=progress,
                                               backend=backend)
    plan = Plan(trace, tuple(offsets), method=method, seconds=time.perf_counter() - start,
                optimal=optimal, info=info)
    return plan.validate()
