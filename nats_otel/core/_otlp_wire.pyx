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

include "_protobuf.pxi"

from cpython.dict cimport PyDict_SetItem, PyDict_Size


cdef enum:
    _CACHE_LIMIT = 65536


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
    cdef Buf status
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
    if not put_ids(b, trace_id, span_id, state, parent):
        return 0
    if not put_utf8(b, 5, name):
        return 0
    if not int_as_varint(kind, &v):
        return 0
    put_byte(b, 0x30)
    put_varint(b, v)
    put_times(b, start_ns, end_ns)
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
