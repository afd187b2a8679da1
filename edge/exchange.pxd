# Types for the compiled build of exchange.py (tunnel/build_mode.py): the
# exchange's state in a C struct; every attribute stays readable as before.

cdef class Exchange:
    cdef object __weakref__
    cdef public object _connection_metadata
    cdef public object _head
    cdef public object _method
    cdef public object _wait
    cdef public object client
    cdef public object connection_metadata
    cdef public bint decode_chunked
    cdef public bint finished
    cdef public bint frame_h1
    cdef public object record
    cdef public object request
    cdef public bint request_whole
    cdef public bint response_paused
    cdef public object services
    cdef public bint upgraded
    cdef public object upstream
    cdef public double upstream_active_at
    cdef public object websocket_key
    cdef public object ws_closing
    cdef public object ws_up
