"""The engine's test bench: pure-Python memory sources and a ledger of live blocks.

No CuPy here: the engine runs on fake sources whose addresses never repeat,
so any overlap can only come from the plan.  ``hot_path`` (a fixture: import
it into a test module) runs a test against both hot paths, the compiled one
(when built) and the plain-Python reference.  Used by ``test_engine_*.py``.
"""

from __future__ import annotations

import pytest

from pgmo.engine import Backend, Engine, pool_options, reference_handout
from pgmo.engine import handout as compiled_handout
from pgmo.units import round_size

ARENA_BASE = 1 << 40


FALLBACK_BASE = 1 << 50


HOT_PATHS = ["reference"] + (["compiled"] if compiled_handout.COMPILED else [])


@pytest.fixture(params=HOT_PATHS)
def hot_path(request):
    return reference_handout().HotPath if request.param == "reference" \
        else compiled_handout.HotPath


class FakeBuffer:
    def __init__(self, ptr, size, log):
        self.ptr, self.size, self._log = ptr, size, log

    def __del__(self):
        self._log.append(("arena freed", self.ptr, self.size))


class FakeArenaAllocator:
    """The raw allocator (arenas and blocks of their own): non-overlapping fake addresses.

    Records allocations and frees; refuses sizes above ``fail_above``.
    """

    def __init__(self, fail_above=None):
        self.next = ARENA_BASE
        self.log = []
        self.fail_above = fail_above

    def __call__(self, size):
        if self.fail_above is not None and size > self.fail_above:
            raise MemoryError("no memory for the arena")
        ptr = self.next
        self.next += size + (1 << 20)
        self.log.append(("arena", ptr, size))
        return FakeBuffer(ptr, size, self.log)

    def taken(self):
        return [x for x in self.log if x[0] == "arena"]


class FakeBlock:
    def __init__(self, pool, ptr, size):
        self.ptr, self.size, self._pool = ptr, size, pool

    def __del__(self):
        self._pool.used -= self.size
        self._pool.free += self.size


class FakeFallback:
    """A fallback that never reuses addresses: overlaps can only come from the arena."""

    def __init__(self):
        self.next = FALLBACK_BASE
        self.used = self.free = 0
        self.limit = 0
        self.calls = 0

    def malloc(self, size):
        rs = round_size(size)
        self.calls += 1
        ptr = self.next
        self.next += rs
        self.used += rs
        return FakeBlock(self, ptr, rs)

    def used_bytes(self):
        return self.used

    def free_bytes(self):
        return self.free

    def total_bytes(self):
        return self.used + self.free

    def n_free_blocks(self):
        return 1 if self.free else 0

    def free_all_blocks(self):
        self.free = 0

    def set_limit(self, size=None):
        self.limit = size


class Ptr:
    """What the user holds; keeps its memory object alive like CuPy's pointer."""

    __slots__ = ("ptr", "size", "mem")

    def __init__(self, mem, offset):
        self.ptr, self.size, self.mem = mem.ptr + offset, mem.size, mem

    @property
    def in_stock(self):
        return self.ptr >= FALLBACK_BASE


class Checked:
    """Engine plus a ledger asserting that live blocks never share an address."""

    def __init__(self, hot_path, arena_fail=False, context=None, **options):
        self.arena_alloc = FakeArenaAllocator(4096 if arena_fail else None)
        self.fallback = FakeFallback()
        options.setdefault("method", "bestfit")
        options.setdefault("replan", "sync")
        backend = Backend(self.arena_alloc, self.fallback, pointer_type=Ptr, context=context)
        self.engine = Engine(backend, pool_options(**options), hot_path=hot_path)
        self.live = {}
        self.arena_ptrs = set()

    def malloc(self, size):
        p = self.engine.malloc(size)
        for other in self.live.values():
            assert not (p.ptr < other.ptr + other.size and other.ptr < p.ptr + p.size), \
                "the engine handed out an address in use"
        self.live[id(p)] = p
        return p

    def free(self, p):
        del self.live[id(p)]

    def in_plan(self, p):
        """Whether ``p`` was carved from the current arena (not memory of its own)."""
        arena = self.engine.hot.arena
        return arena is not None and arena.ptr <= p.ptr < arena.ptr + arena.size

    def arenas_taken(self):
        """The raw allocations that became arenas, in order."""
        return [x for x in self.arena_alloc.taken() if x[1] in self.arena_ptrs]

    def note_arena(self):
        arena = self.engine.hot.arena
        if arena is not None:
            self.arena_ptrs.add(arena.ptr)

    def run(self, ops):
        """Run ops: an int allocates that many bytes, ('f', k) frees the k-th block."""
        blocks = []
        for op in ops:
            if isinstance(op, int):
                blocks.append(self.malloc(op))
            else:
                p = blocks[op[1]]
                blocks[op[1]] = None
                self.free(p)
                del p
        return blocks

    def iteration(self, ops):
        e = self.engine
        e.begin_iteration()
        self.note_arena()
        blocks = self.run(ops)
        e.end_iteration()
        self.note_arena()
        return blocks


HOT = [1000, 2000, ("f", 0), 3000, ("f", 1), 500, ("f", 2), ("f", 3)]
