"""Where a pool's plans go once installed: its ``plan_path``, or the plan cache.

A pool given ``plan_path`` saves every new plan there (and loads it at
start, :meth:`pgmo.ProfileGuidedMemoryPool.load`); otherwise, unless
``plan_cache=False``, every plan is kept in the plan cache
(:mod:`pgmo.plan_cache`) with the warm-up's profiles, and the engine starts
a later run from it (:mod:`pgmo.engine.hinted`).  This is the pool's side of
both: the device's key in the cache, and the writer.

Tested in ``tests/test_plan_cache.py`` and ``tests/test_persist.py``.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from . import plan_cache
from .engine import Engine
from .engine.schedule import Schedule
from .formats import planfile

__all__ = ["cache_key", "PlanKeeper"]

log = logging.getLogger("pgmo.pool")


def cache_key(allocator: Any, device_id: int, memory: int) -> plan_cache.DeviceKey:
    """What the plan cache keys a pool's device by: CUDA's device name and CuPy's version,
    or, for a pool given a raw allocator (host memory in tests), that allocator's class
    (no CuPy version); the device's memory size either way."""
    if allocator is not None:
        kind = type(allocator)
        return plan_cache.DeviceKey(f"{kind.__module__}.{kind.__qualname__}", memory, None)
    import cupy

    name = cupy.cuda.runtime.getDeviceProperties(device_id)["name"]
    name = name.decode() if isinstance(name, bytes) else str(name)
    return plan_cache.DeviceKey(name, memory, cupy.__version__)


class PlanKeeper:
    """Writes each installed plan to ``plan_path``, else to ``cache`` (None: nowhere)."""

    def __init__(self, plan_path: str | None, cache: plan_cache.PlanCache | None):
        self.plan_path = plan_path
        self.cache = cache

    def installed(self, schedule: Schedule, engine: Engine) -> None:
        """Keep ``schedule`` (just installed by ``engine``).

        With background re-planning a plan cache entry is made by the worker
        process (its warm-up plans and its encoding never take the training
        process's interpreter) and a ``plan_path`` file is written by a thread,
        off the training loop (a large profile takes milliseconds to write); with
        ``replan="sync"`` either is written at once, for reproducible runs.
        """
        from . import __version__

        profile, plan, path, cache = schedule.profile, schedule.plan, self.plan_path, self.cache
        if path is None and cache is None:
            return
        openings = list(engine.opening_profiles)  # read now: the engine's lock is held

        def write() -> None:
            if cache is not None:
                cache.keep(profile, plan, openings)
                return
            try:
                planfile.save(path, profile, plan.offsets, plan.method, {"pgmo": __version__})
            except OSError as e:
                log.warning("cannot save the plan to %s: %s", path, e)

        if engine.planner.mode == "background" and cache is not None:
            engine.planner.keep(lambda: cache.keep_request(profile, plan, openings), write)
        elif engine.planner.mode == "background":
            threading.Thread(target=write, name="pgmo-save-plan").start()
        else:
            write()
