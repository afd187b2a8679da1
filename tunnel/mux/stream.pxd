# Types for the compiled build of stream.py (tunnel/build_mode.py): the
# state in a C struct, read without a dictionary or type lookup; every
# attribute stays readable from Python as before.

from tunnel.mux.window cimport ReceiveWindow

cdef class Stream:
    cdef public object end_sent
    cdef public object local
    cdef public object received_any
    cdef public ReceiveWindow recv_window
    cdef public object send_buffered
    cdef public object send_queue
    cdef public object send_window
    cdef public object stall_since
    cdef public object state
    cdef public object stream_id
