# Types for the compiled build of request.py (tunnel/build_mode.py).
from edge.http1.head cimport HeadParser
from edge.http1.request_head cimport ForwardingIdentity

cdef int _HEAD, _BODY_LENGTH, _BODY_CHUNKED, _UPGRADE_HELD, _TUNNEL, _DRAINING, _DEAD


cdef class RequestReader:
    cdef object _chunked
    cdef bint _eof
    cdef HeadParser _head
    cdef object _held
    cdef ForwardingIdentity _identity
    cdef bint _keep_alive
    cdef object _limits
    cdef Py_ssize_t _remaining
    cdef object _request_id_factory
    cdef object _stash
    cdef int _state

    cpdef list feed(self, data)
    cdef list _parse(self, data)
    cdef _consume(self, data, list events)
    cdef _start_request(self, list events)
    cdef Py_ssize_t _read_chunked(self, data, Py_ssize_t pos, list events) except? -2
    cdef _complete(self, list events)
    cdef list _hold(self, data)
    cdef list _reject(self, int status, str reason)
