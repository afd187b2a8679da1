# Types for the compiled build of window.py (tunnel/build_mode.py): the
# state in a C struct, read without a dictionary or type lookup; every
# attribute stays readable from Python as before.

cdef class ReceiveWindow:
    cdef public object _epoch_start_offset
    cdef public object _epoch_start_time
    cdef public object consumed
    cdef public object limit
    cdef public object max_size
    cdef public object min_size
    cdef public object received
    cdef public object size

cdef class RttEstimator:
    cdef public object latest
    cdef public object min
    cdef public object smoothed
