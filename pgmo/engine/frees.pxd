# Types for compiling frees.py with Cython in its "pure Python mode" (see handout.pxd).
# Fields are readonly from Python (the hot path writes them through C), but an arena's
# size (memory.py grows and trims it) and a Release's on_free (the pool's hooks).
# cython: language_level=3

cimport cython


cdef Py_ssize_t _INBOX_KEEP
cdef long long _KEY_BIAS


@cython.final
cdef class Arena:
    cdef readonly object buffer
    cdef readonly long long ptr
    cdef public long long size
    cdef readonly dict overdue


@cython.final
cdef class Counts:
    cdef readonly long long planned
    cdef readonly long long profiled
    cdef readonly long long departed
    cdef readonly long long pinned
    cdef readonly long long interrupted
    cdef readonly long long outside
    cdef readonly long long foreign


@cython.final
cdef class Inbox:
    cdef readonly list items
    cdef readonly list keys
    cdef readonly list sizes
    cdef readonly list arenas
    cdef readonly Py_ssize_t count
    cdef readonly bint closed

    @cython.locals(key=cython.longlong, n=Py_ssize_t)
    cpdef record(self, long long index, long long iteration, long long size, object arena)

    @cython.locals(keys=list, sizes=list, arenas=list, n=Py_ssize_t, k=Py_ssize_t)
    cpdef consumed(self, Py_ssize_t m)


# Compiled, Release reports its free from __dealloc__ and is never resurrected.
@cython.final
@cython.freelist(64)
cdef class Release:
    cdef readonly Inbox inbox
    cdef readonly long long index
    cdef readonly long long iteration
    cdef readonly long long size
    cdef readonly Arena arena
    cdef readonly object keep
    cdef readonly long long source
    cdef public object on_free
    cdef readonly bint armed
