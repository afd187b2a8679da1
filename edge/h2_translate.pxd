# Types for the compiled build of h2_translate.py (tunnel/build_mode.py): one
# H2Request per HTTP/2 request.
cdef int _COLON


cdef class H2Request:
    cdef public bint chunked
    cdef public bytes head
    cdef public bint websocket

