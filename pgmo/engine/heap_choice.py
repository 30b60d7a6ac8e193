"""Which heap serves memory of a block's own, made at its first request, and its fallbacks.

pgmo's own heap (:mod:`.own_heap`) where the device has virtual memory, else
the driver's stream-ordered pool, else a cudaMalloc per request
(:mod:`.raw_heap`); a heap the driver refuses is replaced by the next for good
(rule 7 of :mod:`.memory`), the old one kept for its blocks.  Part of
:class:`~.memory.DeviceMemory` (a mixin over :class:`~.accounts.MemoryAccounts`).
Tested in ``tests/test_own_heap.py`` and ``tests/test_cuda_device.py``.
"""

from __future__ import annotations

from ..errors import DeviceError
from .accounts import NOT_GIVEN_BACK, MemoryAccounts, log
from .options import StreamHeap
from .own_heap import OwnHeap
from .raw_heap import RawHeap

__all__ = ["HeapChoice", "STREAM_POOL"]

#: What ``stats().heap_kind`` says of the driver's stream-ordered pool.
STREAM_POOL = "stream-ordered pool"


class HeapChoice(MemoryAccounts):
    """The heap in use, made at its first request (see the module's docstring)."""

    @property
    def heap_kind(self) -> str:
        """What serves memory of a block's own now: ``"own heap (reserved range)"``,
        ``"stream-ordered pool"`` (the driver's) or ``"cudaMalloc per request"``."""
        heap = self.heap
        if heap is None:
            if self._own_heap:
                return OwnHeap.kind
            return STREAM_POOL if self._make_heap is not None else RawHeap.kind
        return str(getattr(heap, "kind", STREAM_POOL))

    def _heap(self) -> StreamHeap:
        heap = self.heap
        if heap is None:
            try:
                if self._own_heap:
                    assert self._heap_reserve is not None  # own_heap needs virtual memory
                    # address space is cheap, contiguous gaps are not: 8x the device
                    heap = OwnHeap(self._heap_reserve(8 * self.device_memory or None),
                                   self._stream)
                elif self._make_heap is not None:
                    heap = self._make_heap()
                else:
                    heap = RawHeap(self.allocate)
            except (DeviceError, MemoryError) as e:  # rule 7 (MemoryError: no address space)
                self._heap_off(f"{e}")
                return self._heap()
            self.heap = heap
        return heap

    def _heap_off(self, why: str) -> None:
        """Rule 7: the next heap from now on (pgmo's own, the driver's pool, a cudaMalloc per
        request); the old heap stays for its blocks."""
        heap = self.heap
        if heap is not None and not isinstance(heap, RawHeap):
            self._old_heaps.append(heap)
        self.heap = None
        if self._own_heap:
            self._own_heap = False
            nxt = STREAM_POOL if self._make_heap is not None else RawHeap.kind
        else:
            self._make_heap = None
            nxt = RawHeap.kind
        self.reasons["heap"] = f"{why}; the heap is a {nxt} from now on"
        log.warning("pgmo's heap is a %s from now on: %s", nxt, why)

    def _trim(self, heap: StreamHeap) -> None:
        try:
            heap.trim()
            self._cleared("trim")
        except NOT_GIVEN_BACK as e:  # rule 7: the memory stays held, and counted
            self._trouble("trim", "pgmo could not trim its stream-ordered pool (%s); skipped",
                          e)
