# Types for compiling handout.py with Cython in its "pure Python mode": the
# .py file stays the one source of the code; this file only declares the C
# layout, so that the plain-Python module and the compiled one do the same.
# The engine reads the readonly fields; the rest, and the cdef methods, are
# the hot path's own (invisible from Python when compiled).
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
cdef Py_ssize_t _CAP
cdef Py_ssize_t _OFFSET
cdef Py_ssize_t _DUE


@cython.locals(owner=Release)
cdef Release _release(Inbox inbox, long long index, long long iteration, long long size,
                      Arena arena, object keep, long long source)


@cython.final
cdef class HotPath:
    cdef readonly Inbox inbox
    cdef object _memory_type
    cdef object _pointer_type
    cdef int _device_id
    cdef object _slow
    cdef object _on_departure
    cdef object _on_late_free
    cdef object _on_arena_idle
    cdef object _stock
    cdef object _exact
    cdef object _kept
    cdef object _reuse
    cdef object _between
    cdef long long _between_source
    cdef object _device
    cdef object _placer
    cdef bint _limited
    cdef object _context
    cdef readonly object ctx
    cdef readonly unsigned long owner
    cdef object _owner_hooks
    cdef readonly int kind
    cdef readonly bint solo
    cdef readonly bint busy
    cdef bint _in_iter
    cdef bint _planned_iter
    cdef list _rows
    cdef list _addresses
    cdef long long[:] _slot
    cdef readonly Arena arena
    cdef readonly long long iteration
    cdef bint _logging_frees
    cdef readonly Py_ssize_t n
    cdef Py_ssize_t _max_n
    cdef long long _tick
    cdef long long[:] _obs_sizes
    cdef long long[:] _obs_lowers
    cdef long long[:] _obs_uppers
    cdef readonly tuple log_arrays
    cdef Py_ssize_t _live_slots
    cdef readonly long long watched_frees
    cdef readonly long long used
    cdef long long[:] _source_used
    cdef readonly long long peak_used
    cdef readonly Counts counts

    cpdef connect(self, object stock, object exact, object kept, object reuse, object context,
                  object on_arena_idle, object between, long long between_source,
                  object device=*)

    cpdef share(self)

    cpdef set_limited(self, bint limited)

    cpdef set_placer(self, object placer)

    cpdef set_owner_hooks(self, object owner_hooks)

    cpdef set_kind(self, int kind, bint in_iter)

    @cython.locals(lowers=object, uppers=object, sizes=object)
    cpdef begin(self, unsigned long owner, object owner_hooks, object ctx, bint planned,
                Py_ssize_t max_n, Py_ssize_t log_size)

    cpdef end(self)

    @cython.locals(slots=object)
    cpdef install(self, list rows, object addresses=*)

    @cython.locals(base=cython.longlong, row=tuple)
    cpdef list addresses_for(self, list rows)

    cpdef set_arena(self, Arena arena)

    @cython.locals(arena=Arena, rows=list, overdue=dict, j=Py_ssize_t,
                   it=cython.longlong, o=cython.longlong, span=tuple)
    cpdef retire(self)

    cpdef reset_peak(self)

    cpdef long long arena_used(self)

    cpdef long long source_bytes(self, Py_ssize_t source)

    cpdef bint arena_idle(self, Arena arena)

    @cython.locals(spans=list, span=tuple, rows=list, j=Py_ssize_t, o=cython.longlong)
    cpdef list live_spans(self, Arena arena)

    cpdef object null_block(self)

    @cython.locals(kind=int, inbox=Inbox, n=cython.longlong, rs=cython.longlong,
                   result=object)
    cpdef object malloc(self, object size)

    cdef object _serve_unnumbered(self, object size, long long rs)

    @cython.locals(i=Py_ssize_t, cap=cython.longlong, o=cython.longlong, due=tuple,
                   arena=Arena, row=tuple, late=tuple, block=object)
    cpdef object serve_numbered(self, long long rs)

    @cython.locals(pointer=object, owner=Release)
    cpdef object serve_outside(self, object block, long long rs, long long source,
                               bint foreign, long long index, long long iteration)

    cdef _open_log(self, Py_ssize_t n)

    @cython.locals(k=Py_ssize_t)
    cdef _room_in_log(self, Py_ssize_t i)

    cdef _aim(self)

    @cython.locals(span=tuple)
    cdef tuple _overdue_in(self, Arena arena, long long lo, long long hi)

    @cython.locals(i=Py_ssize_t, it=cython.longlong, owner=Release, t=cython.longlong,
                   pointer=object)
    cdef object _serve_planned(self, Arena arena, object size, long long rs)

    @cython.locals(placer=object, lo=cython.longlong, block=object, arena=Arena)
    cdef object _serve_unplanned(self, long long rs)

    @cython.locals(i=Py_ssize_t, it=cython.longlong, owner=Release, t=cython.longlong,
                   pointer=object, span=tuple)
    cdef object _serve_placed(self, Arena arena, long long lo, long long rs)

    @cython.locals(i=Py_ssize_t, t=cython.longlong, pointer=object, owner=Release)
    cdef object _serve_off_plan(self, object block, long long rs, bint pinned, long long source)

    @cython.locals(i=Py_ssize_t, t=cython.longlong, pointer=object, owner=Release)
    cdef object _serve_recorded(self, object block, long long rs, long long source)

    @cython.locals(rows=list, arena=Arena, overdue=dict, j=Py_ssize_t, it=cython.longlong,
                   o=cython.longlong, row=tuple, span=tuple)
    cdef _check_due(self, tuple due)

    @cython.locals(inbox=Inbox, items=list, k=Py_ssize_t, m=Py_ssize_t, owner=Release,
                   arenas=list, keys=list, sizes=list, key=cython.longlong,
                   packed=cython.longlong)
    cpdef drain(self)

    @cython.locals(overdue=dict, row=tuple, span=tuple, logged=bint, t=cython.longlong,
                   key=cython.longlong, placer=object)
    cdef _apply_free(self, long long index, long long it, long long rs, Arena arena,
                     long long source, list entries, Py_ssize_t k, object cleared)
