"""The pool's engine: everything but CuPy, so it runs and is tested on the CPU.

========================  ================================================================
module                    owns
========================  ================================================================
:mod:`.handout`           handing blocks out, and the one hand-out decision of a
                          request of an iteration (the hot path; compiled by Cython
                          when installed, see :mod:`.hot_path_choice`)
:mod:`.frees`             each block's free, from its owner's death to the engine's inbox;
                          the arena record; the request counters
:mod:`.memory`            every byte of device memory obtained and released: the arena,
                          blocks of their own, survivors' buffers, the stock pool; the
                          footprint policy's rules and decisions
:mod:`.reserved_arena`    the arena on a reserved address range (a mechanism of memory)
:mod:`.heap_choice`       which heap serves memory of a block's own, and its fallbacks
:mod:`.stock_use`         CuPy's stock pool within the limit
:mod:`.accounts`          the device memory's state, every byte counted, its troubles
:mod:`.placement`         off-plan requests placed in the arena's gaps
:mod:`.state`             where the engine is; modes and the hot path's kind derive from it
:mod:`.core`              the state machine: iterations, modes, whose a request is,
                          departures
:mod:`.plan_choice`       which plan to follow (boundaries, shapes); optimize, adopt, reset
:mod:`.pool_queries`      CuPy's pool queries and the engine's views
:mod:`.parts`             the engine's parts, declared for those two mixins
:mod:`.scopes`            ``with engine.iteration()`` and ``with engine.interrupted()``
:mod:`.profiles`          iteration logs, and merging them into the profile
:mod:`.planner`           profile -> plan, now or in the background
:mod:`.worker`            the solver process, both ends (over :mod:`.wire`)
:mod:`.schedule`          plan -> the rows the hot path reads, and the safety rule
:mod:`.shapes`            plans of recurring iteration shapes (buckets, batch sizes)
:mod:`.loop_watch`        iterations nobody marks: when a detected one starts and
                          ends, when its period is dropped, the warning when none is found
:mod:`.detect`            finding the period of a repeating loop
:mod:`.report`            the counters gathered into one ``PoolStats``
:mod:`.options`           the backend (memory sources) and the user's options
:mod:`.hot_path_choice`  the compiled hot path, or its plain-Python reference
========================  ================================================================

Each module's docstring names its tests; the engine as a whole is tested in
``tests/test_engine_*.py`` (one module per concern), on both hot paths.
"""

from __future__ import annotations

from ..errors import PgmoWarning  # re-exported here, where it was first defined
from .core import Engine
from .hot_path_choice import compiled, reference_handout
from .options import Backend, PlainMemory, PoolOptions, pool_options

__all__ = ["Engine", "Backend", "PoolOptions", "PlainMemory", "PgmoWarning", "pool_options",
           "compiled", "reference_handout"]
