"""Blocks and traces: what one profiled iteration asked of the allocator.

A *block* is one allocation request: ``size`` bytes, allocated at event tick
``lower`` and freed at tick ``upper``.  The event clock ticks once at every
alloc and every free, so lifetimes are half-open intervals ``[lower, upper)``:
a block freed at tick t and one allocated at tick t may share addresses.

A four-block example (time runs right, address runs up)::

    address
      8 |        +-----+
        |        |  3  |
      4 +-----+--+--+--+
        |  0  |  1  |
      0 +-----+-----+-----> tick
        0     2     4  6

    Block(0, lower=0, upper=2, size=4)   Block(1, 2, 4, 4)
    Block(2, 4, 6, 4) would reuse block 0's address; block 3 (3, 6, 4)
    overlaps block 1 in time, so it must sit above it.

The *lower bound* of a trace is its max load: the largest total size of
blocks live at one instant.  No packing can have a smaller peak.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Mapping, Sequence

__all__ = ["Block", "Trace", "max_load", "FREE", "ALLOC", "events"]


@dataclass(frozen=True, slots=True)
class Block:
    """One request: ``size`` bytes live during ``[lower, upper)``."""

    id: int | str  # caller's identifier (request index when recorded by pgmo)
    lower: int  # alloc tick, inclusive
    upper: int  # free tick, exclusive; upper > lower
    size: int  # bytes, > 0

    @property
    def lifetime(self) -> int:
        return self.upper - self.lower

    def overlaps_in_time(self, other: "Block") -> bool:
        return self.lower < other.upper and other.lower < self.upper


FREE, ALLOC = 0, 1  # event kinds; FREE sorts first at equal ticks


def events(blocks: Sequence[Block]) -> list[tuple[int, int, int]]:
    """``(tick, kind, index)`` in time order, frees before allocs at a tick.

    That order is what half-open lifetimes mean: a block freed at t and one
    allocated at t are never live together.
    """
    evs = [(b.upper, FREE, i) for i, b in enumerate(blocks)]
    evs += [(b.lower, ALLOC, i) for i, b in enumerate(blocks)]
    evs.sort()
    return evs


def max_load(lowers: Sequence[int], uppers: Sequence[int], sizes: Sequence[int]) -> int:
    """Largest total size live at one instant (frees at t before allocs at t)."""
    events = [(u, -s) for u, s in zip(uppers, sizes)]
    events += [(lo, s) for lo, s in zip(lowers, sizes)]
    # At equal ticks the negative deltas (frees) sort first.
    events.sort()
    live = best = 0
    for _, delta in events:
        live += delta
        if live > best:
            best = live
    return best


@dataclass(frozen=True)
class Trace:
    """An ordered, immutable collection of blocks plus free-form metadata.

    Block order matters to the pool: block ``i`` answers request ``i`` of an
    iteration.  ``metadata`` records how the trace was made (model, batch
    size, device, "recorded by pgmo" or "synthetic").
    """

    blocks: tuple[Block, ...]
    metadata: Mapping[str, Any] = field(default_factory=dict)
    source: str | None = field(default=None, compare=False)  # file it came from

    def __post_init__(self) -> None:
        if not isinstance(self.blocks, tuple):
            object.__setattr__(self, "blocks", tuple(self.blocks))
        object.__setattr__(self, "metadata", dict(self.metadata))

    # -- construction -------------------------------------------------------
    @classmethod
    def from_tuples(
        cls, rows: Iterable[Sequence[int]], metadata: Mapping[str, Any] | None = None
    ) -> "Trace":
        """Build from ``(lower, upper, size)`` or ``(id, lower, upper, size)`` rows.

        Validates like the file readers do, without a file name.
        """
        from .io import blocks_from_rows

        return cls(blocks_from_rows(rows), metadata or {})

    # -- sequence protocol --------------------------------------------------
    def __len__(self) -> int:
        return len(self.blocks)

    def __iter__(self) -> Iterator[Block]:
        return iter(self.blocks)

    def __getitem__(self, i: int) -> Block:
        return self.blocks[i]

    # -- derived facts ------------------------------------------------------
    def columns(self) -> tuple[list[int], list[int], list[int]]:
        """``(lowers, uppers, sizes)`` as plain lists, for fast solvers."""
        return (
            [b.lower for b in self.blocks],
            [b.upper for b in self.blocks],
            [b.size for b in self.blocks],
        )

    def lower_bound(self) -> int:
        """Max bytes live at once; cached because solvers and reports all ask."""
        cached = self.__dict__.get("_lower_bound")
        if cached is None:
            cached = max_load(*self.columns())
            object.__setattr__(self, "_lower_bound", cached)
        return cached

    @property
    def total_bytes(self) -> int:
        return sum(b.size for b in self.blocks)

    @property
    def horizon(self) -> int:
        """One past the last tick used."""
        return max((b.upper for b in self.blocks), default=0)

    def with_metadata(self, **extra: Any) -> "Trace":
        return dataclasses.replace(self, metadata={**self.metadata, **extra})

    def write(self, path, offsets: Sequence[int] | None = None) -> None:
        """Write as MiniMalloc CSV (``.csv``) or pgmo JSON (``.json``/``.json.gz``)."""
        from .io import write_trace

        write_trace(self, path, offsets=offsets)

    def __repr__(self) -> str:
        where = f", source={self.source!r}" if self.source else ""
        return f"Trace(n={len(self)}, lower_bound={self.lower_bound()}{where})"
