"""The pool's engine: everything but CuPy, so it runs and is tested on the CPU.

=====================  ================================================================
module                 owns
=====================  ================================================================
:mod:`.handout`        handing blocks out (the hot path; compiled by Cython when
                       installed, see :mod:`.implementation`)
:mod:`.frees`          each block's free, from its owner's death to the engine's inbox;
                       the arena record; the request counters
:mod:`.memory`         every byte of device memory obtained and released: the arena,
                       blocks of their own, survivors' buffers, the stock pool; the
                       footprint policy, the limit, byte accounting, room when full
:mod:`.placement`      off-plan requests placed in the arena's gaps
:mod:`.state`          where the engine is; modes and the hot path's kind derive from it
:mod:`.core`           the state machine: iterations, modes, departures
:mod:`.recording`      iteration logs, and folding them into the profile
:mod:`.planner`        profile -> plan, now or in the background (:mod:`.worker`)
:mod:`.schedule`       plan -> what the hot path reads, and the safety rule
:mod:`.unmarked`       iterations nobody marks: when a detected one starts and
                       ends, when its period is dropped, the warning when none is found
:mod:`.detect`         finding the period of a repeating loop
:mod:`.queries`        CuPy's pool queries and the engine's views
:mod:`.report`         the counters gathered into one ``PoolStats``
:mod:`.options`        the backend (memory sources) and the user's options
=====================  ================================================================
"""

from __future__ import annotations

from .core import Engine
from .implementation import compiled, reference_handout
from .options import Backend, PlainMemory, PoolOptions, pool_options
from .unmarked import PgmoWarning

__all__ = ["Engine", "Backend", "PoolOptions", "PlainMemory", "PgmoWarning", "pool_options",
           "compiled", "reference_handout"]
