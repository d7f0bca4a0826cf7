# Direct reads of msgspec Struct fields (`_fields.h`), included by the kernel: the offsets
# are found once, when it is imported (`_records.pxi`), and each read is a load.

cdef extern from "_fields.h":
    Py_ssize_t field_offset "nats_otel_field_offset"(object cls, object name) except -1
    object field "nats_otel_field"(object obj, Py_ssize_t offset)
    void set_field "nats_otel_set_field"(object obj, Py_ssize_t offset, object value)
    # `tuple.__new__(cls, values)` of `n` values laid in a C array (`_record3` ... below):
    # only for the NamedTuple classes and the `TraceHeaders` `_records.pxi` checks
    object _record_n "nats_otel_record_n"(object cls, Py_ssize_t n, PyObject** items)
    # a new Struct, its fields unset, and a Struct's copy: only for the classes `_plain` checks
    object _struct_new "nats_otel_struct_new"(object cls)
    object _struct_copy "nats_otel_struct_copy"(object obj)

from msgspec.structs import fields as _struct_fields


# `tuple.__new__(cls, (a, b, ...))` for the records made per trace message, without the
# tuple of values in between: the arguments stay alive in the caller through the call.
cdef inline object _record3(object cls, object a, object b, object c):
    cdef PyObject* items[3]
    items[0], items[1], items[2] = <PyObject*>a, <PyObject*>b, <PyObject*>c
    return _record_n(cls, 3, items)


cdef inline object _record4(object cls, object a, object b, object c, object d):
    cdef PyObject* items[4]
    items[0], items[1], items[2], items[3] = <PyObject*>a, <PyObject*>b, <PyObject*>c, <PyObject*>d
    return _record_n(cls, 4, items)


cdef inline object _record5(object cls, object a, object b, object c, object d, object e):
    cdef PyObject* items[5]
    items[0], items[1], items[2], items[3], items[4] = <PyObject*>a, <PyObject*>b, <PyObject*>c, <PyObject*>d, <PyObject*>e
    return _record_n(cls, 5, items)


cdef dict _offsets(object cls, str names):
    """The offset of each named field in `cls`'s objects (Cython makes the struct of the
    dict the caller assigns it to)."""
    return {name: field_offset(cls, name) for name in names.split()}


cdef void _plain(object cls, bint hooks_allowed=False) except *:
    """Raise TypeError unless `cls` is a msgspec Struct class `_struct_new` and `_struct_copy`
    may make: not tracked by the GC, nothing in its objects but its fields' slots (one each,
    laid end to end after the object's header) and, unless `hooks_allowed` (the parse's
    copies, which msgspec's `__copy__` makes without the hook too), no `__post_init__`."""
    offsets = sorted(field_offset(cls, f.name) for f in _struct_fields(cls))
    slots = list(range(object.__basicsize__, cls.__basicsize__, sizeof(PyObject*)))  # after the header
    tracked = cls.__flags__ & (1 << 14)  # Py_TPFLAGS_HAVE_GC
    hook = getattr(cls, "__post_init__", None) is not None
    if tracked or cls.__itemsize__ or offsets != slots or (hook and not hooks_allowed):
        raise TypeError(f"{cls.__name__} is not a plain Struct the kernel can make")


cdef inline object _read(object obj, object cls, Py_ssize_t offset, str name):
    """`obj.<name>`: at its offset when `obj` is exactly `cls` (whose offsets were taken), by
    name from anything else (a subclass or a stand-in is read as Python reads it)."""
    if type(obj) is cls:
        return field(obj, offset)
    return getattr(obj, name)
