# Types for the compiled build of receive_credit.py (tunnel/build_mode.py): the
# state in a C struct, read without a dictionary or type lookup; every
# attribute stays readable from Python as before.

from tunnel.mux.outbound cimport Outbound
from tunnel.mux.window cimport ReceiveWindow, RttEstimator

cdef class ReceiveCredit:
    cdef public object _config
    cdef public Outbound _out
    cdef public RttEstimator _rtt
    cdef public object announced_stream_window
    cdef public object credit_sent
    cdef public object learned_window
    cdef public ReceiveWindow window
