"""Every NumPy data allocation of the process, logged into a RunRecorder.

The other way :mod:`scripts.record_runs` can capture a CPU run (``--capture numpy``):
NumPy's data allocator is replaced for the process (NumPy's
``PyDataMem_SetHandler``, through the ``numpy-allocator`` package) by one that
logs each allocation and free.  It sees everything NumPy allocates, including
the temporaries of Chainer's CPU code paths, which are not those of its GPU
paths (e.g. MomentumSGD's ``lr * grad`` on the CPU is one fused kernel
without a temporary on the GPU), less NumPy's scalar temporaries, which CuPy
does not allocate (left out, counted).
"""

from __future__ import annotations

import ctypes

from pgmo.runs import RunRecorder

#: NumPy's scalar temporaries are at most this many bytes (see NumpyAllocations.apply).
SCALAR = 64


class NumpyAllocations:
    """NumPy's data allocator, replaced while active by one that logs into a RunRecorder.

    Each callback only appends to a list (an allocation can happen anywhere,
    a free inside the garbage collector); :meth:`apply` turns the list into
    the recorder's events, outside NumPy.  Arrays made while active are freed
    through this allocator wherever they die, as NumPy keeps each array's
    allocator with it.
    """

    def __init__(self, recorder: RunRecorder):
        import numpy_allocator

        self.recorder = recorder
        self.events: list[tuple[int, int, int]] = []  # (1 alloc / 0 free, address, size)
        self.scalars = 0  # scalar temporaries left out (see apply)
        self.handles: dict[int, int] = {}
        libc = ctypes.CDLL(None)
        for name, res, args in (("malloc", ctypes.c_void_p, [ctypes.c_size_t]),
                                ("calloc", ctypes.c_void_p, [ctypes.c_size_t] * 2),
                                ("realloc", ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_size_t]),
                                ("free", None, [ctypes.c_void_p])):
            getattr(libc, name).restype, getattr(libc, name).argtypes = res, args
        events = self.events

        @ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_size_t)
        def malloc(size):
            ptr = libc.malloc(size)
            if ptr:
                events.append((1, ptr, size))
            return ptr

        @ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t)
        def calloc(nelem, elsize):
            ptr = libc.calloc(nelem, elsize)
            if ptr:
                events.append((1, ptr, nelem * elsize))
            return ptr

        @ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
        def realloc(ptr, size):
            new = libc.realloc(ptr, size)
            if new:
                if ptr:
                    events.append((0, ptr, 0))
                events.append((1, new, size))
            return new

        @ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_size_t)
        def free(ptr, size):
            if ptr:
                events.append((0, ptr, size))
            libc.free(ptr)

        class Logging(metaclass=numpy_allocator.type):
            _malloc_, _calloc_, _realloc_, _free_ = malloc, calloc, realloc, free

        self.allocator = Logging
        self._keep = (malloc, calloc, realloc, free)  # the C callbacks must outlive it

    def __enter__(self):
        self.allocator.__enter__()
        return self

    def __exit__(self, *exc):
        self.allocator.__exit__(*exc)
        self.apply()

    def begin(self) -> None:
        """An iteration starts now (after what was allocated and freed so far)."""
        self.apply()
        self.recorder.begin()

    def end(self) -> None:
        self.apply()
        self.recorder.end()

    def apply(self) -> None:
        """Log the allocations and frees so far on the run's event clock, in order.

        NumPy's scalar temporaries (:data:`SCALAR` bytes at most, freed within
        two events) are left out and counted: on a GPU CuPy passes scalars to
        its kernels as arguments, with no allocation.
        """
        events, self.events[:] = list(self.events), []
        rec, handles = self.recorder, self.handles
        skip = set()
        for k, (alloc, ptr, size) in enumerate(events):
            if alloc and 0 < size <= SCALAR:
                for j in range(k + 1, min(k + 4, len(events))):
                    if events[j][0] == 0 and events[j][1] == ptr:
                        skip.update((k, j))
                        self.scalars += 1
                        break
        for k, (alloc, ptr, size) in enumerate(events):
            if k in skip:
                continue
            if alloc:
                if size:
                    handles[ptr] = rec.alloc(size)
            else:
                handle = handles.pop(ptr, None)
                if handle is not None:  # a zero-size one, or made before recording
                    rec.free(handle)
