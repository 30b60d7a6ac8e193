"""The bytes a program holds in live blocks, counted by a CuPy memory hook: the same for every pool.

A pool's ``used_bytes`` is its own bookkeeping, and CuPy's pool keeps no
peak of it.  :class:`LiveBytes` hears every malloc and free of whatever pool
serves them (CuPy's and pgmo's both call CuPy's memory hooks) and counts the
requested sizes rounded up to CuPy's 512-byte unit: the least any pool could
hold at that moment, whichever pool it is.  ``mark()`` returns the peak
since the last mark (one iteration).  CuPy's hooks are per thread: install
it in the thread that allocates; a free of a block allocated before the hook
was installed is ignored.
"""

from __future__ import annotations

from cupy.cuda import memory_hook

#: CuPy rounds every request up to this many bytes.
UNIT = 512


def rounded(size: int) -> int:
    return -(-size // UNIT) * UNIT


class LiveBytes(memory_hook.MemoryHook):
    """Bytes in live blocks on one device, now, at their peak, and per interval between marks."""

    name = "pgmo.LiveBytes"

    def __init__(self, device_id: int = 0) -> None:
        self.device_id = device_id
        self.now = 0
        self.peak = 0
        self._since_mark = 0
        self._sizes: dict[tuple[int, int], int] = {}  # (address, pooled memory id) -> bytes

    def malloc_postprocess(self, device_id=0, size=0, mem_size=0, mem_ptr=0, pmem_id=0,
                           **kwargs) -> None:
        if device_id != self.device_id or size <= 0 or not mem_ptr:
            return
        size = rounded(size)
        self._sizes[mem_ptr, pmem_id] = size
        self.now += size
        if self.now > self.peak:
            self.peak = self.now
        if self.now > self._since_mark:
            self._since_mark = self.now

    def free_preprocess(self, device_id=0, mem_size=0, mem_ptr=0, pmem_id=0, **kwargs) -> None:
        if device_id == self.device_id:
            self.now -= self._sizes.pop((mem_ptr, pmem_id), 0)

    def mark(self) -> int:
        """The peak since the last mark (or the start); the next interval starts at ``now``."""
        peak, self._since_mark = self._since_mark, self.now
        return peak
