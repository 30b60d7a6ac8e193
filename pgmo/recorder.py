"""The event clock: turn a stream of alloc and free calls into a :class:`~pgmo.trace.Trace`.

The clock ticks once at every alloc and every free; block ``i`` is the
``i``-th alloc.  A block not freed when the trace is taken is *open*, or, with
``close_open=True``, freed then in alloc order (one tick each).  The synthetic
generator and the CuPy trace recorder both write through this class.
"""

from __future__ import annotations

from typing import Any

from .trace import Trace

__all__ = ["EventRecorder"]


class EventRecorder:
    """Log allocs and frees on the event clock; :meth:`trace` gives the result."""

    def __init__(self, round_to: int = 1) -> None:
        self.tick = 0
        self.round_to = round_to  # sizes are logged rounded up to a multiple of this
        self.lowers: list[int] = []
        self.uppers: list[int | None] = []
        self.sizes: list[int] = []

    def __len__(self) -> int:
        return len(self.sizes)

    def alloc(self, nbytes: int) -> int:
        """Log an allocation of ``nbytes`` (> 0); returns its handle, the block index."""
        if nbytes <= 0:
            raise ValueError(f"an allocation needs a positive size, got {nbytes}")
        unit = self.round_to
        self.sizes.append(-(-nbytes // unit) * unit)
        self.lowers.append(self.tick)
        self.uppers.append(None)
        self.tick += 1
        return len(self.sizes) - 1

    def free(self, handle: int) -> None:
        """Log the free of block ``handle``."""
        if self.uppers[handle] is not None:
            raise ValueError(f"block {handle} freed twice")
        self.uppers[handle] = self.tick
        self.tick += 1

    def size(self, handle: int) -> int:
        return self.sizes[handle]

    def trace(self, close_open: bool = False, **metadata: Any) -> Trace:
        """The recorded trace; open blocks stay open unless ``close_open``."""
        if close_open:
            for i, upper in enumerate(self.uppers):
                if upper is None:
                    self.free(i)
        return Trace.from_columns(self.lowers, self.uppers, self.sizes, metadata)
