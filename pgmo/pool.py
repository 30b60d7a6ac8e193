"""ProfileGuidedMemoryPool: the CuPy face of pgmo's engine.

Usage::

    pool = pgmo.ProfileGuidedMemoryPool()
    with pool:                          # cupy.cuda.set_allocator(pool.malloc), undone on exit
        for batch in data:
            with pool.iteration():      # request numbering restarts at each iteration
                train_step(batch)

The first ``warmup`` iterations (weights and optimizer state are created
there) and the profiled one are served by CuPy's stock pool; from the next
iteration on, request ``i`` gets its own memory object at ``arena +
offset[i]``.  All the logic lives in :mod:`pgmo._engine`, which imports no
CuPy; this module adds CuPy's conventions: memory hooks, limits, byte
counters, ``OutOfMemoryError``, installation as CuPy's allocator, and saved
plans.
"""

from __future__ import annotations

import contextlib
import logging
import os
import weakref
from typing import Any, Callable, Iterator

import cupy
from cupy.cuda import memory as _memory
from cupy.cuda import memory_hook as _memory_hook

from ._engine import Engine
from .errors import PlanFileError
from .formats import planfile
from .plan import Plan
from .stats import PoolStats
from .trace import Trace
from .units import round_size

__all__ = ["ProfileGuidedMemoryPool", "PlanFileError"]

log = logging.getLogger("pgmo.pool")

_AUTO = object()
_UnownedMemory = _memory.UnownedMemory
_MemoryPointer = _memory.MemoryPointer
_has_memory_hooks = _memory_hook._has_memory_hooks
_get_memory_hooks = _memory_hook.get_memory_hooks


def _cuda_context() -> tuple[int, int]:
    """Device and stream of a request: the plan covers one of each."""
    return cupy.cuda.device.get_device_id(), cupy.cuda.get_current_stream().ptr


_CUDA_ERROR_MEMORY_ALLOCATION = 2  # cudaErrorMemoryAllocation (not exported to Python)


def _raw_with_memory_error(allocator: Callable[[int], Any]) -> Callable[[int], Any]:
    """The engine understands MemoryError; cudaMalloc failures raise CUDARuntimeError."""
    from cupy_backends.cuda.api.runtime import CUDARuntimeError

    def allocate(size: int):
        try:
            return allocator(size)
        except CUDARuntimeError as e:
            if e.status == _CUDA_ERROR_MEMORY_ALLOCATION:
                raise MemoryError(str(e)) from e
            raise

    return allocate


class ProfileGuidedMemoryPool(_memory.MemoryPool):
    """A CuPy memory pool that answers a hot loop's requests from a solved plan.

    Args:
        allocator: raw allocator (``size -> MemoryPointer``) for the arena and,
            when ``fallback`` is None, for the stock pool; CuPy's cudaMalloc
            by default.
        fallback: the pool serving everything outside the plan; a
            ``cupy.cuda.MemoryPool(allocator)`` by default.  Anything with
            ``malloc``, ``used_bytes``, ``free_bytes``, ``total_bytes``,
            ``n_free_blocks``, ``free_all_blocks`` and ``set_limit(size=)``.
        warmup: iterations served by the fallback before the profiled one.
        method, time_limit: passed to :func:`pgmo.solve`.
        plan_path: load a saved plan from here when the file exists (a bad
            file is logged and ignored) and save every new plan there.
        device_id, context, total_memory: for non-CUDA backends
            (:func:`pgmo.testing.host_pool`); by default the current device,
            its current stream, and its memory size.
    """

    def __init__(self, allocator=None, *, fallback=None, warmup: int = 1,
                 method: str = "best", time_limit: float | None = 10.0, plan_path=None,
                 device_id: int | None = None, context: Any = _AUTO,
                 total_memory: int | None = None):
        super().__init__(allocator)
        raw = allocator if allocator is not None else _memory._malloc
        # CuPy's own pools call memory hooks themselves; pgmo reports the rest.
        self._fallback_reports_hooks = fallback is None or isinstance(
            fallback, (_memory.MemoryPool, _memory.SingleDeviceMemoryPool))
        if fallback is None:
            fallback = _memory.MemoryPool(allocator)
        if device_id is None:
            device_id = cupy.cuda.device.get_device_id()
        self._device_id = device_id = int(device_id)
        self._total_memory = total_memory
        self.host_memory = False  # True when pointers are host addresses (testing)

        self._plan_path = os.fspath(plan_path) if plan_path is not None else None
        # The engine's callbacks reach the pool through a weak reference, so
        # dropping the pool frees it (and its arena) without waiting for the GC.
        ref = weakref.ref(self)
        self._engine = engine = Engine(
            _hooked_arena_allocator(_raw_with_memory_error(raw), device_id), fallback,
            memory_type=_UnownedMemory, pointer_type=_MemoryPointer, device_id=device_id,
            warmup=warmup, method=method, time_limit=time_limit,
            context=_cuda_context if context is _AUTO else context,
            oom_error=_memory.OutOfMemoryError,
            on_plan=lambda plan: _call_if_alive(ref, "_plan_installed", plan),
            hooks_active=_has_memory_hooks,
            on_hooks=lambda size: _call_if_alive(ref, "_malloc_with_hooks", size))
        # CuPy calls pool.malloc for every allocation: let it reach the engine
        # directly (this instance attribute shadows the method below).
        self.malloc = engine.malloc
        self._previous_allocators: list[Any] = []
        self.set_limit(**_memory._parse_limit_string())
        if self._plan_path is not None and os.path.exists(self._plan_path):
            try:
                self.load(self._plan_path)
            except PlanFileError as e:
                log.warning("ignoring saved plan, profiling instead: %s", e)

    # ------------------------------------------------------------- allocation
    def malloc(self, size: int) -> _MemoryPointer:
        """Allocate ``size`` bytes; what ``cupy.cuda.set_allocator(pool.malloc)`` calls.

        (Instances answer with the engine's ``malloc`` directly, for speed.)
        """
        return self._engine.malloc(size)

    def _malloc_with_hooks(self, size: int) -> _MemoryPointer:
        """Report pgmo's own blocks to CuPy memory hooks, as CuPy's pool does.

        Blocks from CuPy's stock fallback are reported by that pool already.
        """
        memptr = self._engine.malloc(size, False)
        hooks = list(_get_memory_hooks().values())
        if not hooks:
            return memptr
        device_id = self._device_id
        rounded = round_size(size) if size > 0 else 0
        lease = memptr.mem if size > 0 else None  # pgmo's memory objects are the leases
        if lease is not None and lease.arena is None and self._fallback_reports_hooks:
            return memptr
        mem_ptr, pmem_id = memptr.ptr, id(memptr.mem)
        for hook in hooks:
            hook.malloc_preprocess(device_id=device_id, size=size, mem_size=rounded)
        for hook in hooks:
            hook.malloc_postprocess(device_id=device_id, size=size, mem_size=rounded,
                                    mem_ptr=mem_ptr, pmem_id=pmem_id)
        if lease is not None:
            lease.on_free = _FreeReport(device_id, rounded, mem_ptr, pmem_id)
        return memptr

    # ------------------------------------------------------------- iterations
    @contextlib.contextmanager
    def iteration(self) -> Iterator["ProfileGuidedMemoryPool"]:
        """One hot iteration; an exception inside discards it as a profile."""
        self._engine.begin_iteration()
        try:
            yield self
        except BaseException:
            self._engine.end_iteration(aborted=True)
            raise
        self._engine.end_iteration()

    def begin_iteration(self) -> None:
        self._engine.begin_iteration()

    def end_iteration(self) -> None:
        self._engine.end_iteration()

    def interrupt(self) -> None:
        """Serve from the fallback, outside the plan, until :meth:`resume`."""
        self._engine.interrupt()

    def resume(self) -> None:
        self._engine.resume()

    @contextlib.contextmanager
    def interrupted(self) -> Iterator["ProfileGuidedMemoryPool"]:
        self._engine.interrupt()
        try:
            yield self
        finally:
            self._engine.resume()

    def optimize(self) -> Plan:
        """Solve the current profile now; the plan answers from the next iteration."""
        return self._engine.optimize()

    @property
    def mode(self) -> str:
        return self._engine.mode

    @property
    def profile(self) -> Trace | None:
        return self._engine.profile

    @property
    def plan(self) -> Plan | None:
        return self._engine.plan

    @property
    def engine(self) -> Engine:
        return self._engine

    def stats(self) -> dict:
        snap = self._engine.snapshot()
        return PoolStats(**snap, n_free_blocks=self._engine.n_free_blocks()).as_dict()

    # ------------------------------------------------------ CuPy pool methods
    def used_bytes(self) -> int:
        return self._engine.used_bytes()

    def free_bytes(self) -> int:
        return self._engine.free_bytes()

    def total_bytes(self) -> int:
        self._engine.drain()
        return self._engine.total_bytes()

    def n_free_blocks(self) -> int:
        return self._engine.n_free_blocks()

    def free_all_blocks(self, stream=None) -> None:
        """Release cached fallback blocks (and an idle arena between iterations)."""
        self._engine.free_all_blocks()

    def free_all_free(self) -> None:
        self.free_all_blocks()

    def set_limit(self, size=None, fraction=None) -> None:
        """Cap ``total_bytes`` (arena + fallback), with CuPy's arguments and errors."""
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
        if not self._previous_allocators:
            raise RuntimeError("uninstall() without install()")
        cupy.cuda.set_allocator(self._previous_allocators.pop())

    def __enter__(self) -> "ProfileGuidedMemoryPool":
        return self.install()

    def __exit__(self, *exc) -> None:
        self.uninstall()

    # ---------------------------------------------------------- saved plans
    def save(self, path) -> None:
        """Save the profile and the plan in use (JSON with a checksum)."""
        profile, plan = self._saveable()
        planfile.save(path, profile, plan.offsets, plan.method, self._file_extra())

    def load(self, path) -> Plan:
        """Use a saved plan from the next iteration on (after warm-up).

        Raises :class:`PlanFileError` on a damaged or mismatched file; the
        pool then forgets any plan and profiles again.
        """
        return self._use_loaded(lambda: planfile.load(path))

    def state_bytes(self) -> bytes:
        """The content of :meth:`save`, in memory (for snapshots)."""
        profile, plan = self._saveable()
        return planfile.dumps(profile, plan.offsets, plan.method, self._file_extra())

    def load_state_bytes(self, data: bytes) -> Plan:
        return self._use_loaded(lambda: planfile.loads(data))

    def _saveable(self):
        profile, plan = self._engine.profile, self._engine.plan
        if profile is None or plan is None:
            raise RuntimeError("no plan to save yet: run the warm-up and profiled "
                               "iterations (or call optimize()) first")
        return profile, plan

    def _file_extra(self) -> dict:
        from . import __version__

        return {"pgmo": __version__, "method": self._engine.method}

    def _use_loaded(self, read: Callable[[], Any]) -> Plan:
        try:
            saved = read()
            profile = saved.profile
            plan = Plan(profile.without_open(), tuple(saved.offsets), method=saved.method)
            arrays = ([b.size for b in profile], [b.lower for b in profile],
                      [b.upper for b in profile])
            self._engine.set_plan(arrays, plan)
        except PlanFileError:
            self._engine.reset()
            raise
        except ValueError as e:
            self._engine.reset()
            raise PlanFileError(f"saved plan does not fit its profile: {e}") from None
        return plan

    def _plan_installed(self, plan: Plan) -> None:
        if self._plan_path is not None:
            try:
                self.save(self._plan_path)
            except OSError as e:
                log.warning("cannot save the plan to %s: %s", self._plan_path, e)

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


def _hooked_arena_allocator(raw: Callable[[int], Any], device_id: int) -> Callable[[int], Any]:
    """Arena allocations are raw allocations: report them to alloc hooks."""
    def allocate(size: int):
        if not (_has_memory_hooks() and _get_memory_hooks()):
            return raw(size)
        hooks = list(_get_memory_hooks().values())
        for hook in hooks:
            hook.alloc_preprocess(device_id=device_id, mem_size=size)
        buffer = None
        try:
            buffer = raw(size)
        finally:
            for hook in hooks:
                hook.alloc_postprocess(device_id=device_id, mem_size=size,
                                       mem_ptr=buffer.ptr if buffer is not None else 0)
        return buffer

    return allocate


class _FreeReport:
    """Calls CuPy's free hooks for a pgmo block, in the freeing thread."""

    __slots__ = ("device_id", "mem_size", "mem_ptr", "pmem_id")

    def __init__(self, device_id: int, mem_size: int, mem_ptr: int, pmem_id: int):
        self.device_id, self.mem_size, self.mem_ptr, self.pmem_id = (
            device_id, mem_size, mem_ptr, pmem_id)

    def __call__(self, lease: Any) -> None:
        if not (_has_memory_hooks() and _get_memory_hooks()):
            return
        hooks = list(_get_memory_hooks().values())
        kw = {"device_id": self.device_id, "mem_size": self.mem_size,
              "mem_ptr": self.mem_ptr, "pmem_id": self.pmem_id}
        for hook in hooks:
            hook.free_preprocess(**kw)
        for hook in hooks:
            hook.free_postprocess(**kw)
