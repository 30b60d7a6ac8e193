"""Pairing allocs and frees by address, onto pgmo's event clock.

Allocator logs (PyTorch snapshots, RMM logs, CuPy memory hooks) name a block
by its address, and an address is reused as soon as its block is freed.
:class:`AllocationLog` keeps the block currently live at each address, so a
free always closes the latest allocation there and the next allocation at
that address starts a new block.

A recording rarely starts on an empty allocator, nor ends on one.  Three kinds
of blocks are kept, never dropped, and counted in :meth:`report`:

``before_freed``
    freed during the recording but allocated before it started (a free of an
    address with no live block): live from the first tick until its free;
``before_live``
    allocated before the recording and still live at its end (known from an
    end-of-recording state such as PyTorch's segment list): open blocks live
    from the first tick;
``live_at_end``
    allocated during the recording and never freed: open blocks.

Blocks allocated before the recording get the first ticks of the clock (one
alloc each, as if allocated just before the first event), so the trace is
still block ``i`` = the ``i``-th alloc, built by :class:`~pgmo.recorder.EventRecorder`.
"""

from __future__ import annotations

from typing import Any, Hashable

from ..recorder import EventRecorder
from ..trace import Trace

__all__ = ["AllocationLog"]

_ALLOC, _FREE = 0, 1


class AllocationLog:
    """Allocs and frees keyed by address; :meth:`trace` puts them on the event clock."""

    def __init__(self) -> None:
        self.sizes: list[int] = []
        self._events: list[tuple[int, int]] = []  # (_ALLOC or _FREE, block), in order
        self._before_freed: list[int] = []  # blocks allocated before, freed during
        self._before_live: list[int] = []  # blocks allocated before, never freed
        self._live: dict[Hashable, int] = {}  # address -> live block allocated in the log
        self._freed = 0

    # -- events ---------------------------------------------------------------
    def live_block(self, address: Hashable) -> int | None:
        """The block live at ``address`` (allocated while recording), or None."""
        return self._live.get(address)

    def alloc(self, address: Hashable, size: int) -> int:
        """A block of ``size`` > 0 bytes allocated at ``address``; returns its number.

        The caller checks :meth:`live_block` first: an address in use cannot
        be allocated again (a file reader reports that as an error).
        """
        if address in self._live:
            raise ValueError(f"address {address!r} is still live")
        block = len(self.sizes)
        self.sizes.append(size)
        self._live[address] = block
        self._events.append((_ALLOC, block))
        return block

    def free(self, address: Hashable) -> int | None:
        """Free the block live at ``address``; None (and nothing logged) if there is none."""
        block = self._live.pop(address, None)
        if block is not None:
            self._events.append((_FREE, block))
            self._freed += 1
        return block

    def free_allocated_before(self, size: int) -> int:
        """A free of a block allocated before the recording started."""
        block = len(self.sizes)
        self.sizes.append(size)
        self._before_freed.append(block)
        self._events.append((_FREE, block))
        return block

    def live_allocated_before(self, size: int) -> int:
        """A block allocated before the recording and still live at its end."""
        block = len(self.sizes)
        self.sizes.append(size)
        self._before_live.append(block)
        return block

    @property
    def live_addresses(self) -> set:
        return set(self._live)

    # -- result ---------------------------------------------------------------
    def report(self) -> dict[str, Any]:
        """Counts and bytes of each kind of block (JSON-ready)."""
        def summary(blocks) -> dict[str, int]:
            return {"count": len(blocks), "bytes": sum(self.sizes[b] for b in blocks)}

        return {"requests": len(self.sizes),
                "before_freed": summary(self._before_freed),
                "before_live": summary(self._before_live),
                "live_at_end": summary(list(self._live.values()))}

    def trace(self, source: str | None = None, **metadata: Any) -> Trace:
        """The blocks on the event clock: blocks allocated before the recording first."""
        recorder = EventRecorder()
        handle: dict[int, int] = {}
        sizes = self.sizes
        for block in self._before_freed + self._before_live:
            handle[block] = recorder.alloc(sizes[block])
        for kind, block in self._events:
            if kind == _ALLOC:
                handle[block] = recorder.alloc(sizes[block])
            else:
                recorder.free(handle[block])
        trace = recorder.trace(**metadata)
        return trace.with_source(source) if source else trace
