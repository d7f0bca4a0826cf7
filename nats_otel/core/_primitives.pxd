# What the kernel (`_kernel.pyx`) cimports from the leaf of primitives: a C call, not a
# Python one.

from libc.stdint cimport int64_t

cdef bytes context_fields_c(object trace_id, object parent_span_id)
cdef object timestamp_ns_c(object text)
cdef bint rfc3339_bytes_c(const unsigned char* text, Py_ssize_t n, int64_t* ns) noexcept
