"""Survivors' buffers: memory of their own that waits, once freed, for the same request next time.

A survivor is a block that outlives its iteration (a gradient, a loss kept
for logging): the plan keeps it apart.  Giving it the very buffer the same
request had last iteration keeps the heap as it is (a best-fit heap would
place it elsewhere now and then, and grow) and, without a stream-ordered
pool, spares a cudaFree and a cudaMalloc per survivor per iteration.

Never lent twice: a buffer is held here while lent (``_lent``), so that it
is never garbage together with its block.  A block that dies in a reference
cycle is finalized with everything the cycle alone keeps alive; a buffer in
that set would be freed by its own finalizer *and* handed back for reuse.
The block's death only queues an integer key.

Tested in ``tests/test_engine_arenas.py``.
"""

from __future__ import annotations

import collections
from typing import Callable

from .options import Buffer

__all__ = ["KeptBuffers"]


class _KeptBlock:
    """A survivor's buffer lent out; its death puts the buffer back for the next iteration.

    It keeps the buffer too, for when the pool goes first."""

    __slots__ = ("ptr", "size", "_buffer", "_key", "_returned")

    def __init__(self, buffer: Buffer, size: int, key: int,
                 returned: collections.deque[int]):
        # one line: an exception (a Ctrl-C) cannot leave the block half made
        self.ptr, self.size, self._buffer, self._key, self._returned = \
            buffer.ptr, size, buffer, key, returned

    def __del__(self) -> None:
        returned = getattr(self, "_returned", None)  # None: __init__ never ran to its end
        if returned is not None:
            returned.append(self._key)


class KeptBuffers:
    """The survivors' buffers: lent, or idle since the iteration they were freed in."""

    def __init__(self) -> None:
        # size -> (buffer, stamp), in the order they went idle (stamps ascend)
        self._idle: dict[int, list[tuple[Buffer, int]]] = {}
        self._lent: dict[int, Buffer] = {}  # key -> a buffer lent out
        self._next_key = 0
        self._returned: collections.deque[int] = collections.deque()  # keys of blocks freed

    def lend(self, rs: int, stamp: int, take: Callable[[int], Buffer]) -> _KeptBlock:
        """A buffer of ``rs`` bytes: an idle one of this size, else a new one, ``take(rs)``
        (the heap's, ``DeviceMemory.exact``; passed here, not kept: no cycle keeps a dropped
        pool alive)."""
        if self._returned:  # (a call saved per survivor when none died since)
            self.collect(stamp)
        idle = self._idle.get(rs)
        buffer = idle.pop()[0] if idle else take(rs)
        key = self._next_key
        self._next_key = key + 1
        self._lent[key] = buffer  # held here while lent: never garbage with its block
        try:
            return _KeptBlock(buffer, rs, key, self._returned)
        except BaseException:  # no block: its buffer is nobody's (dropped, it frees itself)
            self._lent.pop(key, None)
            raise

    def collect(self, stamp: int) -> None:
        """Buffers whose blocks died wait, idle since iteration ``stamp``."""
        returned, lent = self._returned, self._lent
        while returned:
            buffer = lent.pop(returned[0], None)
            if buffer is not None:  # None: a block whose hand-out did not complete
                self._idle.setdefault(buffer.size, []).append((buffer, stamp))
            returned.popleft()

    def release(self, stamp: int, before: int | None = None) -> None:
        """Give back idle buffers (those idle since before iteration ``before``; None: all)."""
        if self._returned:
            self.collect(stamp)
        idle = self._idle
        if not idle:  # (at every boundary: usually no survivor's buffer is idle)
            return
        if before is None:
            idle.clear()
            return
        for size in list(idle):
            buffers = idle[size]
            if buffers and buffers[0][1] >= before:  # stamps ascend: none is old enough
                continue
            keep = [entry for entry in buffers if entry[1] >= before]
            if keep:
                idle[size] = keep
            else:
                del idle[size]

    def idle_bytes(self, stamp: int) -> int:
        """Bytes of idle buffers (derived: no count to fall out of step)."""
        self.collect(stamp)
        return sum(size * len(idle) for size, idle in self._idle.items())

    def idle_count(self) -> int:
        return sum(len(idle) for idle in self._idle.values())
