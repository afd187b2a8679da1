# Types for the compiled build of inbound.py (tunnel/build_mode.py): the
# state in a C struct, read without a dictionary or type lookup; every
# attribute stays readable from Python as before.

from tunnel.mux.outbound cimport Outbound
from tunnel.mux.receive_credit cimport ReceiveCredit
from tunnel.mux.stream_table cimport StreamTable

cdef class Inbound:
    cdef public object _budget
    cdef public object _client
    cdef public object _config
    cdef public object _control
    cdef public ReceiveCredit _credit
    cdef public Outbound _out
    cdef public object _pings
    cdef public StreamTable _table
    cdef public object closed_by_peer
    cdef public object established
    cdef public object goaway_received
    cdef public object last_peer_id
    cdef public dict peer_settings
    cdef public object version
