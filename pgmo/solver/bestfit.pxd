# Types for compiling bestfit.py with Cython in its "pure Python mode" (as
# search_nodes.pxd): the .py file stays the one source of the code; this file declares
# the C layout of _Skyline, whose loops then run in C on int64 arrays.  The rest of the
# module (the plain-Python steps, the checks that pick one) compiles as Python.
# cython: language_level=3

cimport cython


cdef long long _HIGH


@cython.final
cdef class _Skyline:
    cdef Py_ssize_t n
    cdef Py_ssize_t size
    cdef long long first_tick
    cdef long long last_tick
    cdef long long[::1] lowers
    cdef long long[::1] uppers
    cdef long long[::1] sizes
    cdef long long[::1] by_lower
    cdef long long[::1] sorted_lowers
    cdef long long[::1] min_rank
    cdef long long[::1] min_upper
    cdef long long[::1] stack
    cdef long long[::1] start
    cdef long long[::1] end
    cdef long long[::1] height
    cdef long long[::1] prev
    cdef long long[::1] nxt
    cdef unsigned char[::1] alive
    cdef Py_ssize_t count
    cdef long long[::1] heap_h
    cdef long long[::1] heap_t
    cdef long long[::1] heap_k
    cdef Py_ssize_t heap_len

    @cython.locals(n=Py_ssize_t, check_every=cython.longlong, placed=Py_ssize_t,
                   taken=cython.longlong, s=Py_ssize_t, pos=Py_ssize_t, i=Py_ssize_t,
                   left=Py_ssize_t, right=Py_ssize_t, mid=Py_ssize_t,
                   h=cython.longlong, t0=cython.longlong, t1=cython.longlong,
                   hl=cython.longlong, hr=cython.longlong, target=cython.longlong,
                   t_from=cython.longlong, t_to=cython.longlong, lo=cython.longlong,
                   up=cython.longlong, top=cython.longlong, mid_from=cython.longlong,
                   mid_to=cython.longlong, right_rest=cython.bint,
                   offsets=cython.longlong[::1], lowers=cython.longlong[::1],
                   uppers=cython.longlong[::1], sizes=cython.longlong[::1],
                   by_lower=cython.longlong[::1], start=cython.longlong[::1],
                   end=cython.longlong[::1], height=cython.longlong[::1],
                   prev=cython.longlong[::1], nxt=cython.longlong[::1],
                   alive=cython.uchar[::1])
    cpdef list run(self, object budget)

    @cython.locals(k=Py_ssize_t)
    cdef Py_ssize_t _new_line(self, long long t0, long long t1, long long h, Py_ssize_t p,
                              Py_ssize_t q) noexcept

    @cython.locals(i=Py_ssize_t, parent=Py_ssize_t, ph=cython.longlong, pt=cython.longlong)
    cdef void _push(self, long long h, long long t, long long k) noexcept

    @cython.locals(first=Py_ssize_t, m=Py_ssize_t, h=cython.longlong, t=cython.longlong,
                   k=cython.longlong, i=Py_ssize_t, c=Py_ssize_t, ch=cython.longlong,
                   ct=cython.longlong)
    cdef Py_ssize_t _pop(self) noexcept

    cdef bint _before(self, Py_ssize_t a, Py_ssize_t b) noexcept

    @cython.locals(lo=Py_ssize_t, hi=Py_ssize_t, mid=Py_ssize_t)
    cdef Py_ssize_t _bisect(self, long long x) noexcept

    @cython.locals(node=Py_ssize_t, a=Py_ssize_t, r=cython.longlong, r2=cython.longlong,
                   u=cython.longlong, u2=cython.longlong)
    cdef void _remove(self, Py_ssize_t pos) noexcept

    @cython.locals(size=Py_ssize_t, depth=Py_ssize_t, a=Py_ssize_t, b=Py_ssize_t,
                   node=Py_ssize_t, left=Py_ssize_t, right=Py_ssize_t,
                   best_rank=cython.longlong, best_node=Py_ssize_t)
    cdef Py_ssize_t _best(self, Py_ssize_t lo, Py_ssize_t hi, long long t1) noexcept
