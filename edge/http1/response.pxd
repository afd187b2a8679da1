# Types for the compiled build of response.py (tunnel/build_mode.py).
from edge.http1.events cimport ResponseHeadReceived
from edge.http1.head cimport HeadParser

cdef int _HEAD, _BODY_LENGTH, _BODY_CHUNKED, _BODY_UNTIL_EOF, _TUNNEL, _CLOSING, _DEAD


cdef class ResponseReader:
    cdef object _chunked
    cdef bint _close_after
    cdef bint _decode
    cdef bint _eof
    cdef HeadParser _head
    cdef object _limits
    cdef object _pending
    cdef Py_ssize_t _remaining
    cdef bint _started
    cdef object _stash
    cdef int _state

    cpdef list feed(self, data)
    cdef _consume(self, data, list events)
    cdef _on_head(self, list events)
    cdef _start_body(self, HeadParser head, list headers, method, list events)
    cdef _complete(self, list events, trailers=*)


cdef ResponseHeadReceived _head_event(
    HeadParser head, list headers, bint keep_alive, content_length, bint chunked
)
cdef tuple _framing(list headers, bytes version)
