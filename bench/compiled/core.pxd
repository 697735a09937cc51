cimport cython

cdef class Stream:
    cdef public object env, rank, ops, waiters
    cdef public long long[:] indices
    cdef public double[:] starts, finish, sent, release, offset
    cdef public long long[:] anchor
    cdef public Py_ssize_t count, pos, held
    cdef public object meeting, arrive, scale_of, advance, _end
    cdef public object queue, eid, ledger, callbacks, on_end, on_release
    @cython.locals(pos=Py_ssize_t, now=double, release=double, a="long long", delay=double, i=Py_ssize_t, d=Py_ssize_t)
    cpdef _advance(self, _event=*)
    @cython.locals(pos=Py_ssize_t, now=double, i=Py_ssize_t)
    cpdef _ended(self, _event)

cdef class OpTimes:
    cdef public object start, end, sent

cdef class Meeting:
    cdef public object done, sent, expected, members, start

cdef class Engine:
    cdef public object env, topo, net, programs, compute_scale, folded_arrival, simulated, times, _programs
    cdef public object _rendezvous, waits, held_by, arrived, _expected, _waiters, _member_bytes, _schedules
    cdef public object _shapes, collectives_run
    cdef object __weakref__
