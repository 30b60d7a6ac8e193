"""Pool statistics: one dataclass, so every consumer sees the same names.

Byte counts follow CuPy's meaning: ``used_bytes`` are blocks handed out and
not yet freed, ``free_bytes`` are held by the pool but idle (cached fallback
blocks and the arena space no live block occupies), ``total_bytes`` is all the
pool holds from the raw allocator, and ``used + free == total`` always.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

__all__ = ["PoolStats"]


@dataclass(frozen=True)
class PoolStats:
    mode: str  # 'profiling', 'optimized' or 'fallback'
    iterations: int  # hot iterations ended
    requests: int  # non-empty mallocs seen
    profiled_requests: int  # served by the fallback while profiling
    planned_requests: int  # served from the arena
    fallback_requests: int  # in optimized iterations, served by the fallback
    interrupted_requests: int  # between interrupt() and resume()
    foreign_requests: int  # another thread, device or stream during an iteration
    departures: int  # requests that left the profile (bigger, more, late free, ...)
    reoptimizations: int  # re-solves after departures
    solve_failures: int
    arena_failures: int  # arenas the raw allocator or the limit refused
    arena_bytes: int  # the current arena
    old_arena_bytes: int  # older arenas kept alive by their live blocks
    planned_peak: int  # the plan's peak (<= arena_bytes)
    lower_bound: int  # max load of the planned profile
    planned_blocks: int
    pinned_blocks: int  # requests that outlived their iteration; always the fallback
    peak_used: int  # most bytes in use at once (arena + fallback blocks)
    live_bytes: int  # bytes of blocks pgmo handed out and not yet freed
    used_bytes: int
    free_bytes: int
    total_bytes: int
    n_free_blocks: int
    limit: int  # 0: no limit

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))
