# Types for the compiled build of front_h1_requests.py (tunnel/build_mode.py).
from edge.http1.request cimport RequestReader as _TypedReader  # edge.http1 re-exports the name
from edge.front_h1_responses cimport Http1Responses


cdef class Http1Requests:
    cdef object __weakref__
    cdef public bint _client_eof
    cdef public object _held
    cdef public object _metadata
    cdef public bint _redirect
    cdef public object _services
    cdef public double client_active_at
    cdef public object client_ip
    cdef public object exchange
    cdef public object phase
    cdef public double phase_since
    cdef public _TypedReader reader
    cdef public Py_ssize_t requests_seen
    cdef public Http1Responses responses
