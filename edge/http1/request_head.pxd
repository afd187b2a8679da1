# Types for the compiled build of request_head.py (tunnel/build_mode.py): the
# rules' helpers are C functions; _Rewrite stays a Python class (a test
# replaces its method to count the rewrites).
cimport cython

from edge.http1.head cimport HeadParser

cdef int _HOST, _CONTENT_LENGTH, _TRANSFER_ENCODING, _CONNECTION, _UPGRADE, _HOP_BY_HOP
cdef int _X_FORWARDED_FOR, _FORWARDED, _FORWARDING_KEPT_IF_TRUSTED, _REQUEST_ID, _WS_KEY
cdef int _WS_VERSION, _TRACE


cdef class ForwardingIdentity:
    cdef public bytes forwarded_for
    cdef public bytes ip
    cdef public bytes port
    cdef public bytes scheme
    cdef public bint trusted


cdef class _Fields:
    cdef public list connection
    cdef public list content_length
    cdef public list forwarded
    cdef public list hosts
    cdef public list kept
    cdef public list pairs
    cdef public list request_ids
    cdef public list trace
    cdef public list transfer_encoding
    cdef public set trusted_present
    cdef public list upgrade
    cdef public list ws_keys
    cdef public list ws_versions
    cdef public list x_forwarded_for


cdef class RequestIds:
    cdef Py_ssize_t _count
    cdef bytes _prefix

    cpdef bytes next_id(self)


cpdef build_request_head(HeadParser parsed, ForwardingIdentity identity, request_id_factory)
cdef _check_host(list hosts, bytes version)
cdef bytes _origin_form(bytes method, bytes target, host)
cdef tuple _framing(_Fields fields, bytes version)
cdef _websocket_handshake(
    _Fields fields, bytes method, bytes version, list connection, content_length, bint chunked
)
@cython.locals(sequence=RequestIds)
cdef bytes _request_id(list ids, bint trusted, factory)
cdef _append_forwarding(
    list out, _Fields fields, ForwardingIdentity identity, host, bytes request_id
)
cdef tuple _trace_id(list trace, bint trusted, bytes request_id)
cdef bytes _forwarded_value(bytes value)
