# Types for compiling handout.py with Cython in its "pure Python mode": the
# .py file stays the one source of the code; this file only declares the C
# layout, so that the plain-Python module and the compiled one do the same.
# cython: language_level=3

cimport cython
from cpython.pythread cimport PyThread_get_thread_ident


cdef long long _KEY_BIAS
cdef long long _KEY_LOW
cdef Py_ssize_t _INBOX_KEEP
cdef long long _ROUND_UP
cdef long long _ROUND_MASK


@cython.final
cdef class Arena:
    cdef public object buffer
    cdef public long long ptr
    cdef public long long size
    cdef public dict overdue


@cython.final
cdef class Inbox:
    cdef public list items
    cdef public list keys
    cdef public list sizes
    cdef public list arenas
    cdef public Py_ssize_t count
    cdef public bint closed

    @cython.locals(key=cython.longlong, n=Py_ssize_t)
    cpdef record(self, long long index, long long iteration, long long size, object arena)

    @cython.locals(keys=list, sizes=list, arenas=list, n=Py_ssize_t, k=Py_ssize_t)
    cpdef consumed(self, Py_ssize_t m)


# Compiled, Release reports its free from __dealloc__ and is never resurrected.
@cython.final
@cython.freelist(64)
cdef class Release:
    cdef public Inbox inbox
    cdef public long long index
    cdef public long long iteration
    cdef public long long size
    cdef public Arena arena
    cdef public object keep
    cdef public object on_free


@cython.locals(owner=Release)
cdef Release _release(Inbox inbox, long long index, long long iteration, long long size,
                      Arena arena, object keep)


@cython.final
cdef class HotPath:
    cdef public Inbox inbox
    cdef public object memory_type
    cdef public object pointer_type
    cdef public int device_id
    cdef public object slow
    cdef public object on_arena_idle
    cdef public object fallback
    cdef public object context
    cdef public object ctx
    cdef public unsigned long owner
    cdef public int kind
    cdef public bint solo
    cdef public bint busy
    cdef public bint in_iter
    cdef public bint planned_iter
    cdef public list rows
    cdef public list addresses
    cdef public long long[:] slot
    cdef public Arena arena
    cdef public long long iteration
    cdef public bint logging_frees
    cdef public Py_ssize_t n
    cdef public Py_ssize_t max_n
    cdef public long long tick
    cdef public long long[:] obs_sizes
    cdef public long long[:] obs_lowers
    cdef public long long[:] obs_uppers
    cdef public object thread_hooks
    cdef public object owner_hooks
    cdef public object hooked
    cdef public Py_ssize_t live_slots
    cdef public long long watched_frees
    cdef public long long used
    cdef public long long fb_used
    cdef public long long peak_used
    cdef public long long planned_requests
    cdef public long long profiled_requests
    cdef public long long fallback_requests
    cdef public long long pinned_requests
    cdef public long long interrupted_requests
    cdef public long long other_requests


    @cython.locals(rs=cython.longlong, i=Py_ssize_t, cap=cython.longlong, o=cython.longlong,
                   due=tuple, arena=Arena, row=tuple)
    cpdef object serve_inline(self, long long size, int kind)

    cpdef open_log(self, Py_ssize_t n)

    @cython.locals(i=Py_ssize_t)
    cpdef tuple log_columns(self, Py_ssize_t n)

    @cython.locals(i=Py_ssize_t)
    cpdef list survivors(self, Py_ssize_t n)

    @cython.locals(k=Py_ssize_t)
    cpdef record(self, Py_ssize_t i, long long tick, long long rs)

    cpdef aim(self)

    @cython.locals(i=Py_ssize_t, it=cython.longlong, owner=Release, used=cython.longlong,
                   t=cython.longlong, pointer=object)
    cpdef object serve_planned(self, Arena arena, object size, long long rs)

    @cython.locals(i=Py_ssize_t, t=cython.longlong, pointer=object)
    cpdef object serve_off_plan(self, object block, long long rs, bint pinned)

    @cython.locals(i=Py_ssize_t, t=cython.longlong, pointer=object)
    cpdef object serve_recorded(self, object block, long long rs)

    @cython.locals(owner=Release, used=cython.longlong)
    cpdef object fallback_block(self, object block, long long rs, long long index,
                                long long iteration)

    @cython.locals(rows=list, overdue=dict, j=Py_ssize_t, it=cython.longlong,
                   o=cython.longlong, row=tuple)
    cpdef check_due(self, tuple due)

    @cython.locals(inbox=Inbox, items=list, k=Py_ssize_t, m=Py_ssize_t, owner=Release,
                   arenas=list, keys=list, sizes=list, key=cython.longlong,
                   arena=Arena)
    cpdef drain(self)

    @cython.locals(overdue=dict)
    cpdef apply_free(self, long long index, long long it, long long rs, Arena arena)
