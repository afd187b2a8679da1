# Types for the compiled build of session.py (tunnel/build_mode.py): the
# session's parts in a C struct, typed, so that a command reaches them (and
# their own state) without a dictionary or type lookup; every attribute
# stays readable from Python as before.

from tunnel.mux.inbound cimport Inbound
from tunnel.mux.outbound cimport Outbound
from tunnel.mux.reader cimport FrameReader
from tunnel.mux.receive_credit cimport ReceiveCredit
from tunnel.mux.stream_table cimport StreamTable
from tunnel.mux.window cimport RttEstimator

cdef class Session:
    cdef public object _budget
    cdef public object _bytes_received
    cdef public object _control
    cdef public ReceiveCredit _credit
    cdef public Inbound _inbound
    cdef public object _last_measure_ping
    cdef public object _last_received
    cdef public object _next_ping_at
    cdef public Outbound _out
    cdef public object _pings
    cdef public FrameReader _reader
    cdef public object _stream_credit_sent
    cdef public dict _streams
    cdef public StreamTable _table
    cdef public object client
    cdef public object config
    cdef public dict peer_settings
    cdef public RttEstimator rtt
    cdef public object terminated
