# Types for the compiled build of events.py (tunnel/build_mode.py): the
# request head event is made once per request on the hot path.

cdef class RequestHeadReceived:
    cdef object _forwarded
    cdef bytes _head
    cdef tuple _headers
    cdef public bint chunked
    cdef public tuple client_fields
    cdef public object content_length
    cdef public bint expects_body
    cdef public object host
    cdef public bytes http_version
    cdef public bint idempotent
    cdef public bint keep_alive
    cdef public bytes method
    cdef public bint replayable
    cdef public str request_id
    cdef public bytes target
    cdef public str trace_id
    cdef public object websocket_upgrade


cdef class ResponseHeadReceived:
    cdef public bint chunked
    cdef public bint close_delimited
    cdef public object content_length
    cdef public bytes head
    cdef public tuple headers
    cdef public bytes http_version
    cdef public bint keep_alive
    cdef public frozenset nominated
    cdef public bytes reason
    cdef public int status
