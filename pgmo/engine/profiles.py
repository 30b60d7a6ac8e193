"""Iteration logs merged into the pool's profile: what the planner plans.

The hot path writes an iteration's log on the event clock into C arrays
(``HotPath.log_arrays``: alloc ticks, free ticks, sizes); at the iteration's
end the engine takes a :class:`Log` of them, as lists, in the order of
:meth:`.Trace.columns`.  A block still live at the end is open (``upper``
None): the next plan keeps its request apart, in a buffer of its own (a
survivor).

In an iteration served by the plan, a request that kept to its planned size
logs size 0 ("no larger than planned"); the engine fills those in from the
profile that iteration was planned for (:func:`filled`) before the log goes
to the planner, whose profile may have moved on meanwhile.

Tested in ``tests/test_variable_workloads.py`` and ``tests/test_planner.py``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple, Sequence

import numpy as np

from ..trace import Trace
from .handout import NOT_FREED

if TYPE_CHECKING:
    from .handout import HotPath
    from .schedule import Schedule

__all__ = ["Log", "log_of", "outlived_its_plan", "merge", "to_profile", "filled", "absorb"]


class Log(NamedTuple):
    """Per request: alloc tick, free tick or None, rounded size (0: as planned).

    The columns of :meth:`.Trace.columns`, in its order.
    """

    lowers: Sequence[int]
    uppers: Sequence[int | None]
    sizes: Sequence[int]


def log_of(hot: HotPath, n: int, planned: Trace | None = None) -> Log:
    """The first ``n`` requests of the hot path's log (its C arrays) as a :class:`Log`.

    ``planned``: the profile of the plan the iteration was served from; each
    size logged "as planned" (0) becomes its size there.  The planner may fold
    the log into a newer profile than that one (in the background, or after
    a failed solve), where request ``i`` has another size or does not exist.
    """
    lowers, uppers, sizes = hot.log_arrays
    ups = uppers[:n].tolist()
    if NOT_FREED in ups:
        ups = [None if u == NOT_FREED else u for u in ups]
    log = Log(lowers[:n].tolist(), ups, sizes[:n].tolist())
    return filled(log, planned) if planned is not None else log


def outlived_its_plan(hot: HotPath, n: int, schedule: Schedule) -> bool:
    """Whether one of the first ``n`` requests outlived the iteration (not freed in the hot
    path's log) where ``schedule`` does not keep it apart: a survivor its plan did not
    expect, so the iteration departed.  Read at every planned boundary: no list is built
    (cnn-resolutions keeps 161 of 779 requests apart, 14 us as a list, 3 us here)."""
    uppers = hot.log_arrays[1]
    if n < SCAN_WITH_NUMPY:  # a short log: its survivors counted in C first; the usual
        # case, none or a few, looked at one by one (found in C)
        many = uppers[:n].count(NOT_FREED)
        if not many:
            return False
        if many < FIND_WITH_NUMPY:
            pinned = schedule.pinned
            i = -1
            for _ in range(many):
                i = uppers.index(NOT_FREED, i + 1, n)
                if i not in pinned:
                    return True
            return False
    outlived = np.frombuffer(uppers, dtype=np.int64, count=n) == NOT_FREED  # no copy
    apart = schedule.kept_apart
    if n > len(apart):  # requests beyond the plan's: none is kept apart
        if outlived[len(apart):].any():
            return True
        outlived = outlived[:len(apart)]
    return bool((outlived > apart[:n]).any())


#: Logs of this many requests or more are scanned for survivors with NumPy: about 2 us
#: whatever their length, against a count in C that compares each entry as a Python int
#: (0.9 us for AlexNet's 133 requests, 1.8 us for 256, 5 us for 600).
SCAN_WITH_NUMPY = 320
#: Or when this many survivors are counted in a short log (one Python step each, else).
FIND_WITH_NUMPY = 16


def to_profile(log: Log) -> Trace:
    """A profiling iteration's log as the pool's profile (block i = request i)."""
    return Trace.from_columns(*log, {"recorded_by": "pgmo"})


def filled(log: Log, planned_for: Trace) -> Log:
    """``log`` with its "as planned" sizes (0) replaced by those of the profile it was
    planned for: a log that stands on its own, whatever the profile is by now."""
    if 0 not in log.sizes:
        return log
    planned = planned_for.log_columns()[2]
    sizes = [s or planned[i] for i, s in enumerate(log.sizes)]
    return Log(log.lowers, log.uppers, sizes)


def absorb(profile: Trace, log: Log) -> tuple[Trace, bool]:
    """The profile after a departed iteration (``log``, filled), and whether it varies.

    When the iteration made the same requests (the same sizes, in order, as
    far as both go) with other lifetimes (a late free, a survivor, more
    requests at the end), the two merge (:func:`merge`): every pattern seen
    fits the merged lifetimes, so re-solving converges.  When the requests
    differ in shape (variable-length batches: request ``i`` is another tensor
    each time), merging would describe no iteration that ran and its plan
    would outgrow every real one (merges of merges compound); then the
    profile is the larger of the two iterations (by lower bound), and the
    others are placed in the arena's gaps (:mod:`.placement`).
    """
    own = to_profile(log)
    sizes = [b.size for b in profile.blocks]
    if [b.size for b in own.blocks[:len(sizes)]] == sizes[:len(own)]:
        merged = merge(profile, log)
        return (profile if merged.blocks == profile.blocks else merged), False
    return (own if own.lower_bound() > profile.lower_bound() else profile), True


def merge(profile: Trace, log: Log) -> Trace:
    """Per request: largest size, earliest alloc, latest free, open if open in either.

    Lowers stay strictly increasing (element-wise min of increasing lists),
    and every pattern seen so far fits the merged lifetimes, so re-solving
    converges as a variable workload repeats itself.
    """
    p_lo = [b.lower for b in profile.blocks]
    p_up = [b.upper for b in profile.blocks]
    p_sz = [b.size for b in profile.blocks]
    n = max(len(p_sz), len(log.sizes))
    lowers, uppers, sizes = [], [], []
    for i in range(n):
        if i < len(p_sz) and i < len(log.sizes):
            lowers.append(min(p_lo[i], log.lowers[i]))
            a, b = p_up[i], log.uppers[i]
            uppers.append(None if a is None or b is None else max(a, b))
            sizes.append(max(p_sz[i], log.sizes[i]))
        elif i < len(p_sz):
            lowers.append(p_lo[i])
            uppers.append(p_up[i])
            sizes.append(p_sz[i])
        else:
            lowers.append(log.lowers[i])
            uppers.append(log.uppers[i])
            sizes.append(log.sizes[i])
    return Trace.from_columns(lowers, uppers, sizes, {"recorded_by": "pgmo", "merged": True})
