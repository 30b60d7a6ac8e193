"""Plans per iteration shape: a bucket, a batch size, a resolution that recurs gets its own plan.

A variable workload that recurs in a few shapes (sorted batches padded to a
few lengths, a server's batch sizes, training at a few resolutions) would
otherwise have one plan, the largest iteration's, and every other shape
would leave it at its first difference and be placed in the arena's gaps
(:mod:`.placement`): correct, but each of those requests is placed online,
and a shape the gaps do not hold grows the arena.  ONNX Runtime keeps a
memory pattern per input shape and TensorRT an optimization profile per
shape range; here each recurring shape gets a plan at its own lower bound,
every plan in the one arena (sized for the largest), and the shape is
recognised from the iteration's first request (the batch's input: its size
changes with the bucket, the batch size or the resolution).

A shape seen once keeps its log; seen again with the same requests (size by
size), it is planned (at the boundary in ``sync``/``bestfit`` mode, by the
planner's worker process in ``background`` mode) and used from the next
iteration of that shape on.  A shape whose plan an iteration leaves is not planned again:
its first request does not name it.  Shapes whose
first request is the main profile's use the main plan; unseen shapes start
on the main plan and are placed in its gaps where they leave it, as before.
At most :data:`MAX_SHAPES` shapes are kept (the least recently used goes).

Tested in ``tests/test_variable_workloads.py``.
"""

from __future__ import annotations

import collections
import threading
from typing import Callable

from .profiles import Log
from .schedule import Schedule

__all__ = ["ShapeBook", "MAX_SHAPES"]

#: Shape plans kept at once.
MAX_SHAPES = 8
#: A shape whose plan is left this many times is not planned again.
GIVE_UP = 1


class ShapeBook:
    """The recurring shapes' plans, keyed by the rounded size of an iteration's first request.

    ``plan(run_log, done)`` plans a shape's iteration (the engine passes
    ``Planner.plan_shape``, :mod:`.planner`) and hands the schedule
    (or None) to ``done``: at once, or later from another thread (the
    planner's, in background mode), for a later boundary.
    """

    def __init__(self, plan: Callable[[Log, Callable[[Schedule | None], None]], None]):
        self._plan = plan
        self._lock = threading.Lock()
        self._epoch = 0  # plans asked for before the last clear() are dropped
        self._plans: collections.OrderedDict[int, Schedule] = collections.OrderedDict()
        self._seen: dict[int, Log] = {}  # shapes seen once: their last log
        self._pending: set[int] = set()  # being planned
        self._misses: dict[int, int] = {}  # times a shape's plan was left
        self._given_up: set[int] = set()  # shapes whose iterations differ behind the first request
        self.planned = 0  # shape plans made
        self.switches = 0  # iterations served by a shape's plan

    def __len__(self) -> int:
        return len(self._plans)

    def schedule_for(self, key: int) -> Schedule | None:
        with self._lock:
            schedule = self._plans.get(key)
            if schedule is not None:
                self._plans.move_to_end(key)
            return schedule

    def most_requests(self) -> int:
        """The most requests a shape plan holds (the iteration's log is sized for it)."""
        if not self._plans:  # (at every boundary: most workloads have no shape plans)
            return 0
        with self._lock:
            return max((s.n for s in self._plans.values()), default=0)

    def arena_size(self) -> int:
        """The arena every shape plan needs."""
        if not self._plans:
            return 0
        with self._lock:
            return max((s.arena_size for s in self._plans.values()), default=0)

    def observe(self, key: int, run_log: Log, again: bool = False) -> None:
        """An iteration of shape ``key`` ran off the shape plans (``run_log`` filled): the
        second time a shape is seen (or ``again``: it left its own plan) it is planned."""
        epoch = self._epoch
        pending = False

        def done(schedule: Schedule | None) -> None:
            with self._lock:
                self._pending.discard(key)
                if epoch != self._epoch:
                    return
                self._seen.pop(key, None)  # planned, or not to be planned from this log
                if schedule is None:
                    return
                self._plans[key] = schedule
                self.planned += 1
                while len(self._plans) > MAX_SHAPES:
                    self._plans.popitem(last=False)

        # A Ctrl-C anywhere from the shape's marking as pending on takes the mark back (a
        # shape left pending would never be planned); its first log goes only with its plan.
        try:
            with self._lock:
                if key in self._plans or key in self._pending or key in self._given_up:
                    return
                seen = self._seen.get(key)
                if not again and (seen is None or seen.sizes != run_log.sizes):
                    self._seen[key] = run_log  # not (yet) a shape that recurs request by request
                    return
                epoch = self._epoch
                pending = True  # before the mark: taking back a mark not made is harmless
                self._pending.add(key)
            self._plan(run_log, done)
        except BaseException:
            if pending:
                with self._lock:
                    self._pending.discard(key)
            raise

    def forget(self, key: int) -> bool:
        """A shape's plan did not hold its iteration (it departed): dropped, to be planned
        again from the larger of the two; False when this shape's plan was left
        :data:`GIVE_UP` times (the first request does not name the shape: its iterations
        are placed in gaps from now on)."""
        with self._lock:
            self._plans.pop(key, None)
            misses = self._misses[key] = self._misses.get(key, 0) + 1
            if misses >= GIVE_UP:
                self._given_up.add(key)
                return False
            return True

    def clear(self) -> None:
        with self._lock:
            self._epoch += 1
            self._pending.clear()
            self._plans.clear()
            self._seen.clear()
            self._misses.clear()
            self._given_up.clear()
