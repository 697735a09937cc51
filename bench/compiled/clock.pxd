cdef class Wake:
    cdef public object callbacks
