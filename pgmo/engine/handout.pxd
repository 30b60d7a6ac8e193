# Types for compiling handout.py with Cython in its "pure Python mode": the
# .py file stays the one source of the code; this file only declares the C
# layout, so that the plain-Python module and the compiled one do the same.
# cython: language_level=3

cimport cython
from cpython.pythread cimport PyThread_get_thread_ident

from pgmo.engine.frees cimport Arena, Counts, Inbox, Release


cdef long long _KEY_BIAS
cdef long long _KEY_LOW
cdef long long _ROUND_UP
cdef long long _ROUND_MASK
cdef long long _SOURCE_BITS
cdef long long _ARENA
cdef long long _STOCK
cdef long long _EXACT
cdef long long _KEPT
cdef long long _APART


@cython.locals(owner=Release)
cdef Release _release(Inbox inbox, long long index, long long iteration, long long size,
                      Arena arena, object keep, long long source)


@cython.final
cdef class HotPath:
    cdef public Inbox inbox
    cdef public object memory_type
    cdef public object pointer_type
    cdef public int device_id
    cdef public object slow
    cdef public object on_arena_idle
    cdef public object stock
    cdef public object exact
    cdef public object kept
    cdef public object reuse
    cdef public object between
    cdef public long long between_source
    cdef public object placer
    cdef public bint limited
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
    cdef public tuple log_arrays
    cdef public object thread_hooks
    cdef public object owner_hooks
    cdef public object hooked
    cdef public Py_ssize_t live_slots
    cdef public long long watched_frees
    cdef public long long used
    cdef public long long[:] source_used
    cdef public long long peak_used
    cdef public Counts counts

    cpdef connect(self, object stock, object exact, object kept, object reuse, object context,
                  object on_arena_idle, object between, long long between_source)

    cpdef share(self)

    cpdef set_limited(self, bint limited)

    cpdef set_placer(self, object placer)

    cpdef connect_hooks(self, object thread_hooks, object hooked, object owner_hooks)

    cpdef set_kind(self, int kind, bint in_iter)

    cpdef begin(self, unsigned long owner, object owner_hooks, object ctx, bint planned,
                Py_ssize_t max_n, Py_ssize_t log_size)

    cpdef end(self)

    cpdef install(self, list rows, object addresses=*)

    cpdef set_arena(self, Arena arena)

    @cython.locals(rows=list, overdue=dict, j=Py_ssize_t,
                   it=cython.longlong, o=cython.longlong)
    cpdef retire(self)

    cpdef reset_peak(self)

    cpdef long long arena_used(self)

    cpdef bint arena_idle(self, Arena arena)

    @cython.locals(rs=cython.longlong, i=Py_ssize_t, cap=cython.longlong, o=cython.longlong,
                   due=tuple, arena=Arena, row=tuple)
    cpdef object serve_inline(self, long long size, int kind)

    cpdef open_log(self, Py_ssize_t n)

    @cython.locals(k=Py_ssize_t)
    cpdef record(self, Py_ssize_t i, long long tick, long long rs)

    cpdef aim(self)

    @cython.locals(i=Py_ssize_t, it=cython.longlong, owner=Release, used=cython.longlong,
                   t=cython.longlong, pointer=object)
    cpdef object serve_planned(self, Arena arena, object size, long long rs)

    @cython.locals(placer=object, lo=cython.longlong, block=object)
    cpdef object serve_unplanned(self, long long rs)

    @cython.locals(i=Py_ssize_t, it=cython.longlong, owner=Release, used=cython.longlong,
                   t=cython.longlong, pointer=object)
    cpdef object serve_placed(self, Arena arena, long long lo, long long rs)

    @cython.locals(i=Py_ssize_t, t=cython.longlong, pointer=object)
    cpdef object serve_off_plan(self, object block, long long rs, bint pinned, long long source)

    @cython.locals(i=Py_ssize_t, t=cython.longlong, pointer=object)
    cpdef object serve_recorded(self, object block, long long rs, long long source)

    @cython.locals(owner=Release, used=cython.longlong)
    cpdef object outside_block(self, object block, long long rs, long long index,
                               long long iteration, long long source)

    @cython.locals(rows=list, overdue=dict, j=Py_ssize_t, it=cython.longlong,
                   o=cython.longlong, row=tuple)
    cpdef check_due(self, tuple due)

    @cython.locals(inbox=Inbox, items=list, k=Py_ssize_t, m=Py_ssize_t, owner=Release,
                   arenas=list, keys=list, sizes=list, key=cython.longlong,
                   arena=Arena, packed=cython.longlong)
    cpdef drain(self)

    @cython.locals(overdue=dict, row=tuple, span=tuple)
    cpdef apply_free(self, long long index, long long it, long long rs, Arena arena,
                     long long source)
