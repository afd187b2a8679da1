# Types for the compiled build of stream_table.py (tunnel/build_mode.py): the
# state in a C struct, read without a dictionary or type lookup; every
# attribute stays readable from Python as before.

from tunnel.mux.outbound cimport Outbound
from tunnel.mux.receive_credit cimport ReceiveCredit

cdef class StreamTable:
    cdef public ReceiveCredit _credit
    cdef public Outbound _out
    cdef public object local_open
    cdef public object next_local_id
    cdef public object opened_total
    cdef public object peer_open
    cdef public dict streams
