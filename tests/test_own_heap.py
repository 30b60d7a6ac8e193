"""pgmo.engine.own_heap: the heap of pgmo's own, page by page in a reserved range.

On the host model of the device (pgmo.device.host_range.HostRange: mapped pages
fault once given back), every block checked; on the CUDA classes the same
heap runs in tests/test_cuda_device.py (heap="own").
"""

from __future__ import annotations

import collections
import gc

from pgmo.engine.own_heap import OwnHeap
from pgmo.device.host_memory import HostMemory
from pgmo.measure.replay import Checker

MiB = 1 << 20
PAGE = 2 * MiB


class Heap:
    """An own heap with the checker's face: ``malloc`` returns what CuPy's would."""

    def __init__(self, capacity=None, stream=None):
        self.memory = HostMemory(capacity)
        self.heap = OwnHeap(self.memory.reserve(), stream)

    def malloc(self, size):
        return self.heap.malloc(size)


def test_pages_are_mapped_as_blocks_need_them_and_trimmed_once_wholly_free():
    h = Heap()
    checker = Checker(host=True, device=h.memory)
    a = checker.alloc(h, 3 * MiB)  # pages 0-1
    b = checker.alloc(h, MiB)  # the rest of page 1: held memory first
    assert h.heap.held == h.memory.in_use == 2 * PAGE and h.memory.maps == 2
    c = checker.alloc(h, 5 * MiB)
    assert checker.free(a) and checker.free(c)
    del a, c
    assert h.heap.used == MiB and h.heap.held == 5 * PAGE
    h.heap.synchronize()
    released = h.heap.trim()  # page 1 holds b: pages 0 and 2-4 go back, one unmap per run
    assert released == 4 * PAGE and h.heap.held == PAGE
    assert h.memory.unmaps == h.memory.release_calls == 2 and h.memory.sync_calls == 1
    d = checker.alloc(h, 6 * MiB)  # mapped again where needed
    assert checker.free(b) and checker.free(d)
    del b, d
    assert checker.corrupted == checker.overlaps == 0
    h.heap.trim()
    assert h.heap.held == h.memory.in_use == 0


def test_a_stream_change_waits_for_the_device_once_and_reuses_nothing_before():
    """A range freed by a block of stream 1 is not handed to stream 2 until the device was
    synchronized (stream 1's kernels may still use it)."""
    current = [1]
    h = Heap(stream=lambda: current[0])
    a = h.malloc(4 * MiB)
    a_ptr = a.ptr
    current[0] = 2
    b = h.malloc(MiB)  # the change: one device sync
    assert h.memory.sync_calls == 1
    del a  # stream 1's block dies after the change: quarantined
    c = h.malloc(4 * MiB)
    assert c.ptr != a_ptr  # not reused on stream 2 before a sync
    h.heap.synchronize()
    h.heap.trim()  # after a device sync: the quarantined range is free again
    current[0] = 1
    d = h.malloc(4 * MiB)
    assert h.memory.sync_calls == 3  # the trim's and the change back
    del b, c, d


def test_a_malloc_cut_short_never_lends_its_range_twice():
    """An exception inside the heap's placement (a Ctrl-C) makes the next call rebuild the
    free list from the live blocks."""
    h = Heap()
    checker = Checker(host=True, device=h.memory)
    keep = [checker.alloc(h, s * MiB) for s in (3, 1, 2)]
    space = h.heap._space

    def cut_short(nbytes):
        raise KeyboardInterrupt

    space.place = cut_short
    try:
        h.heap.malloc(64 * MiB)
    except KeyboardInterrupt:
        pass
    more = [checker.alloc(h, s * MiB) for s in (4, 1, 3)]
    assert h.heap._space is not space  # rebuilt
    for handle in keep + more:
        assert checker.free(handle)
    assert checker.corrupted == checker.overlaps == 0


def test_a_free_cut_short_between_its_books_and_its_queue_is_applied_once():
    """A Ctrl-C landing after a freed block left the live list but before its queue entry
    was taken (a real signal arrives between two calls on one line): the rebuilt free list
    keeps its range until the entry is applied, so it is never free twice."""

    class CutOnce(collections.deque):
        cut = True

        def popleft(self):
            if CutOnce.cut:
                CutOnce.cut = False
                raise KeyboardInterrupt
            return super().popleft()

    h = Heap()
    h.heap._returned = CutOnce()
    checker = Checker(host=True, device=h.memory)
    keep = [checker.alloc(h, s * MiB) for s in (3, 1, 2)]
    gone = keep.pop(0)
    assert checker.free(gone)
    del gone
    gc.collect()
    try:
        h.heap.malloc(MiB)
    except KeyboardInterrupt:
        pass
    assert not CutOnce.cut  # the cut landed where it should
    more = [checker.alloc(h, s * MiB) for s in (3, 1, 3, 2)]
    for handle in keep + more:
        assert checker.free(handle)
    del keep, more, handle
    gc.collect()
    assert checker.corrupted == checker.overlaps == 0
    assert h.heap.used == 0 and h.heap.trim() >= 0 and h.heap.held == 0


def test_a_block_keeps_its_heap_mapped_after_the_heap_is_dropped():
    h = Heap()
    checker = Checker(host=True, device=h.memory)
    block = checker.alloc(h, 3 * MiB)
    memory = h.memory
    del h
    gc.collect()
    assert memory.holds(block[0].ptr, 3 * MiB)  # still mapped: its heap lives
    assert checker.free(block)
    del block
    gc.collect()
    assert memory.in_use == 0


def test_the_bytes_in_use_follow_every_malloc_and_free():
    """``used`` (asked at every boundary, so kept between changes) is always the live blocks'
    bytes: after a malloc, after frees applied or still on their way."""
    import random

    h = Heap()
    rng = random.Random(5)
    live = []
    for step in range(300):
        if live and rng.random() < 0.45:
            live.pop(rng.randrange(len(live)))  # its free waits for the heap's next call
        else:
            live.append(h.malloc(rng.choice([512, 4096, MiB, 3 * MiB])))
        if step % 3 == 0:
            assert h.heap.used == sum(b.size for b in live)
    live.clear()
    assert h.heap.used == 0
