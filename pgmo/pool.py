"""ProfileGuidedMemoryPool: the CuPy face of pgmo's engine.

Usage::

    pool = pgmo.ProfileGuidedMemoryPool()
    with pool:                          # cupy.cuda.set_allocator(pool.malloc), undone on exit
        for batch in data:
            with pool.iteration():      # request numbering restarts at each iteration
                train_step(batch)

The first ``warmup`` iterations (weights and optimizer state are created
there) and the profiled one give each request memory of its own (so the
pool holds the live bytes, no cache); from then on request ``i`` gets its
own memory object at ``arena + offset[i]``.  Without
``pool.iteration()`` the pool looks for a repeating loop itself.  All the
logic lives in :mod:`pgmo.engine`, which imports no CuPy; this module adds
CuPy's conventions: memory hooks, limits, byte counters,
``OutOfMemoryError``, installation as CuPy's allocator, and saved plans.
"""

from __future__ import annotations

import enum
import logging
import os
import weakref
from typing import Any, Callable

import cupy
from cupy.cuda import memory as _memory
from cupy.cuda.memory import MemoryPointer, UnownedMemory

from .engine import Backend, Engine, PoolOptions, pool_options
from .engine.core import InterruptedScope, IterationScope
from .engine.frees import STOCK
from .engine.memory import RawListener
from .engine.options import StockPool
from .engine.schedule import Schedule
from .errors import NoGPUError, PlanError, PlanFileError
from . import plan_cache
from .formats import planfile
from .pool_plans import PlanKeeper, cache_key
from .hooks import FreeReport, call_hooks, hooks_active, thread_hooks
from .plan import Plan
from .stats import PoolStats
from .trace import Trace
from .units import round_size

__all__ = ["ProfileGuidedMemoryPool", "PlanFileError", "cuda_context"]

log = logging.getLogger("pgmo.pool")

class _Default(enum.Enum):
    AUTO = "auto"  # a keyword's default that None cannot stand for (None: no context)


_AUTO = _Default.AUTO
_CUDA_ERROR_MEMORY_ALLOCATION = 2  # cudaErrorMemoryAllocation (not exported to Python)


def cuda_context(get_device: Callable[[], int] | None = None,
                 get_stream: Callable[[int], Any] | None = None) -> Callable[[], tuple[int, int]]:
    """What names a request's device and stream (the plan covers one of each), per request.

    One CUDA runtime call, ``cudaGetDevice``, as CuPy's own pool makes per
    malloc; the stream is then looked up for that device, which costs no
    call (``get_current_stream()`` without a device would ask for it
    again).  The lookups are bound once, here; tests pass counting stand-ins.
    """
    get_device = get_device or cupy.cuda.runtime.getDevice
    get_stream = get_stream or cupy.cuda.get_current_stream

    def context() -> tuple[int, int]:
        device = get_device()
        return device, get_stream(device).ptr

    return context


def _raw_allocator(allocator: Callable[[int], Any], device_id: int) -> Callable[[int], Any]:
    """Arena allocations: reported to alloc hooks; cudaMalloc failures become MemoryError."""
    from cupy_backends.cuda.api.runtime import CUDARuntimeError

    def allocate(size: int) -> Any:
        try:
            return allocator(size)
        except CUDARuntimeError as e:
            if e.status == _CUDA_ERROR_MEMORY_ALLOCATION:
                raise MemoryError(str(e)) from e
            raise

    def allocate_hooked(size: int) -> Any:
        if not hooks_active():
            return allocate(size)
        return call_hooks("alloc", {"device_id": device_id, "mem_size": size},
                          lambda: allocate(size),
                          lambda buffer: {"mem_ptr": buffer.ptr if buffer is not None else 0})

    return allocate_hooked


def _require_gpu() -> None:
    """Raise :class:`~pgmo.errors.NoGPUError` unless CuPy sees a GPU it can use."""
    from cupy_backends.cuda.api.runtime import CUDARuntimeError

    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except CUDARuntimeError as exc:  # no driver, an old one, no device: CuPy says which
        raise _no_gpu(str(exc)) from None  # one error; CuPy's is its __context__
    if not count:
        raise _no_gpu("no CUDA device")


def _no_gpu(why: str) -> NoGPUError:
    return NoGPUError(f"ProfileGuidedMemoryPool needs a GPU that CuPy can use, and CuPy sees "
                      f"none ({why}); without a GPU, pgmo.testing.host_pool() runs the same "
                      f"pool on host memory")


def _counting(allocator: Callable[[int], Any],
              listener: Callable[[], None]) -> Callable[[int], Any]:
    """The stock pool's raw allocator, telling pgmo when the memory held grows."""
    def allocate(size: int) -> Any:
        memptr = allocator(size)
        listener()
        return memptr

    return allocate


class ProfileGuidedMemoryPool(_memory.MemoryPool):
    """A CuPy memory pool that answers a hot loop's requests from a solved plan.

    ``allocator``
        raw allocator (``size -> MemoryPointer``) for the arena,
        blocks of their own and survivors' buffers, and, when
        ``fallback`` is None, for the stock pool; CuPy's cudaMalloc by
        default.
    ``fallback``
        the pool serving what lies outside every plan (interrupted,
        other threads or streams; between iterations too where the
        device has no stream-ordered pool); a
        ``cupy.cuda.MemoryPool(allocator)`` by default.  Anything with
        ``malloc``, ``used_bytes``, ``free_bytes``, ``total_bytes``,
        ``n_free_blocks``, ``free_all_blocks`` and ``set_limit(size=)``.
    ``options``
        a :class:`~pgmo.engine.PoolOptions`; keywords change its
        fields or those of its :class:`~pgmo.SolverOptions`:
        ``warmup=1``, ``replan="background"`` (or ``"sync"``,
        ``"bestfit"``), ``detect_iterations=True``, ``warn_after``,
        ``heap="pages"`` (what no plan covers gets fresh addresses over
        recycled pages, see ``docs/footprint.md``; or ``"own"``: pgmo's
        heap at fixed addresses; or ``"driver"``: the driver's
        stream-ordered pool), ``method="best"``,
        ``time_limit``, ``seed``, ``budget``...
    ``plan_path``
        load a saved plan from here when the file exists (a bad
        file is logged and ignored) and save every new plan there (its
        folders are made as needed; a folder, or a path under a file,
        is refused with ``ValueError``); the plan cache is then not used.
    ``plan_cache``
        (an option, True by default) keep every plan in the user's
        cache folder (:mod:`pgmo.plan_cache`: ``$PGMO_CACHE_DIR``, else
        the platform's) and start a later run of the same workload on
        the same device on it, its warm-up iteration included; a
        cached plan is checked request by request, and one that does
        not hold (its warm-up departs, or its first steady iteration
        departs needing far more or less than its arena) is replaced by a
        fresh profile.
    ``device_id``, ``context``, ``total_memory``
        for non-CUDA backends
        (:func:`pgmo.measure.hosts.host_pool`); by default the current device,
        its current stream, and its memory size.
    ``device_layer``
        the arena's reserved range and the stream-ordered heap
        (:class:`~pgmo.engine.Backend`'s ``reserve``, ``heap``,
        ``device_memory`` and ``reasons``); by default what the device
        supports and its driver accepts
        (:func:`pgmo.device.cuda.device_layer`) when ``allocator`` is
        None, else cudaMalloc through ``allocator`` for both.  Why a
        part uses cudaMalloc is in ``stats().device_reasons``.
    """

    def __init__(self, allocator: Callable[[int], Any] | None = None, *,
                 fallback: StockPool | None = None, options: PoolOptions | None = None,
                 plan_path: str | os.PathLike | None = None, device_id: int | None = None,
                 context: Callable[[], object] | None | _Default = _AUTO,
                 total_memory: int | None = None, device_layer: dict[str, Any] | None = None,
                 **changes: Any):
        if allocator is None or device_id is None:  # on the current CUDA device
            _require_gpu()
        super().__init__(allocator)
        raw = allocator if allocator is not None else _memory._malloc
        # CuPy's own pools call memory hooks themselves; pgmo reports the rest.
        self._fallback_reports_hooks = fallback is None or isinstance(
            fallback, (_memory.MemoryPool, _memory.SingleDeviceMemoryPool))
        raw_listener = None
        if fallback is None:
            raw_listener = RawListener()
            fallback = _memory.MemoryPool(_counting(raw, raw_listener))
        if device_id is None:
            device_id = cupy.cuda.device.get_device_id()
        self._device_id = device_id = int(device_id)
        self._total_memory = total_memory
        self.host_memory = False  # True when pointers are host addresses (testing)
        self._plan_path = _plan_path_checked(plan_path) if plan_path is not None else None
        if device_layer is None:
            if allocator is None:
                from .device.cuda import device_layer as supported

                device_layer, _ = supported(device_id, self._device_memory())
            else:
                device_layer = {"reasons": {"arena": "a raw allocator was given",
                                            "heap": "a raw allocator was given"}}
        device_layer = dict(device_layer)
        self.device_layer_reasons = dict(device_layer.pop("reasons", {}))
        backend = Backend(allocate=_raw_allocator(raw, device_id), fallback=fallback,
                          memory_type=UnownedMemory, pointer_type=MemoryPointer,
                          device_id=device_id,
                          context=cuda_context() if context is _AUTO else context,
                          device=cupy.cuda.runtime.getDevice if context is _AUTO else None,
                          oom_error=_memory.OutOfMemoryError,
                          reasons=self.device_layer_reasons, **device_layer)
        self._engine = engine = Engine(backend, pool_options(options, **changes))
        if raw_listener is not None:
            raw_listener.connect(engine.memory)
        # The engine reaches the pool through a weak reference only, so dropping
        # the pool frees it (and its arena) without waiting for the GC.
        ref = weakref.ref(self)
        engine.report_to_hooks(thread_hooks,
                               lambda size: _call_if_alive(ref, "_malloc_with_hooks", size))
        engine.on_install = lambda schedule: _call_if_alive(ref, "_plan_installed", schedule)
        # CuPy calls pool.malloc for every allocation: let it reach the hot path
        # directly (this instance attribute shadows the method below).
        setattr(self, "malloc", engine.malloc)  # noqa: B010
        self._previous_allocators: list[Any] = []
        self.set_limit(**_memory._parse_limit_string())
        cache = None
        if self._plan_path is None and engine.options.plan_cache:
            cache = plan_cache.attach(engine, cache_key(allocator, device_id,
                                                        self._device_memory()))
        self._keeper = PlanKeeper(self._plan_path, cache)
        if self._plan_path is not None and os.path.exists(self._plan_path):
            try:
                self.load(self._plan_path)
            except PlanFileError as e:
                log.warning("ignoring saved plan, profiling instead: %s", e)

    # ------------------------------------------------------------- allocation
    def malloc(self, size: int) -> MemoryPointer:
        """Allocate ``size`` bytes; what ``cupy.cuda.set_allocator(pool.malloc)`` calls.

        (Instances answer with the engine's hot path directly, for speed.)
        """
        return self._engine.malloc(size)

    def _malloc_with_hooks(self, size: Any) -> MemoryPointer:
        """Serve one request while memory hooks are registered, reporting pgmo's own blocks.

        Blocks from CuPy's stock pool are reported by that pool already.
        pgmo's blocks (the arena's, its own allocations, survivors' buffers)
        cannot fail once handed out, so their malloc hooks run right after the
        hand-out, and their free hooks when they are freed.
        """
        memptr = self._engine.serve_unhooked(size)  # raises CuPy's errors for bad sizes
        release = memptr.mem._owner  # None for a null (size 0) pointer
        if release is not None and release.source == STOCK and self._fallback_reports_hooks:
            return memptr
        device_id, rounded = self._device_id, round_size(size)
        mem_ptr, pmem_id = memptr.ptr, id(memptr.mem)
        call_hooks("malloc", {"device_id": device_id, "size": size, "mem_size": rounded},
                   lambda: memptr, lambda m: {"mem_ptr": mem_ptr if m is not None else 0,
                                              "pmem_id": pmem_id if m is not None else 0})
        if release is not None:  # as in CuPy, a null pointer's end is not reported
            release.on_free = FreeReport(device_id, rounded, mem_ptr, pmem_id)
        return memptr

    # ------------------------------------------------------------- iterations
    def iteration(self) -> IterationScope:
        """One hot iteration (``with pool.iteration():``): request numbering restarts at its
        start.  An exception inside discards it as a profile; whatever is raised (a Ctrl-C
        included), the iteration is closed on the way out."""
        return self._engine.iteration(self)

    def begin_iteration(self) -> None:
        """Start one hot iteration (what :meth:`iteration` does on entry): request
        numbering restarts at 0.  A ``RuntimeError`` inside an iteration (naming both
        threads when another thread's iteration is open: an iteration is its thread's)."""
        self._engine.begin_iteration()

    def end_iteration(self) -> None:
        """Close the iteration begun by :meth:`begin_iteration`: it is profiled, served
        by its plan or re-planned, as :attr:`mode` says.  A ``RuntimeError`` outside
        one, or on another thread than the one that began it (the iteration goes on)."""
        self._engine.end_iteration()

    def interrupt(self) -> None:
        """Serve from the stock pool, outside the plan, until :meth:`resume`."""
        self._engine.interrupt()

    def resume(self) -> None:
        """Undo one :meth:`interrupt`: back to the plan (or to profiling) once every
        interrupt is resumed.  A ``RuntimeError`` without an interrupt."""
        self._engine.resume()

    def interrupted(self) -> InterruptedScope:
        """``interrupt()`` ... ``resume()`` as a ``with`` block: requests inside are served
        by CuPy's stock pool, outside the plan (an evaluation, a checkpoint, a log step
        inside the training loop); they are neither profiled nor counted against the
        plan, and the plan answers again after the block, whatever is raised.  Blocks may
        nest; inside an iteration its request numbering pauses.  Counted in
        ``stats().interrupted_requests`` (between iterations: ``outside_requests``)."""
        return self._engine.interrupted(self)

    def optimize(self) -> Plan:
        """Solve the current profile now; the plan answers from the next iteration."""
        return self._engine.optimize()

    @property
    def mode(self) -> str:
        """``warmup``, ``profiling``, ``planning``, ``optimized`` or ``fallback``."""
        return self._engine.mode

    @property
    def profile(self) -> Trace | None:
        """The profiled iteration (one block per request, in request order) that the
        latest plan was made for; None before the first plan."""
        return self._engine.profile

    @property
    def plan(self) -> Plan | None:
        """The latest plan (offsets per request, peak, method); None before the first."""
        return self._engine.plan

    @property
    def engine(self) -> Engine:
        """The CuPy-free engine behind this pool (tests and benchmarks reach in here)."""
        return self._engine

    def stats(self) -> PoolStats:
        """Every counter (see :mod:`pgmo.stats` for the names beside CuPy's and PyTorch's)."""
        return self._engine.stats()

    def memory_summary(self) -> str:
        """A table for a person: modes, bytes now and at peak, the plan, the requests, and why
        a part of the device layer uses cudaMalloc where it does (``stats().device_reasons``)."""
        return self._engine.stats().summary()

    def reset_peak_stats(self) -> None:
        """Peaks start again from what is in use and held now."""
        self._engine.reset_peak_stats()

    def close(self) -> None:
        """Stop the background solver now (it also stops when the pool is collected)."""
        self._engine.close()

    # ------------------------------------------------------ CuPy pool methods
    def used_bytes(self) -> int:
        """Bytes handed out and not yet freed, as CuPy's ``MemoryPool.used_bytes()``."""
        return self._engine.used_bytes()

    def free_bytes(self) -> int:
        """Bytes held but idle (``total_bytes() - used_bytes()``), as CuPy's."""
        return self._engine.free_bytes()

    def total_bytes(self) -> int:
        """Every byte the pool holds from the device, as CuPy's ``total_bytes()``."""
        return self._engine.total_bytes()

    def n_free_blocks(self) -> int:
        """Idle blocks held (free gaps in the arena, idle buffers, the stock pool's cached
        blocks), as CuPy's ``n_free_blocks()``."""
        return self._engine.n_free_blocks()

    def free_all_blocks(self, stream: Any = None) -> None:
        """Give back every idle byte: the stock pool's cache, survivors' idle buffers (and
        the arena, between iterations; the plan stays)."""
        self._engine.free_all_blocks()

    def free_all_free(self) -> None:
        """CuPy's old name of :meth:`free_all_blocks`."""
        self.free_all_blocks()

    def set_limit(self, size: float | None = None, fraction: float | None = None) -> None:
        """Cap ``total_bytes`` (every source), with CuPy's arguments and errors."""
        if size is None:
            if fraction is None:
                size = 0
            else:
                if not 0 <= fraction <= 1:
                    raise ValueError(f"memory limit fraction out of range: {fraction}")
                size = fraction * self._device_memory()
        elif fraction is not None:
            raise ValueError("size and fraction cannot be specified at one time")
        if size < 0:
            raise ValueError(f"memory limit size out of range: {size}")
        self._engine.set_limit(int(size))

    def get_limit(self) -> int:
        """The limit :meth:`set_limit` set, in bytes (0: none), as CuPy's."""
        return self._engine.get_limit()

    def _device_memory(self) -> int:
        if self._total_memory is not None:
            return self._total_memory
        return cupy.cuda.runtime.memGetInfo()[1]

    # ----------------------------------------------------------- installation
    def install(self) -> "ProfileGuidedMemoryPool":
        """Make this pool CuPy's allocator; :meth:`uninstall` restores the previous one."""
        self._previous_allocators.append(cupy.cuda.get_allocator())
        cupy.cuda.set_allocator(self.malloc)
        return self

    def uninstall(self) -> None:
        """Restore the allocator :meth:`install` replaced; a ``RuntimeError`` without one."""
        if not self._previous_allocators:
            raise RuntimeError("uninstall() without install()")
        cupy.cuda.set_allocator(self._previous_allocators.pop())

    def __enter__(self) -> "ProfileGuidedMemoryPool":
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.uninstall()

    # ---------------------------------------------------------- saved plans
    def save(self, path: str | os.PathLike) -> None:
        """Save the profile and the plan in use (JSON with a checksum)."""
        planfile.save(path, *self._saveable())

    def load(self, path: str | os.PathLike) -> Plan:
        """Use a saved plan from the next iteration on (after warm-up).

        Raises :class:`PlanFileError` on a damaged or mismatched file; the
        pool then forgets any plan and profiles again.
        """
        return self._use_saved(lambda: planfile.load(path), os.fspath(path))

    def state_bytes(self) -> bytes:
        """The content of :meth:`save`, in memory (for snapshots)."""
        return planfile.dumps(*self._saveable())

    def load_state_bytes(self, data: bytes) -> Plan:
        """:meth:`load` from the bytes :meth:`state_bytes` gave (a trainer snapshot)."""
        return self._use_saved(lambda: planfile.loads(data), "<bytes>")

    def _saveable(self) -> tuple:
        profile, plan = self._engine.profile, self._engine.plan
        if profile is None or plan is None:
            raise RuntimeError("no plan to save yet: run the warm-up and profiled "
                               "iterations (or call optimize()) first")
        from . import __version__

        return profile, plan.offsets, plan.method, {"pgmo": __version__}

    def _use_saved(self, read: Callable[[], planfile.SavedPlan], source: str) -> Plan:
        try:
            saved = read()
            plan = Plan(saved.profile.without_open(), tuple(saved.offsets),
                        method=saved.method)
            if plan.peak > self._device_memory():
                raise PlanFileError(f"{source}: the plan needs {plan.peak:,} B, more than "
                                    f"this device's {self._device_memory():,} B")
            self._engine.adopt(saved.profile, plan)
        except PlanFileError:
            self._engine.reset()
            raise
        except (PlanError, ValueError) as e:
            self._engine.reset()
            raise PlanFileError(f"saved plan does not fit its profile: {e}") from None
        return plan

    def _plan_installed(self, schedule: Schedule) -> None:
        """Keep ``plan_path`` (or the plan cache) up to date (:mod:`pgmo.pool_plans`)."""
        self._keeper.installed(schedule, self._engine)

    def __repr__(self) -> str:
        plan = self._engine.plan
        peak = plan.peak if plan is not None else 0
        return (f"<ProfileGuidedMemoryPool mode={self.mode} iterations={self._engine.completed} "
                f"planned_peak={peak}>")


def _call_if_alive(ref: "weakref.ref[ProfileGuidedMemoryPool]", name: str, arg: Any) -> Any:
    pool = ref()
    if pool is None:
        raise RuntimeError("the ProfileGuidedMemoryPool was deleted")
    return getattr(pool, name)(arg)


def _plan_path_checked(plan_path: str | os.PathLike) -> str:
    """``plan_path`` as a string, refused (ValueError naming the problem) where no plan file
    could ever be written: a folder, or a path under a file."""
    path = os.path.abspath(os.fspath(plan_path))
    if os.path.isdir(path):
        raise ValueError(f"plan_path {os.fspath(plan_path)!r} is a folder: give a file name "
                         f"in it (e.g. {os.path.join(os.fspath(plan_path), 'plan.json')!r})")
    parent = os.path.dirname(path)
    while parent and not os.path.exists(parent):
        parent = os.path.dirname(parent) if os.path.dirname(parent) != parent else ""
    if parent and not os.path.isdir(parent):
        raise ValueError(f"plan_path {os.fspath(plan_path)!r} lies under {parent!r}, which is "
                         f"a file, not a folder")
    return os.fspath(plan_path)
