"""Which heap serves memory of a block's own, made at its first request, and its fallbacks.

pgmo's page heap (:mod:`.page_heap`, the default; or with ``heap="own"`` its
own heap of :mod:`.own_heap`) where the device has virtual memory, else
the driver's stream-ordered pool, else a cudaMalloc per request
(:mod:`.raw_heap`); a heap the driver refuses is replaced by the next for good
(rule 7 of :mod:`.memory`), the old one kept for its blocks.  Part of
:class:`~.memory.DeviceMemory` (a mixin over :class:`~.accounts.MemoryAccounts`).
Tested in ``tests/test_own_heap.py``, ``tests/test_page_heap.py`` and
``tests/test_cuda_device.py``.
"""

from __future__ import annotations

from ..errors import DeviceError
from .accounts import NOT_GIVEN_BACK, MemoryAccounts, log
from .options import PageRange, StreamHeap
from .own_heap import OwnHeap
from .page_heap import PageHeap
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
                return PageHeap.kind if self._pages else OwnHeap.kind
            return STREAM_POOL if self._make_heap is not None else RawHeap.kind
        return str(getattr(heap, "kind", STREAM_POOL))

    @property
    def own_heap_serves(self) -> bool:
        """Whether the heap is pgmo's own (:mod:`.own_heap` or :mod:`.page_heap`): it serves
        an iteration with no call that waits for the device (a cudaMalloc per request frees
        with cudaFree, which does)."""
        return self._own_heap

    def _heap(self) -> StreamHeap:
        heap = self.heap
        if heap is None:
            try:
                if self._own_heap and self._pages:
                    assert self._heap_reserve is not None  # own_heap needs virtual memory
                    # fresh addresses per request: 32x the device (1 TiB when unknown)
                    heap = self._page_heap(self._heap_reserve(32 * self.device_memory
                                                              or 1 << 40))
                elif self._own_heap:
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

    def _page_heap(self, rng: object) -> StreamHeap:
        """The page heap on ``rng``; pgmo's own heap where the range maps no pages of their
        own (rule 7: the reason is kept)."""
        if not isinstance(rng, PageRange):
            self._pages = False
            self.reasons["heap"] = "the reserved range maps no pages of their own; the " \
                                   "heap is pgmo's own (page by page) instead"
            return OwnHeap(rng, self._stream)  # type: ignore[arg-type]
        return PageHeap(rng, self._stream)

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

    _tidied_at = -1  # the boundary (iteration number) of the last tidy

    def tidy_heap(self, heaps: list[StreamHeap] | None = None) -> bool:
        """A page heap's old mappings dropped, its pages kept: one device sync, once per
        boundary (rule 1 of :mod:`.memory`), apart from the boundary's one release (rule 4:
        the heap's idle pages must still go back before an arena is taken); True when
        done.  ``heaps``: :meth:`_heaps`, when the caller has them."""
        heaps = self._heaps() if heaps is None else heaps
        for heap in heaps:  # (a loop: at every boundary)
            if getattr(heap, "stale", 0):
                break
        else:
            return False
        boundary = self.hot.iteration
        if self._tidied_at == boundary or self._released_at == boundary or not self._sync():
            return False
        self._tidied_at = boundary
        for heap in heaps:
            self._tidy(heap)
        return True

    def _tidy(self, heap: StreamHeap) -> None:
        """A page heap's stale mappings dropped (the caller synchronized the device)."""
        if not getattr(heap, "stale", 0):
            return
        try:
            heap.tidy()  # type: ignore[attr-defined]
            self._cleared("trim")
        except NOT_GIVEN_BACK as e:  # rule 7: the mapping stays listed, and counted
            self._trouble("trim", "pgmo could not unmap its page heap's old mappings (%s); "
                          "skipped", e)

    def _trim(self, heap: StreamHeap) -> None:
        try:
            heap.trim()
            self._cleared("trim")
        except NOT_GIVEN_BACK as e:  # rule 7: the memory stays held, and counted
            self._trouble("trim", "pgmo could not trim its stream-ordered pool (%s); skipped",
                          e)
