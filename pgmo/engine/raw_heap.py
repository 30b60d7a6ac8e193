"""Memory of a block's own without a stream-ordered pool: one raw allocation (cudaMalloc) each.

The heap of a device without stream-ordered pools, or of one whose pool the
driver refused: it holds exactly its live blocks (``held == used``), gives
nothing back at a boundary (each block's cudaFree gives it back at its free,
and waits for the device), and is counted the same way as the
stream-ordered pool, so that the bytes the pool reports add up whichever
heap serves.
"""

from __future__ import annotations

from typing import Any, Callable

from .options import Buffer

__all__ = ["RawHeap"]


class _RawBlock:
    """A raw allocation lent as a heap block; its death frees it and leaves the books."""

    __slots__ = ("ptr", "size", "_buffer", "_heap")

    def __init__(self, buffer: Any, size: int, heap: "RawHeap"):
        self.ptr, self.size, self._buffer, self._heap = buffer.ptr, size, buffer, heap

    def __del__(self) -> None:
        heap = getattr(self, "_heap", None)  # None: __init__ never ran to its end
        if heap is not None:
            heap.held -= self.size  # an int's update: atomic enough for a statistic


class RawHeap:
    """A cudaMalloc per request, counted (the :class:`~.options.StreamHeap` protocol)."""

    kind = "cudaMalloc per request"

    def __init__(self, allocate: Callable[[int], Buffer]):
        self._allocate = allocate
        self.held = 0

    @property
    def used(self) -> int:
        return self.held

    def malloc(self, size: int) -> _RawBlock:
        buffer = self._allocate(size)
        self.held += size  # counted with the block that will give it back
        try:
            return _RawBlock(buffer, size, self)
        except BaseException:
            self.held -= size
            raise

    def trim(self) -> int:
        return 0  # nothing idle: every block's free gave its memory back

    def synchronize(self) -> None:
        pass  # nothing is given back later: no queued work to wait for
