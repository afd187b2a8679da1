# Types for the compiled build of connection_writer.py (tunnel/build_mode.py): the
# state in a C struct, read without a dictionary or type lookup; every
# attribute stays readable from Python as before.

cdef class ConnectionWriter:
    cdef public object _dispatch
    cdef public object _flush_scheduled
    cdef public object _loop
    cdef public object _reading
    cdef public object _timer
    cdef public object _timer_at
    cdef public object _write_watch
    cdef public object session
    cdef public object transport
    cdef public object writing_paused
