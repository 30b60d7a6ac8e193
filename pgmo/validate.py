"""An independent check that a packing is valid; never imports the solver.

A packing is valid when every offset is a non-negative integer and no two
blocks that are live at the same time share an address.  The check sweeps
time and keeps the live blocks sorted by offset: a new block can only collide
with its neighbours in that order, so the sweep costs O(n log n) plus list
moves, fast enough for 60k-block traces.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Sequence

from .errors import PlanError
from .trace import FREE, Block, events

__all__ = ["PlanError", "find_conflict", "check_offsets"]


def _describe(b: Block, off: int) -> str:
    return (f"block id={b.id} (lifetime [{b.lower}, {b.upper}), "
            f"addresses [{off}, {off + b.size}))")


def find_conflict(blocks: Sequence[Block], offsets: Sequence[int]) -> str | None:
    """Return why the packing is invalid, or None when it is valid."""
    if len(blocks) != len(offsets):
        return f"{len(offsets)} offsets for {len(blocks)} blocks"
    for b, off in zip(blocks, offsets):
        if not isinstance(off, int) or isinstance(off, bool) or off < 0:
            return (f"block id={b.id} (lifetime [{b.lower}, {b.upper}), size {b.size}) "
                    f"has invalid offset {off!r}")
    live_keys: list[tuple[int, int]] = []  # (offset, index), sorted
    for _, kind, i in events(blocks):
        key = (offsets[i], i)
        if kind == FREE:
            pos = bisect_left(live_keys, key)
            del live_keys[pos]
            continue
        pos = bisect_left(live_keys, key)
        b, off = blocks[i], offsets[i]
        if pos > 0:
            j = live_keys[pos - 1][1]
            if offsets[j] + blocks[j].size > off:
                return f"{_describe(blocks[j], offsets[j])} overlaps {_describe(b, off)}"
        if pos < len(live_keys):
            j = live_keys[pos][1]
            if off + b.size > offsets[j]:
                return f"{_describe(b, off)} overlaps {_describe(blocks[j], offsets[j])}"
        live_keys.insert(pos, key)
    return None


def check_offsets(blocks: Sequence[Block], offsets: Sequence[int]) -> None:
    """Raise :class:`PlanError` naming the first collision, if any."""
    why = find_conflict(blocks, offsets)
    if why is not None:
        raise PlanError(f"invalid packing: {why}")
