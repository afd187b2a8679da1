# Types for the compiled build of exchange.py (tunnel/build_mode.py): the
# exchange's state in a C struct; every attribute stays readable as before.

cdef class Exchange:
    cdef object __weakref__
    cdef public object _connection_metadata
    cdef public bint _decode_chunked
    cdef public object _head
    cdef public object _method
    cdef public object _wait
    cdef public object client
    cdef public bint finished
    cdef public object record
    cdef public bint request_whole
    cdef public bint response_paused
    cdef public object services
    cdef public bint upgraded
    cdef public object upstream
    cdef public double upstream_active_at
    cdef public object websocket_key
    cdef public object ws_closing
    cdef public object ws_up
