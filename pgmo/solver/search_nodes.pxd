# Types for compiling search_nodes.py with Cython in its "pure Python mode" (as
# pgmo/engine/handout.pxd): the .py file stays the one source of the code; this file
# declares the C layout of Nodes, whose loops then run in C on the search's arrays.
# cython: language_level=3

cimport cython


cdef long long BIG
cdef long long LOW


@cython.final
cdef class Nodes:
    cdef readonly long long n
    cdef readonly long long capacity
    cdef readonly bint any_pinned
    cdef long long[::1] floor
    cdef long long[::1] rank
    cdef long long[::1] load
    cdef long long[::1] size
    cdef long long[::1] members
    cdef long long[::1] starts
    cdef unsigned char[::1] pinned
    cdef long long[::1] first
    cdef long long[::1] last
    cdef long long[::1] reach_lo
    cdef long long[::1] reach_hi
    cdef long long[::1] near_start
    cdef long long[::1] near
    cdef long long[::1] saved
    cdef long long[::1] cuts
    cdef readonly Py_ssize_t depth
    cdef Py_ssize_t n_keys
    cdef long long[::1] rule_ranks
    cdef unsigned char[::1] is_peak

    @cython.locals(n=cython.longlong, m=Py_ssize_t, j=Py_ssize_t, i=cython.longlong,
                   c=Py_ssize_t, top=cython.longlong, lowest_top=cython.longlong,
                   pin_min=cython.longlong, max_load=cython.longlong,
                   last_key=cython.longlong, highest=cython.longlong, f=cython.longlong,
                   key=cython.longlong, found=list, floor=cython.longlong[::1],
                   size=cython.longlong[::1], rank=cython.longlong[::1],
                   pinned=cython.uchar[::1])
    cpdef object choices(self, long long[::1] part, Py_ssize_t s_lo, Py_ssize_t s_hi,
                         long long last_offset, long long last_block)

    @cython.locals(top=cython.longlong, lo=Py_ssize_t, hi=Py_ssize_t, j=Py_ssize_t,
                   k=cython.longlong, depth=Py_ssize_t, raised=cython.longlong,
                   s=cython.longlong, c=Py_ssize_t, c_lo=Py_ssize_t, c_hi=Py_ssize_t,
                   lowest=cython.longlong, floor=cython.longlong[::1],
                   near=cython.longlong[::1], pinned=cython.uchar[::1],
                   saved=cython.longlong[::1], members=cython.longlong[::1],
                   starts=cython.longlong[::1], load=cython.longlong[::1])
    cpdef int place(self, long long b, long long o, Py_ssize_t s_lo, Py_ssize_t s_hi)

    @cython.locals(depth=Py_ssize_t, s=cython.longlong, c=Py_ssize_t, count=cython.longlong,
                   floor=cython.longlong[::1], saved=cython.longlong[::1])
    cpdef void unplace(self, long long b, long long o)

    @cython.locals(c=Py_ssize_t, zero=list, cuts=cython.longlong[::1])
    cpdef list cut(self, long long b)

    @cython.locals(c=Py_ssize_t, cuts=cython.longlong[::1])
    cpdef void uncut(self, long long b)

    @cython.locals(m=Py_ssize_t, j=Py_ssize_t, i=cython.longlong, c=Py_ssize_t,
                   peak=cython.longlong, peaks=cython.longlong[::1], load=cython.longlong[::1],
                   first=cython.longlong[::1], last=cython.longlong[::1])
    cpdef object peak_loads(self, long long[::1] piece)

    @cython.locals(floor=cython.longlong[::1], first=cython.longlong[::1],
                   last=cython.longlong[::1], m=Py_ssize_t, count=Py_ssize_t,
                   edges=cython.longlong[::1], starts=cython.longlong[::1],
                   spans=cython.longlong[::1], flat=cython.longlong[::1],
                   filled=cython.longlong[::1], j=Py_ssize_t, i=cython.longlong,
                   p=Py_ssize_t, q=Py_ssize_t, lo=Py_ssize_t, hi=Py_ssize_t, mid=Py_ssize_t,
                   found=list)
    cpdef list pieces(self, long long[::1] part, list bounds)

    @cython.locals(m=Py_ssize_t, width=Py_ssize_t, n=Py_ssize_t,
                   rule_ranks=cython.longlong[::1], is_peak=cython.uchar[::1],
                   peaks=cython.longlong[::1], keys=cython.longlong[::1],
                   order=cython.longlong[::1], spare=cython.longlong[::1],
                   merged=cython.longlong[::1], rank=cython.longlong[::1],
                   j=Py_ssize_t, l=Py_ssize_t, run=Py_ssize_t, lo=Py_ssize_t, mid=Py_ssize_t,
                   hi=Py_ssize_t, a=Py_ssize_t, b=Py_ssize_t, out=Py_ssize_t,
                   x=Py_ssize_t, y=Py_ssize_t, later_first=cython.bint)
    cpdef void rerank(self, long long[::1] piece)
