"""The pool and its engine on host memory: pgmo run, measured and tested without a GPU.

:func:`host_pool` builds a :class:`~pgmo.pool.ProfileGuidedMemoryPool` whose
arena and fallback are real host memory, so pointers are real addresses that
tests can write to; :func:`host_engine` builds the same engine without CuPy
at all (its blocks are plain memory objects).  The device they run on is
:class:`~pgmo.device.host_memory.HostMemory`.  ``pgmo demo``, the footprint
measurement and the tests use them; ``pgmo.testing`` re-exports them.
Tested in ``tests/test_replay.py``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from ..device.host_async_pool import HostAsyncPool
from ..device.host_memory import DRIVER_PAGE, HostMemory
from ..device.host_stock_pool import HostStockPool

if TYPE_CHECKING:
    from ..engine import Backend, Engine
    from ..engine.options import StockPool
    from ..pool import ProfileGuidedMemoryPool

__all__ = ["HostFallback", "host_pool", "host_engine", "host_backend", "device_sources",
           "TEST_DEFAULTS"]

#: What the host backends use unless told otherwise: plans made at the
#: boundary (deterministic) by the fast paper's best-fit, and no plan cache (a run
#: on host memory is the same run every time: ``plan_cache=True`` to keep plans
#: between runs, see :mod:`pgmo.plan_cache`).  The pool's own defaults
#: (``replan="background", method="best"``, the plan cache on) and every other
#: mode are covered by ``tests/test_pool_properties.py`` and ``tests/test_plan_cache.py``.
TEST_DEFAULTS = {"replan": "sync", "method": "bestfit", "plan_cache": False}


#: The stock pool the host backends fall back on (the name scripts use).
HostFallback = HostStockPool


def _cupy_out_of_memory() -> type[MemoryError]:
    from cupy.cuda.memory import OutOfMemoryError

    return OutOfMemoryError


def device_sources(memory: HostMemory, vmm: bool = True, stream_pool: bool = True,
                   pool_chunk: int | None = None) -> dict:
    """The host analogues of the device layer, as :class:`~pgmo.engine.Backend` fields:
    ``reserve`` (virtual memory: :class:`~pgmo.device.host_range.HostRange`) unless ``vmm`` is
    false, ``heap`` (the driver's stream-ordered pool:
    :class:`~pgmo.device.host_async_pool.HostAsyncPool`) unless ``stream_pool`` is false, and the
    device's size.  ``pool_chunk``: the step in which the driver's pool grows and trims
    (None: one page; :data:`~pgmo.device.host_async_pool.DRIVER_POOL_CHUNK`: 32 MiB, as documented).
    Which heap the pool uses is its ``heap`` option (the page heap by default)."""
    reasons = {}
    if not vmm:
        reasons["arena"] = "the device has no virtual memory management"
    if not stream_pool:
        reasons["heap"] = "the device has no stream-ordered memory pools"
    return {"reserve": memory.reserve if vmm else None,
            "heap": (lambda: HostAsyncPool(memory, chunk=pool_chunk))
            if stream_pool else None,
            "device_memory": memory.capacity or 0, "reasons": reasons}


def host_backend(capacity: int | None = None, cupy_objects: bool = False, *, vmm: bool = True,
                 stream_pool: bool = True, page: int | None = DRIVER_PAGE,
                 pool_chunk: int | None = None) -> Backend:
    """A :class:`~pgmo.engine.Backend` on host memory of ``capacity`` bytes (None: unbounded).

    With ``cupy_objects`` the blocks are CuPy ``UnownedMemory`` / ``MemoryPointer``
    objects, as the pool hands out; otherwise plain memory objects (no CuPy needed).
    ``vmm``/``stream_pool``: whether the device has virtual memory management and
    stream-ordered pools (both, as an H100 does, by default); ``page``: the driver's page;
    ``pool_chunk``: the stream-ordered pool's step (see :func:`device_sources`).
    """
    from ..engine import Backend

    memory = HostMemory(capacity, page)
    sources = device_sources(memory, vmm, stream_pool, pool_chunk=pool_chunk)
    # (casts: the host pool's blocks declare ptr and size in __slots__ only, unseen by mypy)
    if not cupy_objects:
        return Backend(allocate=memory, fallback=cast("StockPool", HostStockPool(memory)),
                       **sources)
    from cupy.cuda.memory import MemoryPointer, UnownedMemory

    oom = _cupy_out_of_memory()
    return Backend(allocate=memory, fallback=cast("StockPool", HostStockPool(memory, oom)),
                   memory_type=UnownedMemory,
                   pointer_type=MemoryPointer, oom_error=oom, **sources)


def host_engine(capacity: int | None = None, *, vmm: bool = True, stream_pool: bool = True,
                page: int | None = DRIVER_PAGE, pool_chunk: int | None = None,
                hot_path: type | None = None, **options: Any) -> Engine:
    """A pgmo :class:`~pgmo.engine.Engine` on host memory, without CuPy.

    Keywords are pool options (``warmup``, ``replan``, ``method``...);
    :data:`TEST_DEFAULTS` apply unless given.  ``vmm``/``stream_pool``/``pool_chunk``: see
    :func:`host_backend`; ``hot_path``: a :class:`~pgmo.engine.handout.HotPath` class
    (the plain-Python one is ``pgmo.engine.reference_handout().HotPath``; default: the
    engine's own choice).
    """
    from ..engine import Engine, pool_options

    backend = host_backend(capacity, vmm=vmm, stream_pool=stream_pool, page=page,
                           pool_chunk=pool_chunk)
    engine = Engine(backend, pool_options(**{**TEST_DEFAULTS, **options}), hot_path=hot_path)
    memory = backend.allocate
    assert isinstance(memory, HostMemory)  # host_backend's
    # what replay() reads (through getattr: an engine has no such fields of its own)
    setattr(engine, "host_memory", True)  # noqa: B010
    setattr(engine, "host_device", memory)  # noqa: B010
    _watch_raw(memory, engine)
    return engine


def _watch_raw(memory: HostMemory, engine: Engine) -> None:
    from ..engine.memory import RawListener

    listener = RawListener()
    listener.connect(engine.memory)
    memory.on_allocate = listener


def host_pool(capacity: int | None = None, *, vmm: bool = True, stream_pool: bool = True,
              page: int | None = DRIVER_PAGE,
              pool_chunk: int | None = None, **options: Any) -> ProfileGuidedMemoryPool:
    """A :class:`~pgmo.pool.ProfileGuidedMemoryPool` on host memory (needs CuPy, no GPU).

    ``capacity`` plays the device's memory size (None: unbounded); ``vmm`` and
    ``stream_pool`` say whether the device has virtual memory management and
    stream-ordered pools (both by default, as an H100); ``page`` is the driver's
    page and mapping granule (2 MiB; a small one, 512, makes byte counts exact
    for tests that check them); ``pool_chunk``: the model of the driver's pool (see
    :func:`device_sources`); other keywords go to the
    pool (``warmup``, ``replan``, ``method``, ``plan_path``...);
    :data:`TEST_DEFAULTS` apply unless given (pass ``replan="background",
    method="best"`` for the pool's own defaults).
    """
    from ..pool import ProfileGuidedMemoryPool

    memory = HostMemory(capacity, page)
    stock = cast("StockPool", HostStockPool(memory, _cupy_out_of_memory()))  # see host_backend
    pool = ProfileGuidedMemoryPool(memory, fallback=stock,
                                   device_id=0,
                                   context=None, total_memory=capacity or 2 ** 40,
                                   device_layer=device_sources(memory, vmm, stream_pool,
                                                               pool_chunk),
                                   **{**TEST_DEFAULTS, **options})
    pool.host_memory = True
    pool.host_device = memory
    _watch_raw(memory, pool.engine)
    return pool
