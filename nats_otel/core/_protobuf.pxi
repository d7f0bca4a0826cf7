# Shared by the compiled encoders (`include`d): a growable C byte buffer and the protobuf
# writers of OTLP's AnyValue and KeyValue, as `otlp_wire` writes them. Two conventions:
# the buffer's `put*` return 0 (or -1 with an exception set); the value writers
# (`put_utf8`, `put_any_value`, `put_key_value`) return 1 when done and 0 for what they do
# not do in C, which the caller then hands to the Python twin.

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_CheckExact, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.float cimport PyFloat_AS_DOUBLE, PyFloat_Check
from cpython.long cimport PyLong_AsLongLong, PyLong_AsUnsignedLongLong, PyLong_Check
from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_Realloc
from cpython.object cimport PyObject
from cpython.tuple cimport PyTuple_Check, PyTuple_GET_ITEM, PyTuple_GET_SIZE
from cpython.unicode cimport PyUnicode_CheckExact
from libc.stdint cimport int64_t, uint64_t
from libc.string cimport memcpy


cdef extern from "Python.h":
    const char* PyUnicode_AsUTF8AndSize(object unicode, Py_ssize_t* size) except NULL
    int PyFloat_Pack8(double x, char* p, int le) except -1
    int PyUnicode_Tailmatch(object s, object substr, Py_ssize_t start, Py_ssize_t end, int direction) except -1
    int PyBool_Check(object o)
    PyObject* PyDict_GetItemWithError(object d, object key) except? NULL
    PyObject* Py_True


cdef enum:
    _MAX_DEPTH = 16  # nested arrays deeper than this go to Python (no deep C recursion)


# --- a growable byte buffer ------------------------------------------------------------

cdef struct Buf:
    char* data
    Py_ssize_t size
    Py_ssize_t cap


cdef int buf_init(Buf* b, Py_ssize_t cap) except -1:
    b.data = <char*>PyMem_Malloc(cap)
    if b.data == NULL:
        raise MemoryError()
    b.size = 0
    b.cap = cap
    return 0


cdef int buf_reserve(Buf* b, Py_ssize_t extra) except -1:
    cdef Py_ssize_t cap
    cdef char* data
    if b.size + extra <= b.cap:
        return 0
    cap = b.cap * 2
    while cap < b.size + extra:
        cap *= 2
    data = <char*>PyMem_Realloc(b.data, cap)
    if data == NULL:
        raise MemoryError()
    b.data = data
    b.cap = cap
    return 0


cdef inline void buf_free(Buf* b):
    if b.data != NULL:
        PyMem_Free(b.data)
        b.data = NULL


cdef inline int put(Buf* b, const char* p, Py_ssize_t n) except -1:
    if b.size + n > b.cap:
        buf_reserve(b, n)
    memcpy(b.data + b.size, p, n)
    b.size += n
    return 0


cdef inline int put_byte(Buf* b, unsigned char c) except -1:
    if b.size + 1 > b.cap:
        buf_reserve(b, 1)
    b.data[b.size] = <char>c
    b.size += 1
    return 0


cdef inline char* write_varint(char* p, uint64_t value):
    """A varint at `p`, which has room for it (at most 10 bytes); returns the byte after it."""
    while value >= 0x80:
        p[0] = <char>((value & 0x7F) | 0x80)
        p += 1
        value >>= 7
    p[0] = <char>value
    return p + 1


cdef inline int put_varint(Buf* b, uint64_t value) except -1:
    if b.size + 10 > b.cap:
        buf_reserve(b, 10)
    b.size = write_varint(b.data + b.size, value) - b.data
    return 0


cdef inline int put_bytes(Buf* b, bytes data) except -1:
    return put(b, PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data))


cdef inline int put_field(Buf* b, unsigned char number, const char* p, Py_ssize_t n) except -1:
    """A length-delimited field: tag, length, payload."""
    put_byte(b, number << 3 | 2)
    put_varint(b, <uint64_t>n)
    return put(b, p, n)


# --- values -----------------------------------------------------------------------------

cdef int int_as_varint(object value, uint64_t* out) except -1:
    """1 and the varint value of an int the Python twin encodes as a 64-bit varint, or 0
    (the caller hands it to Python: over 64 bits, or below -2**63)."""
    cdef int64_t signed
    try:
        signed = PyLong_AsLongLong(value)
    except OverflowError:
        try:
            out[0] = PyLong_AsUnsignedLongLong(value)
        except OverflowError:
            return 0
        return 1
    out[0] = <uint64_t>signed  # negatives: two's complement, as `value += 1 << 64`
    return 1


cdef int put_utf8(Buf* b, unsigned char number, object text) except -1:
    """Field `number` holding an exact str as UTF-8; 0 (nothing written) for anything else,
    or a str with lone surrogates (the Python twin writes them with surrogatepass)."""
    cdef Py_ssize_t n
    cdef const char* p
    if not PyUnicode_CheckExact(text):
        return 0
    try:
        p = PyUnicode_AsUTF8AndSize(text, &n)
    except UnicodeEncodeError:
        return 0
    put_field(b, number, p, n)
    return 1


cdef int put_any_value(Buf* b, object value, int depth) except -1:
    """An AnyValue's fields, as `otlp_wire._any_value`; 0 if it must go to Python."""
    cdef uint64_t v
    cdef char packed[8]
    cdef Buf inner, item
    cdef Py_ssize_t i, n
    cdef int ok
    if PyBool_Check(value):
        put_byte(b, 0x10)
        put_byte(b, 1 if <PyObject*>value == Py_True else 0)
        return 1
    if PyLong_Check(value):
        if not int_as_varint(value, &v):
            return 0
        put_byte(b, 0x18)
        put_varint(b, v)
        return 1
    if PyFloat_Check(value):
        PyFloat_Pack8(PyFloat_AS_DOUBLE(value), packed, 1)
        put_byte(b, 0x21)
        put(b, packed, 8)
        return 1
    if PyTuple_Check(value):
        if depth >= _MAX_DEPTH:
            return 0
        n = PyTuple_GET_SIZE(value)
        buf_init(&inner, 64)
        buf_init(&item, 64)
        try:
            for i in range(n):
                item.size = 0
                ok = put_any_value(&item, <object>PyTuple_GET_ITEM(value, i), depth + 1)
                if not ok:
                    return 0
                put_field(&inner, 1, item.data, item.size)
            put_field(b, 5, inner.data, inner.size)
        finally:
            buf_free(&inner)
            buf_free(&item)
        return 1
    return put_utf8(b, 1, value)


cdef int put_key_value(Buf* b, unsigned char number, object key, object value) except -1:
    """One KeyValue entry of repeated field `number`; 0 if it must go to Python."""
    cdef Buf val
    cdef Py_ssize_t key_size, mark
    cdef const char* key_data
    if not PyUnicode_CheckExact(key):
        return 0
    try:
        key_data = PyUnicode_AsUTF8AndSize(key, &key_size)
    except UnicodeEncodeError:
        return 0
    buf_init(&val, 64)
    try:
        if not put_any_value(&val, value, 0):
            return 0
        mark = b.size
        put_byte(b, number << 3 | 2)
        # KeyValue = key (field 1) + value (field 2)
        put_varint(b, <uint64_t>(1 + varint_size(<uint64_t>key_size) + key_size
                                 + 1 + varint_size(<uint64_t>val.size) + val.size))
        put_field(b, 1, key_data, key_size)
        put_field(b, 2, val.data, val.size)
    finally:
        buf_free(&val)
    return 1


cdef inline Py_ssize_t varint_size(uint64_t value):
    cdef Py_ssize_t n = 1
    while value >= 0x80:
        value >>= 7
        n += 1
    return n


# --- span fields ------------------------------------------------------------------------

cdef int put_ids(Buf* b, bytes trace_id, bytes span_id, object state, bytes parent) except -1:
    """A Span's fields 1-4 as `otlp_wire._span` writes them (trace_state strictly UTF-8);
    0 if the state must go to Python."""
    return put_ids_at(b, trace_id, PyBytes_AS_STRING(span_id), PyBytes_GET_SIZE(span_id), state,
                      PyBytes_AS_STRING(parent), PyBytes_GET_SIZE(parent))


cdef int put_ids_at(Buf* b, bytes trace_id, const char* span_id, Py_ssize_t span_id_size, object state,
                    const char* parent, Py_ssize_t parent_size) except -1:
    """`put_ids` with the span id and the parent as C bytes: the mapper hashes them into
    arrays (no bytes object per span id)."""
    put(b, b"\x0a\x10", 2)
    put_bytes(b, trace_id)
    put(b, b"\x12\x08", 2)
    put(b, span_id, span_id_size)
    if len(state) and not put_utf8(b, 3, state):
        return 0
    if parent_size:
        if parent_size == 8:
            put(b, b"\x22\x08", 2)
            put(b, parent, 8)
        else:
            put_field(b, 4, parent, parent_size)
    return 1


cdef int put_times(Buf* b, uint64_t start, uint64_t end) except -1:
    """Span fields 7 and 8 (start and end, fixed64 little-endian)."""
    cdef char times[18]
    cdef int i
    times[0] = <char>0x39
    times[9] = <char>0x41
    for i in range(8):
        times[1 + i] = <char>((start >> (8 * i)) & 0xFF)
        times[10 + i] = <char>((end >> (8 * i)) & 0xFF)
    return put(b, times, 18)
