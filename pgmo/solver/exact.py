"""Exact packing for small traces: the paper's MIP (HiGHS) or a CP-SAT model.

Both models minimise the peak ``u`` over offsets ``x_i >= 0`` with
``x_i + s_i <= u``; they differ in how two blocks live at the same time are
kept apart:

``highs``
    The MIP of Sekiyama et al. (2018), eqs. 1-6, solved by HiGHS through
    :func:`scipy.optimize.milp`.  One binary ``z_ij`` per pair of blocks that
    overlap in time and a big-M disjunction::

        x_i + s_i <= x_j + M z_ij        (i below j when z_ij = 0)
        x_j + s_j <= x_i + M (1 - z_ij)  (j below i when z_ij = 1)

    with ``M`` = the heuristic's peak.  ``milp`` takes no starting solution,
    so the warm start enters as a bound instead: the model asks for a peak
    *strictly below* it, and "infeasible" proves the warm start optimal.
``cpsat``
    OR-Tools CP-SAT: every block is a rectangle whose time side is fixed and
    whose address side is a variable interval; ``AddNoOverlap2D`` keeps
    rectangles disjoint.  The warm start is given as a hint and as the upper
    bound of ``u``.

``auto`` picks CP-SAT when OR-Tools imports, else HiGHS.  In both models the
lower bound of ``u`` is the trace's max load, and one pair of overlapping
blocks has its order fixed (mirroring all addresses maps any packing to one
with the opposite order), which halves the search.

The warm start is the best of :mod:`.best`, :mod:`.bestfit` and first-fit
by size (:func:`.greedy.gap_fit_offsets`); each is validated before use, so a missing or
broken heuristic only costs quality, never correctness.  The result is never
worse than the warm start, and ``optimal`` is True only when the solver proved
it or the peak equals the max load.

Size limits (:data:`MAX_BLOCKS`, :data:`MAX_PAIRS`): exact search is hopeless
far beyond a few hundred blocks and the models themselves grow large
(HiGHS needs two rows per overlapping pair), so bigger traces are refused with
a ValueError pointing to ``method="best"``.
"""

from __future__ import annotations

import heapq
import importlib
import logging
import math
import os
import time
from typing import Any, Sequence

from ..trace import Trace, intervals_overlap, packing_peak as _peak
from ..validate import find_conflict
from .budget import WALL_CLOCK, Clock
from .greedy import ORDERS, gap_fit_offsets
from .options import BACKENDS, SolverOptions
from .packing import Packing

__all__ = [
    "solve", "exact_offsets", "ExactSolverUnavailable", "BACKENDS", "MAX_BLOCKS", "MAX_PAIRS",
    "overlapping_pairs", "count_overlapping_pairs", "compact",
]

log = logging.getLogger(__name__)

MAX_BLOCKS = {"cpsat": 5000, "highs": 1000}
MAX_PAIRS = {"cpsat": 2_000_000, "highs": 50_000}
WARM_SHARE = 0.5  # of the time limit, for the heuristic warm start
WARM_SECONDS_MAX = 5.0  # past that the solver gets the rest
WARM_SECONDS_UNLIMITED = 2.0  # warm-start budget when the solve has no time limit
MIN_SOLVE_SECONDS = 0.1  # with less time left, the solver is not started

_INSTALL_HINT = "install them with: pip install 'pgmo[exact]'"


class ExactSolverUnavailable(ImportError):
    """``method="exact"`` was asked for but its optional solver is not installed."""


# -- optional dependencies, imported only when exact is used -----------------
def _import_cp_model():
    try:
        return importlib.import_module("ortools.sat.python.cp_model")
    except ImportError as exc:
        raise ExactSolverUnavailable(
            f"the exact solver's backend 'cpsat' needs OR-Tools, which does not import "
            f"({exc}); {_INSTALL_HINT}") from exc


def _import_milp():
    try:
        optimize = importlib.import_module("scipy.optimize")
        sparse = importlib.import_module("scipy.sparse")
        milp = optimize.milp
    except (ImportError, AttributeError) as exc:
        raise ExactSolverUnavailable(
            f"the exact solver's backend 'highs' needs SciPy 1.9 or newer "
            f"(scipy.optimize.milp), which does not import ({exc}); {_INSTALL_HINT}") from exc
    return milp, optimize.LinearConstraint, optimize.Bounds, sparse


def resolve_backend(backend: str) -> str:
    """Map ``auto`` to an installed backend; raise a clear error when none is."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown exact backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if backend != "auto":
        (_import_cp_model if backend == "cpsat" else _import_milp)()
        return backend
    try:
        _import_cp_model()
        return "cpsat"
    except ExactSolverUnavailable as cp_missing:
        try:
            _import_milp()
            return "highs"
        except ExactSolverUnavailable:
            raise ExactSolverUnavailable(
                f"the exact method needs OR-Tools (CP-SAT) or SciPy 1.9 or newer (HiGHS), "
                f"and neither is installed; {_INSTALL_HINT}") from cp_missing


# -- small helpers ------------------------------------------------------------
def count_overlapping_pairs(lowers: Sequence[int], uppers: Sequence[int]) -> int:
    """How many pairs of blocks are live at the same time, in O(n log n)."""
    live: list[int] = []  # heap of the uppers of blocks allocated so far
    count = 0
    for lo, hi in sorted(zip(lowers, uppers)):
        while live and live[0] <= lo:
            heapq.heappop(live)
        count += len(live)
        heapq.heappush(live, hi)
    return count


def overlapping_pairs(lowers: Sequence[int], uppers: Sequence[int]) -> list[tuple[int, int]]:
    """All ``(i, j)``, ``i < j``, whose half-open lifetimes intersect (one sweep)."""
    order = sorted(range(len(lowers)), key=lambda i: lowers[i])
    live: list[int] = []
    pairs: list[tuple[int, int]] = []
    for j in order:
        live = [i for i in live if uppers[i] > lowers[j]]
        pairs.extend((min(i, j), max(i, j)) for i in live)
        live.append(j)
    return pairs


def compact(lowers: Sequence[int], uppers: Sequence[int], sizes: Sequence[int],
            offsets: Sequence[int]) -> list[int]:
    """Drop every block as low as it goes, keeping the packing's bottom-to-top order.

    Blocks are re-placed in increasing offset order, each right on top of the
    highest time-overlapping block already re-placed.  No block moves up, so
    the packing stays valid and its peak never grows; every offset becomes a
    sum of sizes, hence a multiple of their gcd (which the models divide out).
    The re-placed tops are kept per time section (blocks live at the same
    time share one), so a block costs two NumPy calls over its lifetime, not
    a scan of every block placed: 5 000 blocks take milliseconds, not seconds.
    """
    import numpy as np

    from .canonical_search import sections_of

    first, last, n_sections = sections_of(lowers, uppers)
    height = np.zeros(max(n_sections, 1), dtype=np.int64)
    new = [0] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: (offsets[i], i)):
        f, l = first[i], last[i]
        if l > f:
            new[i] = int(height[f:l].max())
            height[f:l] = new[i] + sizes[i]
    return new


def warm_start(trace: Trace, budget: float, progress: bool = False
               ) -> tuple[list[int], str, dict[str, Any]]:
    """Lowest-peak valid packing among the available heuristics, compacted.

    Returns ``(offsets, name of the heuristic, its info)``.
    """
    lowers, uppers, sizes = trace.columns()
    candidates: list[tuple[int, str, list[int], dict]] = []

    def consider(name, make):
        try:
            offsets, extra = make()
        except ImportError as exc:
            log.debug("warm start %s unavailable: %s", name, exc)
            return
        except Exception as exc:  # a broken heuristic must not break exact
            log.warning("warm start %s failed, ignored: %r", name, exc)
            return
        offsets = [int(o) for o in offsets]
        why = find_conflict(trace.blocks, offsets)
        if why is not None:
            log.warning("warm start %s gave an invalid packing, ignored: %s", name, why)
            return
        offsets = compact(lowers, uppers, sizes, offsets)
        candidates.append((_peak(offsets, sizes), name, offsets, dict(extra or {})))

    def best():
        from .best import best_offsets
        from .budget import Budget

        offsets, info = best_offsets(trace, Budget(None, time.perf_counter() + budget),
                                     progress=progress)
        return offsets, info.as_dict()

    def bestfit():
        from .bestfit import bestfit_offsets
        return bestfit_offsets(lowers, uppers, sizes), {}

    consider("best", best)
    consider("bestfit", bestfit)
    # Always there (numpy only): exact works even when the other heuristics fail.
    consider("first_fit_by_size", lambda: (gap_fit_offsets(
        lowers, uppers, sizes, ORDERS["size-lifetime"](lowers, uppers, sizes), "first"), {}))
    peak, name, offsets, extra = min(candidates, key=lambda c: c[0])
    return offsets, name, extra


def _symmetry_pair(lowers, uppers, sizes) -> tuple[int, int] | None:
    """The blocks whose order we fix: the largest and its largest live neighbour.

    Any overlapping pair would do; large ones make the fixed order prune most.
    """
    n = len(sizes)
    for i in sorted(range(n), key=lambda k: (-sizes[k], k)):
        neighbours = [j for j in range(n)
                      if j != i
                      and intervals_overlap(lowers[i], uppers[i], lowers[j], uppers[j])]
        if neighbours:
            j = max(neighbours, key=lambda k: (sizes[k], -k))
            return (min(i, j), max(i, j))
    return None


def _mirror_if_needed(offsets: list[int], sizes: Sequence[int], pair) -> list[int]:
    """Flip addresses so that ``pair[0]`` sits below ``pair[1]``, as the models demand."""
    if pair is None:
        return offsets
    i, j = pair
    if offsets[i] < offsets[j]:
        return offsets
    peak = _peak(offsets, sizes)
    return [peak - o - s for o, s in zip(offsets, sizes)]


# -- backends -------------------------------------------------------------------
# Both take the trace as columns already divided by the sizes' gcd, the hint
# (a valid packing with pair[0] below pair[1]), its peak ``upper`` and the
# lower bound ``lb``.  They return {"status", "offsets" or None, "bound"}:
# ``bound`` is a proven lower bound on the optimal peak, or None.

def _solve_cpsat(lowers, uppers, sizes, lb: int, hint: list[int], upper: int, pair,
                 deadline: float | None, progress: bool, workers: int,
                 scale: int = 1) -> dict[str, Any]:
    cp_model: Any = _import_cp_model()  # OR-Tools, untyped
    model = cp_model.CpModel()
    xs, time_iv, addr_iv = [], [], []
    for i, (lo, hi, s) in enumerate(zip(lowers, uppers, sizes)):
        x = model.new_int_var(0, upper - s, f"x{i}")
        xs.append(x)
        time_iv.append(model.new_fixed_size_interval_var(lo, hi - lo, f"t{i}"))
        addr_iv.append(model.new_fixed_size_interval_var(x, s, f"a{i}"))
    u = model.new_int_var(lb, upper, "u")
    model.add_no_overlap_2d(time_iv, addr_iv)
    for x, s in zip(xs, sizes):
        model.add(x + s <= u)
    if pair is not None:
        i, j = pair
        model.add(xs[i] + sizes[i] <= xs[j])
    model.minimize(u)
    for x, o in zip(xs, hint):
        model.add_hint(x, o)
    model.add_hint(u, upper)

    solver = cp_model.CpSolver()
    if deadline is not None:
        solver.parameters.max_time_in_seconds = _seconds_left(deadline)
    solver.parameters.num_workers = workers
    bar = _progress_bar(progress, "cpsat", upper * scale, lb * scale)  # in bytes

    class _Report(cp_model.CpSolverSolutionCallback):
        def on_solution_callback(self):
            peak = int(self.objective_value) * scale
            bound = math.ceil(self.best_objective_bound - 1e-6) * scale
            log.debug("cpsat: peak %d, bound %d", peak, bound)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(peak=peak, bound=bound)

    try:
        status = solver.solve(model, _Report())
    finally:
        if bar is not None:
            bar.close()
    if status == cp_model.MODEL_INVALID:
        raise RuntimeError(f"CP-SAT rejected the model: {model.validate()}")
    result = {"status": solver.status_name(status), "offsets": None, "bound": None}
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        result["offsets"] = [int(solver.value(x)) for x in xs]
        # u is integral, so a fractional bound rounds up.
        result["bound"] = math.ceil(solver.best_objective_bound - 1e-6)
    elif status == cp_model.INFEASIBLE:  # cannot happen: the hint is feasible
        log.warning("cpsat reported the warm-started model infeasible; keeping the warm start")
    return result


def _solve_highs(lowers, uppers, sizes, lb: int, pairs, upper: int, pair,
                 deadline: float | None, progress: bool) -> dict[str, Any]:
    import numpy as np

    milp, LinearConstraint, Bounds, sparse = _import_milp()
    n, m = len(sizes), len(pairs)
    big_m = upper  # within the bounds below, x_i + s_i - x_j <= upper
    u_col = n
    # Variables: x_0..x_{n-1}, u, z_0..z_{m-1}; all integer.
    rows: list[int] = []
    cols: list[int] = []
    vals: list[int] = []
    row_hi: list[int] = []
    for i, s in enumerate(sizes):  # eq. 2: x_i + s_i <= u
        r = len(row_hi)
        rows += [r, r]; cols += [i, u_col]; vals += [1, -1]; row_hi.append(-s)
    for k, (i, j) in enumerate(pairs):  # eqs. 3-4, the big-M disjunction
        z = n + 1 + k
        r = len(row_hi)
        rows += [r, r, r]; cols += [i, j, z]; vals += [1, -1, -big_m]
        row_hi.append(-sizes[i])  # x_i + s_i <= x_j + M z
        rows += [r + 1] * 3; cols += [j, i, z]; vals += [1, -1, big_m]
        row_hi.append(big_m - sizes[j])  # x_j + s_j <= x_i + M (1 - z)
    nvars = n + 1 + m
    matrix = sparse.csr_array((np.array(vals, dtype=float), (rows, cols)),
                              shape=(len(row_hi), nvars))
    var_lo = np.zeros(nvars)
    var_hi = np.ones(nvars)
    var_hi[:n] = [upper - s for s in sizes]
    var_lo[u_col] = lb
    var_hi[u_col] = upper - 1  # strictly better than the warm start, or infeasible
    if pair is not None:  # symmetry: pair[0] below pair[1], i.e. its z is 0
        var_hi[n + 1 + pairs.index(pair)] = 0
    cost = np.zeros(nvars)
    cost[u_col] = 1
    options = {"disp": bool(progress), "mip_rel_gap": 0.0}
    if deadline is not None:
        options["time_limit"] = _seconds_left(deadline)
    res = milp(cost, integrality=np.ones(nvars), bounds=Bounds(var_lo, var_hi),
               constraints=[LinearConstraint(matrix, -np.inf, np.array(row_hi, dtype=float))],
               options=options)
    # The model only admits peaks below ``upper``, so the optimal peak is at
    # least min(the model's dual bound, upper), and exactly ``upper`` when the
    # model is infeasible.
    dual = getattr(res, "mip_dual_bound", None)
    result = {"status": res.message, "offsets": None, "bound": None}
    if res.status == 0:  # optimal among peaks < upper, hence globally
        result["bound"] = math.ceil(res.fun - 1e-6)
    elif res.status == 2:  # no packing beats the warm start: it is optimal
        result["bound"] = upper
    elif dual is not None and np.isfinite(dual):
        result["bound"] = min(math.ceil(dual - 1e-6), upper)
    if res.x is not None:
        result["offsets"] = [int(round(v)) for v in res.x[:n]]
    return result


def _seconds_left(deadline: float) -> float:
    """Solver time left once the model is built (exact_offsets starts it with enough)."""
    return max(deadline - time.perf_counter(), 0.0)


def _progress_bar(progress: bool, backend: str, upper: int, lb: int):
    if not progress:
        return None
    from tqdm.auto import tqdm

    bar = tqdm(total=None, desc=f"exact ({backend})", unit="solution", leave=False)
    bar.set_postfix(peak=upper, bound=lb)
    return bar


# -- entry point ----------------------------------------------------------------
_BACKEND_NAMES = {"cpsat": "OR-Tools CP-SAT", "highs": "HiGHS"}


def solve(trace: Trace, options: SolverOptions, deadline: float | None,
          clock: Clock = WALL_CLOCK) -> Packing:
    """The ``exact`` method behind :func:`pgmo.solve`.

    The backends keep their limit on the wall clock: ``clock`` only says how
    much of the time limit is left.
    """
    limit = None if deadline is None else max(0.0, deadline - clock())
    offsets, optimal, info = exact_offsets(trace, time_limit=limit, progress=options.progress,
                                           backend=options.backend)
    return Packing(offsets, optimal, info)


def exact_offsets(trace: Trace, time_limit: float | None = None, progress: bool = False,
                  backend: str = "auto", workers: int | None = None,
                  warm: Sequence[int] | None = None) -> tuple[list[int], bool, dict[str, Any]]:
    """Minimum-peak offsets for a small trace, or the best found within ``time_limit``.

    Returns ``(offsets, optimal, info)``; ``optimal`` is True only when proven.
    ``info`` holds ``backend``, ``status``, ``bound`` (proven lower bound on
    the optimal peak), ``warm_start``/``warm_peak`` and ``seconds``.  Half of
    ``time_limit`` (at most 5 s) goes to the warm start, the rest to the
    solver: ``best`` packs MiniMalloc's hard instances B, E, F and H at their
    optimum within 3 to 6 s, where CP-SAT given 8 s from a poorer start does
    not.  ``workers`` is CP-SAT's thread count (default: the CPU count,
    at most 8).  ``warm``, a valid packing, replaces the heuristic warm start
    (to improve an existing plan, or to make the solver do all the work).
    ``time_limit=None`` searches until optimality is proven.  Raises
    :class:`ExactSolverUnavailable` (an ImportError) when the backend's
    package is missing, ValueError when the trace is too large.
    """
    start = time.perf_counter()
    if time_limit is not None and not time_limit >= 0:
        raise ValueError(f"time_limit must be >= 0 seconds (or None for no limit), "
                         f"got {time_limit!r}")
    chosen = resolve_backend(backend)
    lowers, uppers, sizes = trace.columns()
    n = len(sizes)
    if n == 0:
        return [], True, {"backend": chosen, "status": "empty trace", "bound": 0,
                          "seconds": 0.0}
    name = _BACKEND_NAMES[chosen]
    if n > MAX_BLOCKS[chosen]:
        raise ValueError(
            f"this trace has {n:,} blocks; the exact method ({name}) takes at most "
            f"{MAX_BLOCKS[chosen]:,}. Use the 'best' method for traces this large.")
    n_pairs = count_overlapping_pairs(lowers, uppers)
    if n_pairs > MAX_PAIRS[chosen]:
        raise ValueError(
            f"this trace has {n_pairs:,} pairs of blocks live at the same time; the exact "
            f"method ({name}) takes at most {MAX_PAIRS[chosen]:,}. Use the 'best' method "
            f"for traces this large.")
    lb = trace.lower_bound()

    if time_limit is None:
        warm_budget = WARM_SECONDS_UNLIMITED
    else:
        warm_budget = min(WARM_SHARE * time_limit, WARM_SECONDS_MAX)
    if warm is None:
        warm, warm_name, _ = warm_start(trace, warm_budget, progress=progress)
    else:
        warm = [int(o) for o in warm]
        why = find_conflict(trace.blocks, warm)
        if why is not None:
            raise ValueError(f"the given warm start is not a valid packing: {why}")
        warm, warm_name = compact(lowers, uppers, sizes, warm), "given"
    warm_peak = _peak(warm, sizes)
    info: dict[str, Any] = {"backend": chosen, "warm_start": warm_name, "warm_peak": warm_peak,
                            "lower_bound": lb, "n_pairs": n_pairs}
    log.info("exact: %d blocks, %d overlapping pairs, lower bound %d, warm start %s peak %d",
             n, n_pairs, lb, warm_name, warm_peak)

    def done(offsets, bound, status):
        optimal = bound == _peak(offsets, sizes)
        info.update(status=status, bound=bound, seconds=time.perf_counter() - start)
        log.info("exact (%s): peak %d, bound %d, optimal=%s (%s), %.2f s", chosen,
                 _peak(offsets, sizes), bound, optimal, status, info["seconds"])
        return offsets, optimal, info

    if warm_peak == lb:
        return done(warm, lb, "warm start meets the lower bound")

    # Divide out the sizes' gcd: a smaller, better-conditioned model (MiniMalloc
    # sizes are multiples of 1024).  Compacted offsets are multiples of it too.
    g = math.gcd(*sizes)
    ssizes = [s // g for s in sizes]
    pair = _symmetry_pair(lowers, uppers, sizes)
    hint = [o // g for o in _mirror_if_needed(warm, sizes, pair)]
    deadline = None if time_limit is None else start + time_limit
    if deadline is not None and deadline - time.perf_counter() < MIN_SOLVE_SECONDS:
        return done(warm, lb, "no time left for the solver")
    if chosen == "cpsat":
        if workers is None:
            workers = max(1, min(os.cpu_count() or 1, 8))
        result = _solve_cpsat(lowers, uppers, ssizes, lb // g, hint, warm_peak // g, pair,
                              deadline, progress, workers, scale=g)
    else:
        pairs = overlapping_pairs(lowers, uppers)
        result = _solve_highs(lowers, uppers, ssizes, lb // g, pairs, warm_peak // g, pair,
                              deadline, progress)

    bound = max(lb, (result["bound"] or 0) * g)
    offsets = result["offsets"]
    if offsets is not None:
        offsets = [o * g for o in offsets]
        why = find_conflict(trace.blocks, offsets)
        if why is not None:  # e.g. a numerically sloppy MIP answer
            log.warning("exact (%s) returned an invalid packing, keeping the warm start: %s",
                        chosen, why)
            offsets = None
    if offsets is None or _peak(offsets, sizes) >= warm_peak:
        offsets = warm
    return done(offsets, min(bound, _peak(offsets, sizes)), result["status"])
