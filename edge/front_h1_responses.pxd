# Types for the compiled build of front_h1_responses.py (tunnel/build_mode.py).

cdef class Http1Responses:
    cdef public object _batch
    cdef public object _client_ip
    cdef public object _hsts
    cdef public int _paused
    cdef public bint close_after
    cdef public bint closing
    cdef public object ledger
    cdef public object requests
    cdef public object transport
