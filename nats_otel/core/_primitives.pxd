# What the kernel (`_kernel.pyx`) cimports from the leaf of primitives: a C call, not a
# Python one.

cdef bytes context_fields_c(object trace_id, object parent_span_id)
