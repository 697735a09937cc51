cdef class Sharing:
    cdef public object count, _links, _pairs, _size, _scratch, _users
