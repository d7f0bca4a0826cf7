# Direct reads of msgspec Struct fields (`_fields.h`), included by the kernel: the offsets
# are found once, when it is imported (`_records.pxi`), and each read is a load.

cdef extern from "_fields.h":
    Py_ssize_t field_offset "nats_otel_field_offset"(object cls, object name) except -1
    object field "nats_otel_field"(object obj, Py_ssize_t offset)
    void set_field "nats_otel_set_field"(object obj, Py_ssize_t offset, object value)
    # `tuple.__new__(cls, values)`: only for the NamedTuple classes `_records.pxi` checks
    object _new "nats_otel_record"(object cls, tuple values)


cdef dict _offsets(object cls, str names):
    """The offset of each named field in `cls`'s objects (Cython makes the struct of the
    dict the caller assigns it to)."""
    return {name: field_offset(cls, name) for name in names.split()}


cdef inline object _read(object obj, object cls, Py_ssize_t offset, str name):
    """`obj.<name>`: at its offset when `obj` is exactly `cls` (whose offsets were taken), by
    name from anything else (a subclass or a stand-in is read as Python reads it)."""
    if type(obj) is cls:
        return field(obj, offset)
    return getattr(obj, name)
