# Types for the compiled build of h2_fields.py (tunnel/build_mode.py): the
# checks of every HTTP/2 request's fields are C functions.
cimport cython

cdef int _CR, _NUL, _SPACE, _TAB

cdef _declared_length(fields)
cdef _check_names(list names)
cdef _check_regular(fields, list names)
@cython.locals(value=bytes)
cdef _check_values(list values)
