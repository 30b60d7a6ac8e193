"""Pool statistics: one dataclass from the engine to the user, the Chainer report and the CLI.

Byte counts follow CuPy's meaning: ``used_bytes`` are blocks handed out and
not yet freed, ``free_bytes`` are held by the pool but idle (the stock pool's
cache, survivors' buffers waiting for the next iteration, the arena space no
live block occupies), ``total_bytes`` is all the pool holds from the device,
and ``used + free == total`` always.

=======================  =================================  ==========================
pgmo                     CuPy ``MemoryPool``                PyTorch caching allocator
=======================  =================================  ==========================
``used_bytes``           ``used_bytes()``                   ``memory_allocated()``
``total_bytes``          ``total_bytes()``                  ``memory_reserved()``
``free_bytes``           ``free_bytes()``                   reserved - allocated
``n_free_blocks``        ``n_free_blocks()``                (inactive split blocks)
``peak_used_bytes``      (none)                             ``max_memory_allocated()``
``peak_total_bytes``     (none)                             ``max_memory_reserved()``
``limit``                ``get_limit()``                    (per-process fraction)
=======================  =================================  ==========================

``pool.reset_peak_stats()`` restarts both peaks from the current values, like
``torch.cuda.reset_peak_memory_stats()``; ``pool.memory_summary()`` prints
them for a person, like ``torch.cuda.memory_summary()``.

Renamed: ``departed_requests`` was ``fallback_requests`` up to pgmo 0.2, a
name that said "the stock pool" (the ``fallback`` mode) for requests that are
not served there.  ``fallback_requests`` stays one more release (0.3), as a
property and a key of :meth:`PoolStats.as_dict`, then goes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .units import format_bytes

__all__ = ["PoolStats"]

#: Old names of fields, kept as aliases for one release: old -> new.
ALIASES = {"fallback_requests": "departed_requests"}


@dataclass(frozen=True)
class PoolStats:
    """What a pool did and holds, at the moment ``pool.stats()`` was called.

    A frozen snapshot: it does not change as the pool goes on.  Every request
    (a non-empty malloc) is counted in exactly one of the seven ``*_requests``
    kinds, which add up to ``requests``; the five sources of memory
    (``arena_bytes``, ``old_arena_bytes``, ``exact_bytes``, ``kept_bytes``,
    ``stock_bytes``) add up to ``total_bytes``, and ``used_bytes +
    free_bytes == total_bytes`` as in CuPy.  ``planned_peak`` and
    ``lower_bound`` are the plan's (0 before the first plan).  :meth:`as_dict`
    and :meth:`numbers` give the fields to a logger (the Chainer extension
    reports them as ``pgmo/<field>``); :meth:`summary` is the table
    ``pool.memory_summary()`` prints.  Fields may be added in later releases,
    never removed without a release of warning (see :data:`ALIASES`).
    """

    # what the pool is doing
    mode: str  # warmup, profiling, planning, optimized or fallback
    replan: str  # where plans are computed: background, sync or bestfit
    iteration_source: str  # "marked" (pool.iteration()), "detected (...)" or "none"
    iterations: int  # iterations ended
    # requests (non-empty mallocs): each counted in exactly one of the seven kinds below
    requests: int
    profiled_requests: int  # warm-up, profiling, waiting for a plan: memory of their own
    planned_requests: int  # served from the arena
    departed_requests: int  # in optimized iterations, after a departure: arena gaps or their own
    pinned_requests: int  # in optimized iterations, survivors the plan keeps apart
    interrupted_requests: int  # between interrupt() and resume(): CuPy's stock pool
    outside_requests: int  # between iterations, or none marked or found: CuPy's stock pool
    foreign_requests: int  # another thread, device or stream during an iteration: stock pool
    # the plan
    departures: int  # requests that left the plan (bigger, more, late free, ...)
    reoptimizations: int  # re-plans: departures that changed the profile
    plan_method: str  # the solver method of the plan in use ("" before the first)
    planned_peak: int  # bytes the plan needs (<= arena_bytes)
    lower_bound: int  # no plan of the profile can need less
    planned_blocks: int
    pinned_blocks: int  # requests that outlived their iteration; kept buffers
    background_solves: int  # profiles given to the background solver
    stale_plans: int  # background plans dropped because a newer profile came
    planner_failures: int  # background solver crashed or overran its time
    solve_failures: int  # solves that raised
    arena_failures: int  # arenas the device or the limit refused
    # memory, in bytes (total_bytes = the five parts below)
    arena_bytes: int  # the current arena
    old_arena_bytes: int  # older arenas kept alive by their live blocks
    exact_bytes: int  # blocks in memory of their own (given back at their free)
    kept_bytes: int  # survivors' buffers, live or waiting for the next iteration
    stock_bytes: int  # what CuPy's stock pool holds
    live_bytes: int  # blocks pgmo handed out and that are not freed yet
    used_bytes: int
    free_bytes: int
    total_bytes: int
    n_free_blocks: int
    peak_used_bytes: int  # most bytes in use at once since the start or the last reset
    peak_total_bytes: int  # most bytes held at once since the start or the last reset
    limit: int  # 0: no limit
    # the device layer
    arena_kind: str  # what holds the arena now: "reserved range", "cudaMalloc" or "none"
    heap_kind: str  # what serves blocks of their own: "stream-ordered pool" or "cudaMalloc per request"
    boundary_releases: int  # memory given back at boundaries: a stream sync + one call each
    shape_plans: int  # plans made for recurring iteration shapes (buckets, batch sizes...)
    shape_iterations: int  # iterations served by a shape's own plan
    # why a part of the device layer is not what the device offers ("arena", "heap": cudaMalloc
    # instead), or a release was skipped ("trim", "unmap", "sync"...): part -> why
    device_reasons: dict  # empty when the pool uses all the device offers

    @property
    def fallback_requests(self) -> int:
        """Deprecated alias of :attr:`departed_requests`, for pgmo 0.3 only."""
        return self.departed_requests

    def as_dict(self) -> dict:
        """Every field by name, and the old names of :data:`ALIASES` for one release."""
        fields = dataclasses.asdict(self)
        fields.update({old: fields[new] for old, new in ALIASES.items()})
        return fields

    def numbers(self) -> dict[str, int]:
        """The integer fields (what a metrics logger can plot)."""
        return {k: v for k, v in self.as_dict().items()
                if isinstance(v, int) and not isinstance(v, bool)}

    def summary(self) -> str:
        """A table for a person, in the spirit of ``torch.cuda.memory_summary()``."""
        def mib(n: int) -> str:
            return f"{format_bytes(n):>14}"

        rows = [
            ("mode", self.mode), ("iterations", f"{self.iterations:,} ({self.iteration_source})"),
            ("re-planning", self.replan),
            ("", ""),
            ("in use now", mib(self.used_bytes)), ("in use, peak", mib(self.peak_used_bytes)),
            ("held now", mib(self.total_bytes)), ("held, peak", mib(self.peak_total_bytes)),
            ("  arena", mib(self.arena_bytes)), ("  older arenas", mib(self.old_arena_bytes)),
            ("  own blocks", mib(self.exact_bytes)), ("  survivors", mib(self.kept_bytes)),
            ("  stock pool", mib(self.stock_bytes)),
            ("  idle (free)", mib(self.free_bytes)),
            ("limit", "none" if not self.limit else mib(self.limit)),
            ("arena from", self.arena_kind or "-"), ("own blocks from", self.heap_kind or "-"),
            ("boundary releases", f"{self.boundary_releases:,}"),
            ("shape plans", f"{self.shape_plans:,} ({self.shape_iterations:,} iterations)"),
            ("", ""),
            ("plan", f"{self.plan_method or 'none yet'}, {self.planned_blocks:,} blocks, "
                     f"{self.pinned_blocks:,} pinned"),
            ("  planned peak", mib(self.planned_peak)), ("  lower bound", mib(self.lower_bound)),
            ("", ""),
            ("requests", f"{self.requests:,}"),
            ("  from the plan", f"{self.planned_requests:,}"),
            ("  profiled", f"{self.profiled_requests:,}"),
            ("  departed", f"{self.departed_requests:,} (departures {self.departures:,}, "
                           f"re-plans {self.reoptimizations:,})"),
            ("  pinned", f"{self.pinned_requests:,}"),
            ("  interrupted", f"{self.interrupted_requests:,}"),
            ("  between iterations", f"{self.outside_requests:,}"),
            ("  other thread/stream", f"{self.foreign_requests:,}"),
            ("problems", f"arena {self.arena_failures}, solver {self.solve_failures}, "
                         f"background {self.planner_failures}, stale plans {self.stale_plans}"),
        ]
        if self.device_reasons:
            rows.append(("device layer", ""))
            rows += [(f"  {part}", why) for part, why in sorted(self.device_reasons.items())]
        width = max(len(k) for k, _ in rows)
        lines = ["pgmo memory summary", "=" * (width + 30)]
        lines += [f"{k:<{width}}  {v}".rstrip() for k, v in rows]
        return "\n".join(lines)

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))
