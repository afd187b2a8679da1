# Types for the compiled build of reader.py (tunnel/build_mode.py).

cdef class FrameReader:
    cdef bytearray _partial
    cdef bint _preface_pending
    cdef public Py_ssize_t max_payload

    cpdef list feed(self, data)
    cdef _feed(self, data, list frames)
    cdef Py_ssize_t _complete_partial(self, bytes data, list frames) except -1
    cdef Py_ssize_t _check_length(self, bytearray buf) except -1
