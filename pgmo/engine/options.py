"""What an engine is built from: its memory sources, and how it should behave.

Two small records instead of a long constructor: :class:`Backend` says where
memory comes from (CuPy's allocator and stock pool in
:class:`~pgmo.pool.ProfileGuidedMemoryPool`, host memory in
:mod:`pgmo.testing`); :class:`PoolOptions` holds the user's choices, with the
solver's own :class:`~pgmo.solver.options.SolverOptions` inside.

Tested in ``tests/test_engine_errors.py`` and ``tests/test_pool.py``.
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol, Sequence, runtime_checkable

from ..errors import out_of_memory as default_oom  # the error of a full pool without CuPy
from ..solver.options import SolverOptions, solver_options
from .planner import REPLAN_MODES

#: The heaps a pool may use for memory of a block's own (the ``heap`` option).
HEAPS = ("own", "driver", "pages")

__all__ = ["HEAPS", "Backend", "PoolOptions", "PlainMemory", "pool_options", "Buffer", "StockPool",
           "Reservation", "ReservedRange", "PageRange", "StreamHeap"]


class Buffer(Protocol):
    """Memory that is its holder's until dropped: a cudaMalloc, a pool's block."""

    @property
    def ptr(self) -> int: ...

    @property
    def size(self) -> int: ...


class StockPool(Protocol):
    """CuPy's stock pool (``cupy.cuda.MemoryPool``), as the engine uses it."""

    def malloc(self, size: int) -> Buffer: ...

    def used_bytes(self) -> int: ...

    def free_bytes(self) -> int: ...

    def total_bytes(self) -> int: ...

    def n_free_blocks(self) -> int: ...

    def free_all_blocks(self) -> None: ...

    def set_limit(self, size: int | None = None) -> None: ...

    def get_limit(self) -> int: ...


class Reservation(Protocol):
    """Reserved virtual address space of ``size`` bytes at ``ptr``, mapped in granules (CUDA's
    virtual memory management: :class:`pgmo.device.cuda.CudaRange`,
    :class:`pgmo.device.host_range.HostRange`)."""

    @property
    def ptr(self) -> int: ...

    @property
    def size(self) -> int: ...

    @property
    def granule(self) -> int: ...

    def synchronize(self) -> None: ...

    def close(self) -> None: ...


class ReservedRange(Reservation, Protocol):
    """A reservation mapped in runs of granules from its start (the arena, the own heap)."""

    @property
    def mapped(self) -> int: ...

    def map(self, offset: int, nbytes: int, piece: int | None = None) -> None: ...

    def unmap(self, offset: int, nbytes: int) -> None: ...

    def mappings(self) -> list[tuple[int, int]]: ...

    def usable_end(self, start: int = 0) -> int: ...


@runtime_checkable
class PageRange(Reservation, Protocol):
    """A reservation whose granules map physical pages of their own, one handle at several
    addresses if asked (the page heap)."""

    @property
    def pages_held(self) -> int: ...

    def create_page(self) -> Any: ...

    def map_page(self, offset: int, handle: Any) -> None: ...

    def map_pages(self, offset: int, handles: Sequence[Any]) -> None: ...

    def unmap_page(self, offset: int) -> None: ...

    def unmap_pages(self, offset: int, count: int) -> None: ...

    def release_page(self, handle: Any) -> None: ...

    def page_at(self, offset: int) -> Any: ...

    def starts_in(self, lo: int, hi: int) -> bool: ...

    def usable_end(self, start: int = 0) -> int: ...


class StreamHeap(Protocol):
    """A private stream-ordered pool (cudaMallocFromPoolAsync / cudaFreeAsync): a block's
    death frees it without a device sync; ``trim()`` gives wholly free granules back."""

    @property
    def held(self) -> int: ...

    @property
    def used(self) -> int: ...

    def malloc(self, size: int) -> Buffer: ...

    def trim(self) -> object: ...

    def synchronize(self) -> None: ...


class PlainMemory:
    """Stand-in for CuPy's ``UnownedMemory`` when the engine runs without CuPy."""

    __slots__ = ("ptr", "size", "owner", "device_id")

    def __init__(self, ptr: int, size: int, owner: object, device_id: int):
        self.ptr, self.size, self.owner, self.device_id = ptr, size, owner, device_id


def bare_pointer(memory: Any, offset: int) -> Any:
    """Without CuPy, the user gets the memory object itself."""
    return memory


@dataclass(frozen=True)
class Backend:
    """Where memory comes from (:mod:`.memory` decides what is taken from which).

    ``allocate(nbytes)`` (cudaMalloc in the pool) returns an object with
    ``.ptr`` owning raw memory until dropped, or raises MemoryError: arenas,
    blocks of their own and survivors' buffers come from it.  ``fallback`` is
    CuPy's stock pool (for what lies outside every plan): ``malloc(size)``
    returns an object with ``.ptr`` owning the block until dropped, plus
    ``used_bytes``, ``free_bytes``, ``total_bytes``, ``n_free_blocks``,
    ``free_all_blocks`` and ``set_limit(size=)``.
    ``memory_type(ptr, size, owner, device_id)`` builds a handed-out memory
    object (CuPy's ``UnownedMemory``) and ``pointer_type(memory, 0)`` what the
    user gets (CuPy's ``MemoryPointer``).  ``context()`` names the
    device/stream of a request (None: not checked): the plan covers one.
    ``device()`` is the current device (None: not checked): the pool's own
    memory is device ``device_id``'s only, so a request made under another
    device goes to ``fallback`` (CuPy's pool serves the current device).

    ``reserve(nbytes)`` reserves a virtual address range (CUDA's virtual
    memory management; an object with ``ptr``, ``size``, ``granule``,
    ``mapped``, ``map(offset, nbytes)``, ``unmap(offset, nbytes)``,
    ``mappings()``, ``usable_end()``, ``synchronize()``, ``close()``, and
    optionally ``starts_in(lo, hi)``), or is None where the
    device or the bindings lack it: the arena is then one cudaMalloc.
    ``heap()`` makes a private stream-ordered pool (``malloc(nbytes)`` whose
    block's death frees it without a device sync, ``trim()``,
    ``synchronize()``, ``held``, ``used``), or is None: a cudaMalloc per
    request.  ``device_memory`` is the device's size (what a reservation
    spans); ``reasons``: why ``reserve`` or ``heap`` is None (``"arena"`` /
    ``"heap"`` -> why), reported in ``stats().device_reasons``.
    """

    allocate: Callable[[int], Buffer]
    fallback: StockPool
    memory_type: Callable[[int, int, Any, int], Any] = PlainMemory
    pointer_type: Callable[[Any, int], Any] = bare_pointer
    device_id: int = 0
    context: Callable[[], object] | None = None
    device: Callable[[], int] | None = None
    oom_error: Callable[[int, int, int], BaseException] = default_oom
    reserve: Callable[[int | None], ReservedRange] | None = None
    heap: Callable[[], StreamHeap] | None = None
    device_memory: int = 0
    reasons: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class PoolOptions:
    """How the pool behaves; every field is also a keyword of the pool's constructor."""

    # iterations before the profiled one, each request in memory of its own (the
    # stream-ordered heap where the device has one, see engine/memory.py)
    warmup: int = 1
    replan: str = "background"  # where plans are computed: background, sync or bestfit
    detect_iterations: bool = True  # find iterations when the user marks none
    warn_after: int = 10_000  # requests without iterations before one warning
    shape_plans: bool = True  # a recurring iteration shape gets its own plan (see .shapes)
    # where memory of a block's own comes from: "pages" (fresh addresses per request over
    # recycled pages: it holds only the pages with live bytes), "own" (a heap of pgmo's own
    # in reserved address space, page by page, at fixed addresses) or "driver" (the driver's
    # stream-ordered pool, which grows and trims in 32 MiB steps); see engine/memory.py,
    # engine/own_heap.py and engine/page_heap.py
    heap: str = "pages"
    # keep each plan in the user's cache folder and start a later run on it, warm-up
    # included (see pgmo.plan_cache); off where the pool is given a plan_path
    plan_cache: bool = True
    solver: SolverOptions = field(default_factory=SolverOptions)

    def __post_init__(self) -> None:
        if isinstance(self.warmup, bool) or not isinstance(self.warmup, int) or self.warmup < 0:
            raise ValueError(f"warmup must be an integer >= 0, got {self.warmup!r}")
        if self.replan not in REPLAN_MODES:  # the one check (the planner trusts it)
            raise ValueError(f"unknown replan mode {self.replan!r}; choose one of "
                             f"{', '.join(REPLAN_MODES)}")
        if self.heap not in HEAPS:
            raise ValueError(f"unknown heap {self.heap!r}; choose one of {', '.join(HEAPS)}")
        if self.warn_after < 1:
            raise ValueError(f"warn_after must be >= 1, got {self.warn_after!r}")


def pool_options(options: PoolOptions | None = None, **changes: Any) -> PoolOptions:
    """``options`` with ``changes``, which may name pool or solver fields."""
    base = options if options is not None else PoolOptions()
    own = {f.name for f in dataclasses.fields(PoolOptions)} - {"solver"}
    theirs = {f.name for f in dataclasses.fields(SolverOptions)}
    unknown = sorted(set(changes) - own - theirs)
    if unknown:
        guess = difflib.get_close_matches(unknown[0], sorted(own | theirs), n=1, cutoff=0.6)
        meant = f" (did you mean {guess[0]!r}?)" if guess else ""
        raise TypeError(f"unknown option {unknown[0]!r}{meant}; the pool's options are "
                        f"{', '.join(sorted(own))} and the solver's {', '.join(sorted(theirs))}")
    mine = {k: v for k, v in changes.items() if k in own}
    solver = solver_options(base.solver, **{k: v for k, v in changes.items() if k in theirs})
    return dataclasses.replace(base, solver=solver, **mine)
