"""The CUDA side of pgmo's device layer: a reserved virtual range, and a private stream-ordered pool.

:mod:`pgmo.engine.memory` decides what is taken and given back; this module
only speaks to the GPU, through two optional APIs:

* **CUDA virtual memory management** (``cuMemAddressReserve``,
  ``cuMemCreate``, ``cuMemMap``, ``cuMemSetAccess``, ``cuMemUnmap``), which
  CuPy 14 does not expose: through ``cuda-bindings``
  (``cuda.bindings.driver``; the ``cuda12``/``cuda13`` extras install it).
  :class:`CudaRange` reserves address space once and backs it with physical
  memory on demand, so the arena grows in place and its end is trimmed (and
  maps pages of their own at several addresses, for the page heap).
* **A private stream-ordered pool** (``cudaMemPoolCreate``,
  ``cudaMallocFromPoolAsync``, ``cudaFreeAsync``, ``cudaMemPoolTrimTo``),
  which CuPy's runtime module has: :class:`CudaAsyncPool` serves the
  requests no plan covers without a device sync per free.

The rules a real driver enforces, and how this module keeps them:

* ``cuMemUnmap`` and ``cudaMemPoolTrimTo`` do not wait for queued work, and
  an array from the arena may be in use by a kernel on any stream: both are
  preceded by a **device-wide** synchronization, also when a range is closed
  or collected.
* Access is granted once per growth, over all its new mappings (one
  ``cuMemSetAccess``); a handle is released right after it is mapped (the
  mapping keeps the memory).
* ``cuMemUnmap`` gives back whole mappings only; one call takes a run of
  adjacent whole mappings (NVIDIA's ``vectorAddMMAP`` sample frees a range
  mapped in several pieces so) where :func:`device_layer`'s probe saw the
  driver do it (``joins_unmaps``), else each mapping has a call of its own.
  At the boundary where a profiled iteration's heap goes back that is a
  handful of calls instead of thousands (about 30 us each on the H100).
* A failed call changes nothing the books do not show: a growth that fails
  half-way gives back what it mapped, an unmap that fails keeps that mapping
  (and those below it) listed and counted (:class:`~pgmo.device.mappings.MappingLedger`).
* A Ctrl-C waits for a range's call to end (:func:`~pgmo.device.whole_calls.whole`):
  the books and the driver never disagree, whatever line it lands on.
* A pool serves one device: peer access does not cover ``cuMemMap``'d
  memory, so the engine sends requests made under another device to CuPy's
  pool for that device.
* A block of the stream-ordered pool is freed on the stream it was allocated
  on, from the thread that allocated it: ``cudaStreamPerThread`` means the
  *calling* thread's stream, so a free from another thread (a loader, the
  garbage collector) waits in the pool's inbox for the owner thread, or for
  the next device sync.  The stream is held weakly; once it is destroyed
  the block is freed on the current stream (as CuPy's ``MemoryAsync`` does).

:func:`device_layer` checks what the device supports (its attributes), then
**probes** each part with two granules (reserve, create, map, set access,
one unmap over both mappings, free; a pool's create, malloc, free, trim, destroy), so that a driver
that says no (NOT_SUPPORTED under a container or vGPU, say) costs a fallback
to cudaMalloc with its reason, not an error in the first iteration.  Both
classes take their driver and runtime modules as arguments, so that the
tests run them against stand-ins (``tests/cuda_standins.py``;
``tests/test_cuda_device.py`` tests this module).  The checked calls
themselves are :mod:`.cuda_calls`.

The host analogues, used by every CPU test and benchmark, are
:class:`pgmo.device.host_range.HostRange` and
:class:`pgmo.device.host_async_pool.HostAsyncPool`.
"""

from __future__ import annotations

import collections
import logging
import threading
import weakref
from typing import Any, Callable, Sequence

from ..errors import DeviceError
from .cuda_calls import _allocation_prop, _check, _code, _driver, _runtime, vmm_granularity
from .mappings import MappingLedger
from .whole_calls import whole

__all__ = ["CudaRange", "CudaAsyncPool", "device_layer", "vmm_granularity", "DeviceError"]

log = logging.getLogger("pgmo.pool")

_get_ident = threading.get_ident


class CudaRange:
    """Reserved device address space, mapped as the arena grows, trimmed at its end.

    :meth:`map` backs ``[offset, offset + nbytes)`` with new mappings
    (``cuMemCreate`` + ``cuMemMap`` each, the handle released at once) and
    grants access to all of them with one ``cuMemSetAccess``: all or
    nothing.  :meth:`unmap` gives back whole mappings, never part of one: a
    run of them in one ``cuMemUnmap`` where the driver joins unmaps (probed),
    else one call each, the highest first, so that what stays mapped after
    a failure is still one run from offset 0.  Neither waits
    for the device: the caller calls :meth:`synchronize` (a device-wide
    sync) before an unmap; :meth:`close` does it itself.
    """

    @whole
    def __init__(self, size: int, device_id: int, granule: int, driver: Any = None,
                 synchronize: Callable[[], object] | None = None):
        """``synchronize()`` waits for every queued kernel of the device
        (``cudaDeviceSynchronize``)."""
        self.driver = driver = driver or _driver()
        self.device_id = device_id
        self.granule = granule
        self.size = -(-size // granule) * granule
        self._books = MappingLedger()
        self._closed = True  # until the reservation exists
        self.ptr = int(_check(driver.cuMemAddressReserve(self.size, granule, 0, 0),
                              "cuMemAddressReserve"))
        self._closed = False
        self._prop = _allocation_prop(driver, device_id)
        access = driver.CUmemAccessDesc()
        access.location.type = driver.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        access.location.id = device_id
        access.flags = driver.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        self._access = access
        self._synchronize = synchronize
        self._pages: dict[Any, bool] = {}  # handles made by create_page -> released
        self._page_bytes = 0  # their memory, until released and mapped nowhere
        #: Whether one ``cuMemUnmap`` may give back a run of adjacent whole mappings
        #: (NVIDIA's samples unmap several mappings in one call): set where
        #: :func:`device_layer`'s probe saw the driver do it; else one call per mapping.
        self.joins_unmaps = False

    def __del__(self) -> None:  # the arena's last block and the pool are gone
        try:
            self.close()
        except Exception as e:  # a driver that refuses, or one gone at interpreter exit
            try:
                # str(e): a record that kept the exception would keep, through its traceback,
                # the frame the collector ran in alive, and the blocks that frame holds
                log.warning("pgmo could not give its reserved range back: %s", str(e))
            except Exception:  # logging itself may be gone at interpreter exit
                pass

    @property
    def mapped(self) -> int:
        """Bytes the driver holds for this range now (every mapping, usable or stranded)."""
        return self._books.mapped

    @whole
    def map(self, offset: int, nbytes: int, piece: int | None = None) -> None:
        """Map ``[offset, offset + nbytes)`` in mappings of ``piece`` bytes at most, then grant
        access over all of it at once.  All or nothing: MemoryError (full device) or
        :class:`~pgmo.errors.DeviceError`, with what this call mapped given back."""
        d, books = self.driver, self._books
        piece = piece or nbytes
        books.check_new(offset, nbytes, piece, self.granule, self.size)
        made: list[int] = []
        try:
            pos, end = offset, offset + nbytes
            while pos < end:
                step = min(piece, end - pos)
                handle = _check(d.cuMemCreate(step, self._prop, 0), "cuMemCreate")
                try:
                    _check(d.cuMemMap(self.ptr + pos, step, 0, handle, 0), "cuMemMap")
                    books.add(pos, step, usable=False)  # mapped: listed, not usable yet
                    made.append(pos)
                finally:
                    d.cuMemRelease(handle)  # the mapping keeps the memory until unmapped
                pos += step
            _check(d.cuMemSetAccess(self.ptr + offset, nbytes, [self._access], 1),
                   "cuMemSetAccess")
            books.make_usable(made)
        except BaseException:
            self._give_back_unused(made)
            raise

    def _give_back_unused(self, starts: list[int]) -> None:
        """Unmap mappings no kernel can have used (access never granted): no sync needed.
        One the driver refuses stays listed (counted, never usable)."""
        for start in reversed(starts):
            result = self.driver.cuMemUnmap(self.ptr + start, self._books.length(start))
            if _code(result) != 0:
                log.warning("pgmo could not unmap %d bytes it had just mapped", 
                            self._books.length(start))
                return
            self._books.remove(start)

    @whole
    def unmap(self, offset: int, nbytes: int) -> None:
        """Give back the whole mappings that make up ``[offset, offset + nbytes)`` (call
        :meth:`synchronize` before): one ``cuMemUnmap`` where the driver joins unmaps
        (:attr:`joins_unmaps`), else one each, the highest first.  On a refusal, raises
        with the refused mapping and those below it still listed and counted."""
        books = self._books
        starts = books.run(offset, nbytes)
        if self.joins_unmaps and len(starts) > 1:
            _check(self.driver.cuMemUnmap(self.ptr + offset, nbytes), "cuMemUnmap")
            self._forget(offset, nbytes)
            return
        for start in reversed(starts):
            length = books.length(start)
            _check(self.driver.cuMemUnmap(self.ptr + start, length), "cuMemUnmap")
            self._forget(start, length)

    def _forget(self, start: int, nbytes: int) -> None:
        """The mappings of ``[start, start + nbytes)`` are gone: off the books (in one
        slice), and released pages mapped nowhere any more off the pages held."""
        for _, _, handle in self._books.remove_run(start, nbytes):
            if handle is not None and self._pages.get(handle) \
                    and not self._books.maps_of(handle):
                del self._pages[handle]
                self._page_bytes -= self.granule

    # ----------------------------------------- physical pages of their own (page heap)
    @property
    def pages_held(self) -> int:
        """Bytes of the pages made (:meth:`create_page`) and not given back yet."""
        return self._page_bytes

    @whole
    def create_page(self) -> Any:
        """One granule of device memory, mapped nowhere yet (``cuMemCreate``): its handle.
        MemoryError when the device is full."""
        handle = _check(self.driver.cuMemCreate(self.granule, self._prop, 0), "cuMemCreate")
        self._pages[handle] = False
        self._page_bytes += self.granule
        return handle

    @whole
    def map_page(self, offset: int, handle: Any) -> None:
        """Map the page ``handle`` at ``offset`` (``cuMemMap``; the driver maps one handle at
        several addresses) and grant access to it (``cuMemSetAccess``): both or neither."""
        d, g = self.driver, self.granule
        if self._pages.get(handle, True):
            raise ValueError("a page released, or not made by create_page")
        self._books.check_new(offset, g, g, g, self.size)
        _check(d.cuMemMap(self.ptr + offset, g, 0, handle, 0), "cuMemMap")
        try:
            _check(d.cuMemSetAccess(self.ptr + offset, g, [self._access], 1),
                   "cuMemSetAccess")
        except BaseException:  # never usable, so never used: unmapped without a sync
            d.cuMemUnmap(self.ptr + offset, g)
            raise
        self._books.add(offset, g, handle=handle)

    @whole
    def map_pages(self, offset: int, handles: Sequence[Any]) -> None:
        """Map the pages ``handles`` at consecutive granules from ``offset`` (a ``cuMemMap``
        each) and grant access over all of them at once (one ``cuMemSetAccess``, the call
        that costs: 55 us against 2 us on the H100 of the quick check's fit).  All or
        nothing: a refusal unmaps what this call mapped (no kernel can have used it)."""
        d, g = self.driver, self.granule
        if any(self._pages.get(h, True) for h in handles):
            raise ValueError("a page released, or not made by create_page")
        nbytes = g * len(handles)
        self._books.check_new(offset, nbytes, g, g, self.size)
        made: list[int] = []
        try:
            for k, handle in enumerate(handles):
                _check(d.cuMemMap(self.ptr + offset + k * g, g, 0, handle, 0), "cuMemMap")
                self._books.add(offset + k * g, g, usable=False, handle=handle)
                made.append(offset + k * g)
            _check(d.cuMemSetAccess(self.ptr + offset, nbytes, [self._access], 1),
                   "cuMemSetAccess")
            self._books.make_usable(made)
        except BaseException:
            self._give_back_unused(made)
            raise

    def unmap_page(self, offset: int) -> None:
        """Drop the page mapping at ``offset`` (``cuMemUnmap``; :meth:`synchronize` first)."""
        self.unmap_pages(offset, 1)

    @whole
    def unmap_pages(self, offset: int, count: int) -> None:
        """Drop the ``count`` adjacent page mappings from ``offset`` in one ``cuMemUnmap``
        (several only where the driver joins unmaps; :meth:`synchronize` first).
        ValueError where any is not a page's mapping; on a refusal all stay listed."""
        g = self.granule
        for k in range(count):
            if self._books.handle(offset + k * g) is None:
                raise ValueError(f"no page is mapped at {offset + k * g:,}")
        if count > 1 and not self.joins_unmaps:
            raise ValueError(f"{count} pages in one call: this driver unmaps one mapping "
                             f"per call")
        _check(self.driver.cuMemUnmap(self.ptr + offset, count * g), "cuMemUnmap")
        self._forget(offset, count * g)

    @whole
    def release_page(self, handle: Any) -> None:
        """Give the page up (``cuMemRelease``): its memory goes back once mapped nowhere."""
        if self._pages.get(handle, True):
            raise ValueError("a page released twice, or not made by create_page")
        _check(self.driver.cuMemRelease(handle), "cuMemRelease")
        if self._books.maps_of(handle):
            self._pages[handle] = True
        else:
            del self._pages[handle]
            self._page_bytes -= self.granule

    def mappings(self) -> list[tuple[int, int]]:
        return self._books.mappings()

    def page_at(self, offset: int) -> Any:
        """The physical page (a :meth:`create_page` handle) mapped at ``offset``; None where
        none is (what a call cut short mapped, as the books say)."""
        return self._books.handle(offset)

    def starts_in(self, lo: int, hi: int) -> bool:
        """Whether a mapping starts in ``[lo, hi)``."""
        return self._books.starts_in(lo, hi)

    def usable_end(self, start: int = 0) -> int:
        """The end of the usable memory from ``start`` (from offset 0: what an arena on this
        range may use)."""
        return self._books.usable_end(start)

    def synchronize(self) -> None:
        """Wait for the whole device (before memory a kernel may use goes back)."""
        if self._synchronize is not None:
            self._synchronize()

    @whole
    def close(self) -> None:
        """Wait for the device, unmap everything, give the address space back.

        Raises :class:`~pgmo.errors.DeviceError` when the driver refuses part of it (what
        it refused stays listed; a later call tries again)."""
        if self._closed:
            return
        self.synchronize()
        failure: DeviceError | None = None
        for start, length in reversed(self._books.mappings()):
            try:
                _check(self.driver.cuMemUnmap(self.ptr + start, length), "cuMemUnmap")
                self._books.remove(start)
            except DeviceError as e:
                failure = failure or e
        if failure is not None:
            try:
                raise failure
            finally:  # no cycle (the error's traceback -> this frame -> the error): the frames
                failure = None  # it holds, the collector's caller's too, go with the error
        for handle, released in list(self._pages.items()):  # the page heap's, if any
            if not released:
                _check(self.driver.cuMemRelease(handle), "cuMemRelease")
            del self._pages[handle]
            self._page_bytes -= self.granule
        _check(self.driver.cuMemAddressFree(self.ptr, self.size), "cuMemAddressFree")
        self._closed = True


def _weak(stream: Any) -> Callable[[], Any]:
    """A weak reference to ``stream`` (a plain value where it takes none, an int say)."""
    try:
        return weakref.ref(stream)
    except TypeError:
        return lambda: stream


class _PoolBlock:
    """A block of a :class:`CudaAsyncPool`; its death is its ``cudaFreeAsync`` (see there)."""

    __slots__ = ("ptr", "size", "_pool", "_stream", "_thread")
    ptr: int
    size: int
    _pool: "CudaAsyncPool"
    _stream: Callable[[], Any]
    _thread: int

    def __del__(self) -> None:
        pool = getattr(self, "_pool", None)
        if pool is not None:  # None: the block was never handed out
            pool._died(self.ptr, self.size, self._stream, self._thread)


class CudaAsyncPool:
    """A private stream-ordered pool (the release threshold at its maximum: memory stays for
    reuse until :meth:`trim`), serving one device.

    A block is allocated on CuPy's current stream and freed on that stream from
    the thread that allocated it; a block that dies on another thread waits in
    the pool's inbox (:meth:`pending_frees`) until that thread's next
    :meth:`malloc`, or until :meth:`trim`, which follows a device sync.
    """

    def __init__(self, device_id: int, runtime: Any = None,
                 stream: Callable[[], Any] | None = None):
        """``runtime``: CuPy's ``cupy.cuda.runtime``; ``stream()``: the current stream (an
        object with ``ptr``; CuPy's ``get_current_stream``)."""
        if runtime is None:
            from cupy.cuda import runtime as cupy_runtime

            runtime = cupy_runtime
        self.runtime = runtime
        self.stream = stream or _current_stream
        self.device_id = device_id
        self.used = 0
        self._held = 0  # the last ReservedMemCurrent read
        self._held_unknown = False
        self._inbox: collections.deque = collections.deque()  # frees from other threads
        props = runtime.MemPoolProps(runtime.cudaMemAllocationTypePinned,
                                     runtime.cudaMemHandleTypeNone,
                                     runtime.cudaMemLocationTypeDevice, device_id)
        self.handle = _runtime("cudaMemPoolCreate", runtime.memPoolCreate, props)
        try:
            _runtime("cudaMemPoolSetAttribute", runtime.memPoolSetAttribute, self.handle,
                     runtime.cudaMemPoolAttrReleaseThreshold, 2 ** 64 - 1)
        except BaseException:
            self.close()
            raise

    def __del__(self) -> None:  # blocks keep their pool: none is outstanding now
        try:
            self.close()
        except Exception:  # at interpreter exit the runtime may be gone already
            pass

    def close(self) -> None:
        handle, self.handle = getattr(self, "handle", None), None
        if handle is not None:
            _runtime("cudaMemPoolDestroy", self.runtime.memPoolDestroy, handle)

    @property
    def held(self) -> int:
        """Bytes the pool holds (ReservedMemCurrent); where the driver stops answering, the
        last answer (a statistic must not stop the pool)."""
        rt = self.runtime
        try:
            self._held = int(_runtime("cudaMemPoolGetAttribute", rt.memPoolGetAttribute,
                                      self.handle, rt.cudaMemPoolAttrReservedMemCurrent))
        except (DeviceError, MemoryError) as e:
            if not self._held_unknown:
                log.warning("pgmo cannot read what its stream-ordered pool holds (%s); "
                            "counting what it held last", e)
            self._held_unknown = True
            return max(self._held, self.used)
        self._held_unknown = False
        return self._held

    def pending_frees(self) -> int:
        """Blocks that died on another thread and wait for their thread or a device sync."""
        return len(self._inbox)

    def malloc(self, size: int) -> _PoolBlock:
        if self._inbox:
            self._free_waiting(synced=False)
        stream = self.stream()
        ptr = _runtime("cudaMallocFromPoolAsync", self.runtime.mallocFromPoolAsync, size,
                       self.handle, stream.ptr)
        block = _PoolBlock()
        block.ptr, block.size, block._stream, block._thread = ptr, size, _weak(stream), \
            _get_ident()
        self.used += size
        block._pool = self  # last: from here on its death frees it
        return block

    def free_now(self, block: _PoolBlock) -> None:
        """Free ``block`` at once on its stream, raising what the driver answers (its death
        then frees nothing): for a probe, which must hear a refusal."""
        block._pool = None  # type: ignore[assignment]
        self._free(block.ptr, block.size, block._stream())

    def _died(self, ptr: int, size: int, stream: Callable[[], Any], thread: int) -> None:
        """A block's death (any thread, the garbage collector's too)."""
        if thread != _get_ident():
            self._inbox.append((ptr, size, stream, thread))  # ordered by its own thread later
            return
        try:
            self._free(ptr, size, stream())
        except Exception as e:  # a free in a destructor must not raise; the memory stays held
            log.warning("pgmo could not free a block of its stream-ordered pool: %s", e)

    def _free(self, ptr: int, size: int, stream: Any) -> None:
        handle = stream.ptr if stream is not None else self.stream().ptr
        _runtime("cudaFreeAsync", self.runtime.freeAsync, ptr, handle)
        self.used -= size

    def _free_waiting(self, synced: bool) -> None:
        """Free the blocks that died on other threads: those of this thread on their own
        stream; after a device sync (``synced``) all of them, on the current stream (the
        work that used them is done, and a dead block gets no new work)."""
        me = _get_ident()
        for _ in range(len(self._inbox)):
            ptr, size, stream, thread = self._inbox.popleft()
            if synced:
                self._free(ptr, size, None)
            elif thread == me:
                self._free(ptr, size, stream())
            else:
                self._inbox.append((ptr, size, stream, thread))

    def synchronize(self) -> None:
        """Wait for the whole device (before :meth:`trim`)."""
        _runtime("cudaDeviceSynchronize", self.runtime.deviceSynchronize)

    def trim(self) -> None:
        """Give back every wholly free chunk (after :meth:`synchronize`): frees waiting for
        their thread go first."""
        self._free_waiting(synced=True)
        _runtime("cudaMemPoolTrimTo", self.runtime.memPoolTrimTo, self.handle, 0)


def _current_stream() -> Any:
    import cupy

    return cupy.cuda.get_current_stream()


def _probe_range(device_id: int, granule: int, driver: Any,
                 synchronize: Callable[[], object]) -> bool:
    """Every call an arena makes, once, on two granules mapped apart: a driver that says
    no, says it here.  Returns whether one ``cuMemUnmap`` gave both back (else each goes
    in a call of its own, and ranges unmap one mapping per call)."""
    probe = CudaRange(2 * granule, device_id, granule, driver=driver, synchronize=synchronize)
    try:
        probe.map(0, 2 * granule, granule)
        probe.synchronize()
        joined = _code(driver.cuMemUnmap(probe.ptr, 2 * granule)) == 0
        if joined:
            probe._forget(0, 2 * granule)
        else:
            probe.unmap(0, 2 * granule)  # one call each; raises if the driver refuses those
        return joined
    finally:
        probe.close()


def _probe_pool(device_id: int, runtime: Any, stream: Callable[[], Any]) -> None:
    """Every call the heap makes, once, on one small block."""
    pool = CudaAsyncPool(device_id, runtime=runtime, stream=stream)
    try:
        pool.free_now(pool.malloc(512))
        _runtime("cudaMemPoolGetAttribute", runtime.memPoolGetAttribute, pool.handle,
                 runtime.cudaMemPoolAttrReservedMemCurrent)
        pool.synchronize()
        pool.trim()
    finally:
        pool.close()


def device_layer(device_id: int, total_memory: int, *, driver: Any = None, runtime: Any = None,
                 stream: Callable[[], Any] | None = None) -> tuple[dict, dict[str, str]]:
    """What the device supports, as :class:`~pgmo.engine.Backend` fields, and why not.

    Returns ``({"reserve": ..., "heap": ..., "device_memory": ..., "reasons": ...},
    reasons)``; ``reserve`` / ``heap`` are None where unsupported or refused
    by the driver's probe, and ``reasons`` says why (``stats().device_reasons``,
    ``memory_summary()``).  ``driver``, ``runtime`` and ``stream()`` default
    to ``cuda.bindings.driver``, ``cupy.cuda.runtime`` and CuPy's current
    stream (tests pass stand-ins).
    """
    reasons: dict[str, str] = {}
    fields: dict[str, Any] = {"reserve": None, "heap": None, "device_memory": total_memory,
                              "reasons": reasons}
    stream = stream or _current_stream
    if runtime is None:
        try:
            from cupy.cuda import runtime as cupy_runtime
        except ImportError as e:  # pragma: no cover - the pool imports CuPy first
            reasons["arena"] = reasons["heap"] = f"CuPy's runtime is missing ({e})"
            return fields, reasons
        runtime = cupy_runtime

    def synchronize() -> None:
        _runtime("cudaDeviceSynchronize", runtime.deviceSynchronize)

    try:
        granule = vmm_granularity(device_id, driver)
        if granule:
            joins = _probe_range(device_id, granule, driver, synchronize)

            def reserve(size: int) -> CudaRange:
                made = CudaRange(size, device_id, granule, driver=driver,
                                 synchronize=synchronize)
                made.joins_unmaps = joins
                return made

            reserve.joins_unmaps = joins  # type: ignore[attr-defined]  # (the quick check)

            fields["reserve"] = reserve
        else:
            reasons["arena"] = "the device has no virtual memory management"
    except ImportError:
        reasons["arena"] = "cuda-bindings is not installed (pip install 'pgmo[cuda13]')"
    except (DeviceError, MemoryError) as e:
        reasons["arena"] = f"the driver refused virtual memory management ({e})"
    except Exception as e:  # no driver, an old driver...
        reasons["arena"] = f"virtual memory management unavailable ({e})"
    try:
        if _runtime("cudaDeviceGetAttribute", runtime.deviceGetAttribute,
                    runtime.cudaDevAttrMemoryPoolsSupported, device_id):
            _probe_pool(device_id, runtime, stream)
            fields["heap"] = lambda: CudaAsyncPool(device_id, runtime=runtime, stream=stream)
        else:
            reasons["heap"] = "the device has no stream-ordered memory pools"
    except (DeviceError, MemoryError) as e:
        reasons["heap"] = f"the driver refused a stream-ordered pool ({e})"
    except Exception as e:
        reasons["heap"] = f"stream-ordered pools unavailable ({e})"
    for part, why in reasons.items():
        log.info("pgmo's %s uses cudaMalloc: %s", part, why)
    return fields, reasons
