cimport cython

# Types for the compiled build of metadata.py (tunnel/build_mode.py): the
# origin decodes one StreamMetadata per request.

cdef class StreamMetadata:
    cdef public object alpn
    cdef public object client_address
    cdef public object edge_id
    cdef public dict extra
    cdef public object host
    cdef public object long_poll
    cdef public object method
    cdef public object request_id
    cdef public object server_address
    cdef public object server_name
    cdef public object target
    cdef public object tls_cipher
    cdef public object tls_resumed
    cdef public object tls_version


@cython.locals(key=int, stop=Py_ssize_t, text_by_key=dict)
cdef Py_ssize_t _decode_items(
    bytes data, Py_ssize_t pos, Py_ssize_t end, dict values, dict extra, frozenset stop_at=*
) except -1
