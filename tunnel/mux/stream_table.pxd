# Types for the compiled build of stream_table.py (tunnel/build_mode.py): the
# state in a C struct, read without a dictionary or type lookup; every
# attribute stays readable from Python as before.

cdef class StreamTable:
    cdef public object _credit
    cdef public object _out
    cdef public object local_open
    cdef public object next_local_id
    cdef public object opened_total
    cdef public object peer_open
    cdef public object streams
