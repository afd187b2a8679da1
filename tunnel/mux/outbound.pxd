# Types for the compiled build of outbound.py (tunnel/build_mode.py): the
# state in a C struct, read without a dictionary or type lookup; every
# attribute stays readable from Python as before.

from tunnel.mux.scheduler cimport RoundRobin

cdef class Outbound:
    cdef public object _blocked_since
    cdef public object _max_pending_control
    cdef public object bytes_sent
    cdef public list control
    cdef public object goaway_sent
    cdef public object max_frame
    cdef public RoundRobin scheduler
    cdef public object stalled
    cdef public object stalled_s
    cdef public object stalls
    cdef public object window
    cdef public object window_blocked_s
