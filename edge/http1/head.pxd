cimport cython

# Types for the compiled build of head.py (tunnel/build_mode.py): one source,
# these declarations beside it. Attributes other modules read are public.

cdef int _TOKEN_CHAR, _TARGET_CHAR, _VALUE_CHAR, _VISIBLE_CHAR


@cython.locals(
    classes=bytes, i=Py_ssize_t, start=Py_ssize_t, minor=Py_ssize_t, hundreds=Py_ssize_t,
    tens=Py_ssize_t, units=Py_ssize_t, size=Py_ssize_t, digits=Py_ssize_t,
    lengths=Py_ssize_t, chunked=bint, headers=list,
)
cpdef plain_head(bytes data, Py_ssize_t pos, Py_ssize_t end, bint response, Py_ssize_t max_headers)


cdef class _Callbacks:
    cdef public Py_ssize_t max_headers
    cdef public list headers
    cdef public bytes target
    cdef public bytes reason
    cdef public bint complete


cdef class HeadParser:
    cdef _Callbacks _callbacks
    cdef Py_ssize_t _fed
    cdef bint _is_response
    cdef bint _keep_raw
    cdef object _limits
    cdef object _line
    cdef bint _line_done
    cdef object _parser
    cdef list _raw
    cdef object _tail
    cdef public list headers
    cdef public bytes http_version
    cdef public bytes method
    cdef public bytes reason
    cdef public int status
    cdef public bytes target

    cpdef Py_ssize_t feed(self, data, Py_ssize_t pos) except? -2
    cdef Py_ssize_t _feed_whole(self, data, Py_ssize_t pos) except? -2
    cdef Py_ssize_t _feed_start_line(self, data, Py_ssize_t pos) except? -2
    cdef _start(self, line)
    cdef Py_ssize_t _feed_fields(self, data, Py_ssize_t pos) except? -2
    cdef _feed_llhttp(self, chunk)
    cdef _check_budget(self, Py_ssize_t extra)
