# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The compiled twin of `otlp_wire` (see there): span records -> one serialized
`ExportTraceServiceRequest`, written into one C buffer.

The pure-Python `otlp_wire` is the reference: the same input gives the same bytes (tests
check it on the corpus, on generated and on fuzzed input). The Python version builds a
bytes object per field and joins them; here each span is written in place and only the
cached (key, value) pairs are Python objects. Anything this file does not handle in C
(a value of an unusual type, an int over 64 bits, a string with lone surrogates, a
malformed record) is handed to the Python twin for that pair or span, so odd input gives
the same bytes, or the same exception, on both paths.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_CheckExact, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.dict cimport PyDict_SetItem, PyDict_Size
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
    _CACHE_LIMIT = 65536
    _MAX_DEPTH = 16  # nested arrays deeper than this go to Python (no deep C recursion)

# Set by `configure` (from otlp_wire, once its functions exist): the Python twin's pieces
# that odd input goes to, and the prefix of attributes never cached.
cdef object _py_span = None
cdef object _py_key_value = None
cdef object _py_resource = None
cdef object _uncached_prefix = ""
# (key, value) -> encoded KeyValue entry, per parent field number (1: Resource, 9: Span).
cdef dict _pairs_resource = {}
cdef dict _pairs_span = {}


def configure(py_span, py_key_value, py_resource, uncached_prefix):
    """Give the compiled encoder the Python twin's functions for what it does not do in C."""
    global _py_span, _py_key_value, _py_resource, _uncached_prefix
    _py_span, _py_key_value, _py_resource, _uncached_prefix = py_span, py_key_value, py_resource, uncached_prefix


def cached_pairs(int number):
    """The (key, value) pairs cached for parent field `number` (tests: what is not cached)."""
    return list(_pairs_span if number == 9 else _pairs_resource)


def clear_caches():
    """Forget every cached pair (tests)."""
    _pairs_span.clear()
    _pairs_resource.clear()


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


cdef inline int put_varint(Buf* b, uint64_t value) except -1:
    if b.size + 10 > b.cap:
        buf_reserve(b, 10)
    while value >= 0x80:
        b.data[b.size] = <char>((value & 0x7F) | 0x80)
        b.size += 1
        value >>= 7
    b.data[b.size] = <char>value
    b.size += 1
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
        return put_byte(b, 1 if <PyObject*>value == Py_True else 0)
    if PyLong_Check(value):
        if not int_as_varint(value, &v):
            return 0
        put_byte(b, 0x18)
        return put_varint(b, v)
    if PyFloat_Check(value):
        PyFloat_Pack8(PyFloat_AS_DOUBLE(value), packed, 1)
        put_byte(b, 0x21)
        return put(b, packed, 8)
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


cdef int put_attributes(Buf* b, unsigned char number, object attributes) except -1:
    """`otlp_wire._attributes`: cached pairs copied, the others encoded (and cached)."""
    cdef dict cache = _pairs_span if number == 9 else _pairs_resource
    cdef Py_ssize_t i, n, start
    cdef PyObject* hit
    cdef object pair, encoded
    if not PyTuple_Check(attributes):
        return 0
    n = PyTuple_GET_SIZE(attributes)
    for i in range(n):
        pair = <object>PyTuple_GET_ITEM(attributes, i)
        if not PyTuple_Check(pair) or PyTuple_GET_SIZE(pair) != 2:
            return 0
        try:
            hit = PyDict_GetItemWithError(cache, pair)
        except TypeError:  # unhashable: the Python twin raises it
            return 0
        if hit != NULL:
            put_bytes(b, <bytes>hit)
            continue
        start = b.size
        if not put_key_value(b, number, <object>PyTuple_GET_ITEM(pair, 0), <object>PyTuple_GET_ITEM(pair, 1)):
            b.size = start
            encoded = _py_key_value(number, <object>PyTuple_GET_ITEM(pair, 0), <object>PyTuple_GET_ITEM(pair, 1))
            put_bytes(b, encoded)
        else:
            encoded = None
        key = <object>PyTuple_GET_ITEM(pair, 0)
        if PyUnicode_CheckExact(key) and PyUnicode_Tailmatch(key, _uncached_prefix, 0, len(key), -1):
            continue
        if encoded is None:
            encoded = PyBytes_FromStringAndSize(b.data + start, b.size - start)
        if PyDict_Size(cache) >= _CACHE_LIMIT:
            cache.clear()  # subjects and names are unbounded: keep memory bounded
        PyDict_SetItem(cache, pair, encoded)
    return 1


# --- spans ------------------------------------------------------------------------------

cdef int put_span_fields(Buf* b, object span) except -1:
    """A Span message's fields, as `otlp_wire._span`; 0 if the span must go to Python."""
    cdef object trace_id, span_id, parent, name, kind, start, end, attributes, code, message, state
    cdef uint64_t v, start_ns, end_ns
    cdef char times[18]
    cdef Buf status
    cdef int i
    if not PyTuple_Check(span) or PyTuple_GET_SIZE(span) != 12:
        return 0
    trace_id = <object>PyTuple_GET_ITEM(span, 0)
    span_id = <object>PyTuple_GET_ITEM(span, 1)
    parent = <object>PyTuple_GET_ITEM(span, 2)
    name = <object>PyTuple_GET_ITEM(span, 3)
    kind = <object>PyTuple_GET_ITEM(span, 4)
    start = <object>PyTuple_GET_ITEM(span, 5)
    end = <object>PyTuple_GET_ITEM(span, 6)
    attributes = <object>PyTuple_GET_ITEM(span, 8)
    code = <object>PyTuple_GET_ITEM(span, 9)
    message = <object>PyTuple_GET_ITEM(span, 10)
    state = <object>PyTuple_GET_ITEM(span, 11)
    if not (PyBytes_CheckExact(trace_id) and PyBytes_CheckExact(span_id) and PyBytes_CheckExact(parent)
            and PyUnicode_CheckExact(state) and PyUnicode_CheckExact(message)
            and type(kind) is int and type(code) is int and type(start) is int and type(end) is int):
        return 0
    try:
        start_ns = PyLong_AsUnsignedLongLong(start)
        end_ns = PyLong_AsUnsignedLongLong(end)
    except OverflowError:  # Python's struct.error, from the twin
        return 0
    put(b, b"\x0a\x10", 2)
    put_bytes(b, trace_id)
    put(b, b"\x12\x08", 2)
    put_bytes(b, span_id)
    if len(state):
        if not put_utf8(b, 3, state):
            return 0
    if PyBytes_GET_SIZE(parent):
        if PyBytes_GET_SIZE(parent) == 8:
            put(b, b"\x22\x08", 2)
            put_bytes(b, parent)
        else:
            put_field(b, 4, PyBytes_AS_STRING(parent), PyBytes_GET_SIZE(parent))
    if not put_utf8(b, 5, name):
        return 0
    if not int_as_varint(kind, &v):
        return 0
    put_byte(b, 0x30)
    put_varint(b, v)
    times[0] = <char>0x39
    times[9] = <char>0x41
    for i in range(8):
        times[1 + i] = <char>((start_ns >> (8 * i)) & 0xFF)
        times[10 + i] = <char>((end_ns >> (8 * i)) & 0xFF)
    put(b, times, 18)
    if not put_attributes(b, 9, attributes):
        return 0
    if code or len(message):
        buf_init(&status, 64)
        try:
            if len(message) and not put_utf8(&status, 2, message):
                return 0
            if code:
                if not int_as_varint(code, &v):
                    return 0
                put_byte(&status, 0x18)
                put_varint(&status, v)
            put_field(b, 15, status.data, status.size)
        finally:
            buf_free(&status)
    return 1


cdef int put_span(Buf* group, Buf* scratch, object span) except -1:
    """One ScopeSpans.spans entry (field 2)."""
    cdef bytes encoded
    scratch.size = 0
    if put_span_fields(scratch, span):
        return put_field(group, 2, scratch.data, scratch.size)
    encoded = _py_span(span)  # the twin encodes it, or raises what the pure path raises
    return put_field(group, 2, PyBytes_AS_STRING(encoded), PyBytes_GET_SIZE(encoded))


def encode_request(spans, bytes scope):
    """`otlp_wire.encode_export_request(group_by_resource(spans), scope)`, in one pass:
    spans grouped by resource in order of first appearance, one ResourceSpans per group."""
    cdef list resources = []
    cdef dict index = {}
    cdef Buf* groups = NULL
    cdef Py_ssize_t count = 0, cap = 0, at, last = -1, i, inner
    cdef Buf scratch, out
    cdef object span, resource, found, last_resource = None
    cdef bytes encoded_resource
    cdef Buf* grown
    buf_init(&scratch, 512)
    buf_init(&out, 256)
    try:
        for span in spans:
            resource = span.resource
            if last >= 0 and resource is last_resource:
                at = last
            else:
                found = index.get(resource)
                if found is None:
                    if count == cap:
                        cap = cap * 2 if cap else 4
                        grown = <Buf*>PyMem_Realloc(groups, cap * sizeof(Buf))
                        if grown == NULL:
                            raise MemoryError()
                        groups = grown
                    at = count
                    groups[at].data = NULL
                    buf_init(&groups[at], 4096)
                    count += 1
                    index[resource] = at
                    resources.append(resource)
                else:
                    at = found
                last, last_resource = at, resource
            put_span(&groups[at], &scratch, span)
        # ResourceSpans { resource (1), ScopeSpans (2) { scope (1), spans (2)... } }
        scratch.size = 0
        put_field(&scratch, 1, PyBytes_AS_STRING(scope), PyBytes_GET_SIZE(scope))
        for i in range(count):
            encoded_resource = _py_resource(resources[i])
            inner = scratch.size + groups[i].size
            put_byte(&out, 0x0a)
            put_varint(&out, <uint64_t>(PyBytes_GET_SIZE(encoded_resource) + 1 + varint_size(<uint64_t>inner) + inner))
            put_bytes(&out, encoded_resource)
            put_byte(&out, 0x12)
            put_varint(&out, <uint64_t>inner)
            put(&out, scratch.data, scratch.size)
            put(&out, groups[i].data, groups[i].size)
        return PyBytes_FromStringAndSize(out.data, out.size)
    finally:
        for i in range(count):
            buf_free(&groups[i])
        PyMem_Free(groups)
        buf_free(&scratch)
        buf_free(&out)
