# Types for compiling frees.py with Cython in its "pure Python mode" (see handout.pxd).
# cython: language_level=3

cimport cython


cdef Py_ssize_t _INBOX_KEEP
cdef long long _KEY_BIAS


@cython.final
cdef class Arena:
    cdef public object buffer
    cdef public long long ptr
    cdef public long long size
    cdef public dict overdue


@cython.final
cdef class Counts:
    cdef public long long planned
    cdef public long long profiled
    cdef public long long departed
    cdef public long long pinned
    cdef public long long interrupted
    cdef public long long outside
    cdef public long long foreign


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
    cdef public long long source
    cdef public object on_free
