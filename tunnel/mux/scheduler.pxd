# Types for the compiled build of scheduler.py (tunnel/build_mode.py): the
# state in a C struct, read without a dictionary or type lookup; every
# attribute stays readable from Python as before.

cdef class RoundRobin:
    cdef public object _members
    cdef public object _queue
