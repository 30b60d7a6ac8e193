"""Blocks and traces: what one profiled iteration asked of the allocator.

A *block* is one allocation request: ``size`` bytes, allocated at event tick
``lower`` and freed at tick ``upper``.  The event clock ticks once at every
alloc and every free, so lifetimes are half-open intervals ``[lower, upper)``:
a block freed at tick t and one allocated at tick t may share addresses.

A block still live when the recording ended is *open* (``upper is None``):
the pool pins such a request to its fallback, and every bound or packing
treats it as live until the trace's :attr:`~Trace.horizon`.

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

Sizes obey one rule (:func:`pgmo.units.size_refused`): at most
:data:`~pgmo.units.MAX_DEVICE_BYTES` each and :data:`~pgmo.units.MAX_TRACE_BYTES`
together, so that the solvers' 64-bit sums cannot overflow; every reader
applies it through :class:`SizeTotal`.

This module is the bottom of pgmo's core: it imports nothing else from pgmo
but :mod:`pgmo.errors` and :mod:`pgmo.units`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Mapping, Sequence

import numpy as np

from .errors import TraceFormatError
from .units import size_refused

__all__ = ["Block", "Trace", "max_load", "packing_peak", "intervals_overlap", "events",
           "FREE", "ALLOC", "block_from_values", "to_int", "to_id", "SizeTotal"]


def intervals_overlap(lo_a: float, hi_a: float, lo_b: float, hi_b: float) -> bool:
    """Whether half-open ``[lo_a, hi_a)`` and ``[lo_b, hi_b)`` share a point.

    The one overlap test of pgmo: lifetimes on the event clock and address
    ranges in an arena are both half-open.
    """
    return lo_a < hi_b and lo_b < hi_a


def packing_peak(offsets: Sequence[int], sizes: Sequence[int]) -> int:
    """Bytes a packing needs: the highest ``offset + size`` (0 when empty)."""
    return max((o + s for o, s in zip(offsets, sizes)), default=0)


def max_load(lowers: Sequence[int], uppers: Sequence[int], sizes: Sequence[int]) -> int:
    """Largest total size live at one instant (frees at t before allocs at t)."""
    if len(sizes) >= _MAX_LOAD_WITH_NUMPY:
        return _max_load_numpy(lowers, uppers, sizes)
    deltas = [(u, -s) for u, s in zip(uppers, sizes)]
    deltas += [(lo, s) for lo, s in zip(lowers, sizes)]
    # At equal ticks the negative deltas (frees) sort first.
    deltas.sort()
    live = best = 0
    for _, delta in deltas:
        live += delta
        if live > best:
            best = live
    return best


#: From this many blocks on, :func:`max_load` sorts with NumPy: no Python object per event
#: (12,774 requests made 25,548 tuples, enough to set off a full garbage collection in
#: the training thread where a pool's profile is measured), and 5-10x faster.
_MAX_LOAD_WITH_NUMPY = 256


def _max_load_numpy(lowers: Sequence[int], uppers: Sequence[int], sizes: Sequence[int]) -> int:
    """:func:`max_load` in NumPy's arrays (sizes and ticks fit in 64 bits: the size rule)."""
    size = np.asarray(sizes, dtype=np.int64)
    ticks = np.concatenate((np.asarray(uppers, dtype=np.int64),
                            np.asarray(lowers, dtype=np.int64)))
    deltas = np.concatenate((-size, size))
    order = np.lexsort((deltas, ticks))  # by tick, frees (negative) first at a tick
    return max(0, int(np.cumsum(deltas[order]).max()))


@dataclass(frozen=True, slots=True)
class Block:
    """One request: ``size`` bytes live during ``[lower, upper)``; open if ``upper`` is None."""

    id: int | str  # caller's identifier (request index when recorded by pgmo)
    lower: int  # alloc tick, inclusive
    upper: int | None  # free tick, exclusive, > lower; None: never freed while recorded
    size: int  # bytes, > 0

    @property
    def is_open(self) -> bool:
        return self.upper is None

    @property
    def lifetime(self) -> int:
        if self.upper is None:
            raise ValueError(f"block id={self.id} is open: it has no lifetime yet")
        return self.upper - self.lower

    def overlaps_in_time(self, other: "Block") -> bool:
        inf = float("inf")
        return intervals_overlap(self.lower, inf if self.upper is None else self.upper,
                                 other.lower, inf if other.upper is None else other.upper)


FREE, ALLOC = 0, 1  # event kinds; FREE sorts first at equal ticks


def events(blocks: Sequence[Block]) -> list[tuple[int, int, int]]:
    """``(tick, kind, index)`` in time order, frees before allocs at a tick.

    That order is what half-open lifetimes mean: a block freed at t and one
    allocated at t are never live together.  Open blocks have no free event.
    """
    evs = [(b.upper, FREE, i) for i, b in enumerate(blocks) if b.upper is not None]
    evs += [(b.lower, ALLOC, i) for i, b in enumerate(blocks)]
    evs.sort()
    return evs


# ---------------------------------------------------------------- validation
def to_int(value: Any, name: str, where: Mapping[str, Any]) -> int:
    """An integer field, from an int or its text; a clear error otherwise."""
    if isinstance(value, bool):
        raise TraceFormatError(f"expected an integer, got {value!r}", field=name, **where)
    if isinstance(value, int):
        return value
    if hasattr(value, "__index__"):  # NumPy integers
        return int(value.__index__())
    try:
        return int(str(value).strip())
    except ValueError:
        raise TraceFormatError(f"expected an integer, got {value!r}", field=name,
                               **where) from None


def to_id(value: Any, where: Mapping[str, Any]) -> int | str:
    """Ids are integers when they look like one; MiniMalloc also allows names like 'b1'."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    text = str(value).strip()
    if not text:
        raise TraceFormatError("empty id", field="id", **where)
    try:
        return int(text)
    except ValueError:
        return text


class SizeTotal:
    """Applies the size rule (:func:`pgmo.units.size_refused`) to a trace's sizes as a
    reader meets them: each at most ``MAX_DEVICE_BYTES``, all together at most
    ``MAX_TRACE_BYTES``; the error names the place (``where``) and the field."""

    def __init__(self) -> None:
        self.total = 0

    def add(self, size: int, where: Mapping[str, Any], field: str = "size") -> int:
        """Count ``size`` (>= 0) and return it, or raise :class:`TraceFormatError`."""
        why = size_refused(size, self.total + size)
        if why:
            raise TraceFormatError(why, field=field, **where)
        self.total += size
        return size


def block_from_values(ident: Any, lower: Any, upper: Any, size: Any,
                      where: Mapping[str, Any], inclusive: bool = False,
                      total: SizeTotal | None = None) -> Block:
    """Validate one row's fields into a Block; ``upper`` None or blank means open.

    ``where`` (``path``/``line``) goes into the error.  ``inclusive`` reads a
    lifetime that includes ``upper`` (IREE's files) as the half-open one.
    ``total`` counts the trace's sizes so far (the size rule); without it the
    size alone is checked.
    """
    ident = to_id(ident, where)
    size = to_int(size, "size", where)
    lower = to_int(lower, "lower", where)
    open_block = upper is None or (isinstance(upper, str) and not upper.strip())
    upper = None if open_block else to_int(upper, "upper", where)
    if size <= 0:
        raise TraceFormatError(f"size must be > 0, got {size}", field="size", **where)
    (total or SizeTotal()).add(size, where)
    if lower < 0:
        raise TraceFormatError(f"lower must be >= 0, got {lower}", field="lower", **where)
    if upper is not None:
        given = upper
        if inclusive:
            upper += 1
        if upper <= lower:
            raise TraceFormatError(
                f"upper must be > lower for a half-open lifetime [lower, upper), "
                f"got lower={lower} upper={given}", field="upper", **where)
    return Block(ident, lower, upper, size)


class _UniqueIds:
    """Catches a repeated block id, naming where it was first seen."""

    def __init__(self, unit: str):
        self.unit = unit
        self.seen: dict[Any, Any] = {}

    def check(self, block: Block, position: Any, where: Mapping[str, Any]) -> None:
        if block.id in self.seen:
            first = self.seen[block.id]
            raise TraceFormatError(f"duplicate id {block.id} (first seen at {self.unit} "
                                   f"{first})", field="id", **where)
        self.seen[block.id] = position


def _plain(column: Sequence[Any]) -> list:
    """A column as a list; NumPy's arrays as Python integers (as files and other processes
    want them)."""
    return column.tolist() if isinstance(column, np.ndarray) else list(column)


# ---------------------------------------------------------------------- trace
class Trace:
    """An ordered, immutable collection of blocks plus free-form metadata.

    Block order matters to the pool: block ``i`` answers request ``i`` of an
    iteration.  ``metadata`` records how the trace was made (model, batch
    size, device, "recorded by pgmo" or "synthetic").  This one type carries
    a profile from recording through planning to saved files.

    Two traces are equal when their blocks and metadata are (``source``, the file
    it came from, does not count).  A trace made by :meth:`from_columns` keeps
    its columns and makes its :class:`Block` objects only when ``blocks`` is
    first read: the pool profiles thousands of requests at an iteration's end,
    and a burst of objects there can set off a full garbage collection in the
    training thread (the planner needs the columns alone).
    """

    def __init__(self, blocks: Iterable[Block] = (), metadata: Mapping[str, Any] | None = None,
                 source: str | None = None) -> None:
        blocks = tuple(blocks)
        if not all(isinstance(b, Block) for b in blocks):
            bad = next(b for b in blocks if not isinstance(b, Block))
            raise TypeError(f"a Trace holds Block objects, got {bad!r}: make one from rows with "
                            f"Trace.from_rows, or from columns with Trace.from_columns")
        state = self.__dict__
        state["_blocks"] = blocks
        state["_log"] = state["_ids"] = None
        state["metadata"] = dict(metadata or {})
        state["source"] = source

    metadata: dict[str, Any]
    source: str | None

    @property
    def blocks(self) -> tuple[Block, ...]:
        """The blocks, block ``i`` answering request ``i``."""
        state = self.__dict__
        blocks = state["_blocks"]
        if blocks is None:
            lowers, uppers, sizes = state["_log"]
            ids = state["_ids"] or range(len(sizes))
            blocks = state["_blocks"] = tuple(map(Block, ids, lowers, uppers, sizes))
        return blocks

    def __setattr__(self, name: str, value: Any) -> None:
        raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Trace):
            return NotImplemented
        if self.metadata != other.metadata or len(self) != len(other):
            return False
        if self.__dict__["_blocks"] is None and other.__dict__["_blocks"] is None:
            return (self.log_columns() == other.log_columns()
                    and list(self._block_ids()) == list(other._block_ids()))
        return self.blocks == other.blocks

    __hash__ = None  # type: ignore[assignment]  # mutable metadata, as a dataclass's was

    def _block_ids(self) -> Sequence[Any]:
        """The blocks' ids, without making the blocks."""
        state = self.__dict__
        if state["_blocks"] is not None:
            return [b.id for b in state["_blocks"]]
        return state["_ids"] or range(len(state["_log"][2]))

    def _replaced(self, metadata: Mapping[str, Any] | None = None,
                  source: str | None = None) -> "Trace":
        """This trace with other metadata or source, its columns kept unmade."""
        twin = Trace.__new__(Trace)
        twin.__dict__.update(_blocks=self.__dict__["_blocks"], _log=self.__dict__["_log"],
                             _ids=self.__dict__["_ids"],
                             metadata=dict(self.metadata if metadata is None else metadata),
                             source=self.source if source is None else source)
        return twin

    # -- construction -------------------------------------------------------
    @classmethod
    def from_rows(cls, rows: Iterable[Sequence[Any]],
                  metadata: Mapping[str, Any] | None = None) -> "Trace":
        """Build from ``(lower, upper, size)`` or ``(id, lower, upper, size)`` rows.

        Validates as the file readers do (a :class:`~pgmo.errors.TraceFormatError`, a
        ``ValueError``, naming the row); ``upper=None`` makes an open block.
        """
        ids = _UniqueIds("row")
        total = SizeTotal()
        blocks = []
        for i, row in enumerate(rows):
            row = tuple(row)
            if len(row) == 3:
                row = (i,) + row
            where = {"line": i}
            if len(row) != 4:
                raise TraceFormatError(f"row {i}: expected (lower, upper, size) or "
                                       f"(id, lower, upper, size), got {row!r}")
            block = block_from_values(*row, where=where, total=total)
            ids.check(block, i, where)
            blocks.append(block)
        return cls(tuple(blocks), metadata or {})

    from_tuples = from_rows  # the name used before pgmo 0.2

    @classmethod
    def from_columns(cls, lowers: Sequence[int], uppers: Sequence[int | None],
                     sizes: Sequence[int], metadata: Mapping[str, Any] | None = None) -> "Trace":
        """Block ``i`` is request ``i``: ``(lowers[i], uppers[i], sizes[i])``, trusted input."""
        if not len(lowers) == len(uppers) == len(sizes):
            raise ValueError(f"columns of different lengths: {len(lowers)} lowers, "
                             f"{len(uppers)} uppers, {len(sizes)} sizes")
        return cls._of_columns((_plain(lowers), _plain(uppers), _plain(sizes)), None,
                               metadata, None)

    @classmethod
    def _of_columns(cls, log: tuple[list, list, list], ids: list | None,
                    metadata: Mapping[str, Any] | None, source: str | None) -> "Trace":
        """A trace that keeps ``log``'s columns (``ids``: its blocks' ids, None for their
        indices) and makes its blocks when asked."""
        trace = cls.__new__(cls)
        trace.__dict__.update(_blocks=None, _ids=ids, _log=log, metadata=dict(metadata or {}),
                              source=source)
        return trace

    # -- sequence protocol --------------------------------------------------
    def __len__(self) -> int:
        log = self.__dict__["_log"]
        return len(log[2]) if log is not None else len(self.__dict__["_blocks"])

    def __iter__(self) -> Iterator[Block]:
        return iter(self.blocks)

    def __getitem__(self, i: int) -> Block:
        return self.blocks[i]

    def size_of(self, i: int) -> int:
        """Block ``i``'s size, read without making the blocks."""
        log = self.__dict__["_log"]
        return log[2][i] if log is not None else self.blocks[i].size

    # -- open blocks --------------------------------------------------------
    @property
    def open_ids(self) -> tuple:
        """Ids of the blocks still live when the recording ended."""
        log = self.__dict__["_log"]
        if log is not None:
            ids = self._block_ids()
            return tuple(ids[i] for i, upper in enumerate(log[1]) if upper is None)
        return tuple(b.id for b in self.blocks if b.upper is None)

    def closed(self) -> "Trace":
        """Open blocks live until the horizon: what they occupy if never freed."""
        if not self.open_ids:
            return self
        end = self.horizon
        blocks = tuple(b if b.upper is not None else Block(b.id, b.lower, end, b.size)
                       for b in self.blocks)
        return Trace(blocks, {**self.metadata, "closed_open_blocks": list(self.open_ids)},
                     self.source)

    def without_open(self) -> "Trace":
        """Only the blocks that were freed: what the pool's arena serves."""
        pinned = self.open_ids
        if not pinned:
            return self
        metadata = {**self.metadata, "pinned": list(pinned)}
        log = self.__dict__["_log"]
        if log is None:
            return Trace(tuple(b for b in self.blocks if b.upper is not None), metadata,
                         self.source)
        ids = self._block_ids()
        kept = [i for i, upper in enumerate(log[1]) if upper is not None]
        lowers, uppers, sizes = ([column[i] for i in kept] for column in log)
        return Trace._of_columns((lowers, uppers, sizes), [ids[i] for i in kept], metadata,
                                 self.source)

    # -- derived facts ------------------------------------------------------
    def columns(self) -> tuple[list[int], list[int], list[int]]:
        """``(lowers, uppers, sizes)`` as plain lists (open blocks end at the horizon)."""
        cached = self.__dict__.get("_columns")
        if cached is None:
            lowers, uppers, sizes = self.log_columns()
            if None in uppers:
                end = self.horizon
                uppers = [end if u is None else u for u in uppers]
            cached = self.__dict__["_columns"] = (lowers, uppers, sizes)
        return list(cached[0]), list(cached[1]), list(cached[2])

    def log_columns(self) -> tuple[list[int], list[int | None], list[int]]:
        """``(lowers, uppers, sizes)`` as plain lists, an open block's upper None: what
        :meth:`from_columns` takes back (plain data for another process)."""
        log = self.__dict__["_log"]
        if log is not None:
            return list(log[0]), list(log[1]), list(log[2])
        blocks = self.blocks
        return ([b.lower for b in blocks], [b.upper for b in blocks], [b.size for b in blocks])

    def lower_bound(self) -> int:
        """Max bytes live at once; cached because solvers and reports all ask."""
        cached = self.__dict__.get("_lower_bound")
        if cached is None:
            cached = max_load(*self.columns())
            self.__dict__["_lower_bound"] = cached
        return cached

    @property
    def total_bytes(self) -> int:
        return sum(self.log_columns()[2])

    @property
    def horizon(self) -> int:
        """One past the last tick used (an open block's alloc tick counts)."""
        lowers, uppers, _ = self.log_columns()
        return max((lo + 1 if up is None else up for lo, up in zip(lowers, uppers)), default=0)

    def with_metadata(self, **extra: Any) -> "Trace":
        return self._replaced(metadata={**self.metadata, **extra})

    def with_source(self, source: str) -> "Trace":
        """This trace, read from the file ``source``."""
        return self._replaced(source=source)

    def __repr__(self) -> str:
        where = f", source={self.source!r}" if self.source else ""
        n_open = len(self.open_ids)
        opened = f", open={n_open}" if n_open else ""
        return f"Trace(n={len(self)}{opened}, lower_bound={self.lower_bound()}{where})"
