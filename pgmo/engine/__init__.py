"""The pool's engine: everything but CuPy, so it runs and is tested on the CPU.

=====================  ================================================================
module                 owns
=====================  ================================================================
:mod:`.handout`        handing blocks out and taking their frees back (the hot path;
                       compiled by Cython when installed, see :mod:`.implementation`)
:mod:`.core`           the state machine: iterations, modes, departures
:mod:`.arenas`         arenas, the memory limit, byte accounting, room when the
                       device is full
:mod:`.recording`      iteration logs, and merging them into the profile
:mod:`.planner`        profile -> plan, now or in the background (:mod:`.worker`)
:mod:`.schedule`       plan -> what the hot path reads, and the safety rule
:mod:`.unmarked`       iterations nobody marks: when a detected one starts and
                       ends, when its period is dropped, the warning when none is found
:mod:`.detect`         finding the period of a repeating loop
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
