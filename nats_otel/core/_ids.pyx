# cython: language_level=3, boundscheck=False, wraparound=False
"""The compiled twins of `ids`' hashing and parsing (see there): length-prefixed fields,
the BLAKE2b span ids (`_blake2b.h`, checked against hashlib), and the plain lower-case
traceparent servers pass on. Anything else (an odd type, a traceparent to lower-case or
to reject) goes to the Python twins, so the bytes and the errors are the pure path's."""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.string cimport memcpy
from msgspec.structs import force_setattr


cdef extern from "_blake2b.h":
    void nats_otel_blake2b(unsigned char* out, size_t outlen, const unsigned char** parts, const size_t* sizes,
                           int count)

cdef extern from "Python.h":
    const char* PyUnicode_AsUTF8AndSize(object unicode, Py_ssize_t* size) except NULL

cdef bytes _server_prefix = b""
cdef bytes _event_prefix = b""
cdef list _positions = []
cdef object _py_fields = None
cdef object _py_server_span_id = None
cdef object _py_event_span_id = None
cdef object _py_parse_traceparent = None
cdef bytes _HEX = b"0123456789abcdef"


def configure(server_prefix, event_prefix, positions, py_fields, py_server_span_id, py_event_span_id,
              py_parse_traceparent):
    """The hash prefixes and encoded positions of `ids`, and its Python twins for odd input."""
    global _server_prefix, _event_prefix, _positions, _py_fields, _py_server_span_id, _py_event_span_id
    global _py_parse_traceparent
    _server_prefix, _event_prefix, _positions = server_prefix, event_prefix, list(positions)
    _py_fields, _py_server_span_id, _py_event_span_id = py_fields, py_server_span_id, py_event_span_id
    _py_parse_traceparent = py_parse_traceparent


def blake2b(bytes data, int digest_size):
    """hashlib.blake2b(data, digest_size=digest_size).digest() (tests compare the two)."""
    cdef const unsigned char* parts[1]
    cdef size_t sizes[1]
    cdef unsigned char out[64]
    if not 1 <= digest_size <= 64:
        raise ValueError("digest_size must be between 1 and 64")
    parts[0] = <const unsigned char*>PyBytes_AS_STRING(data)
    sizes[0] = <size_t>PyBytes_GET_SIZE(data)
    nats_otel_blake2b(out, digest_size, parts, sizes, 1)
    return PyBytes_FromStringAndSize(<char*>out, digest_size)


cdef bytes _span_id(bytes prefix, bytes id_fields, bytes ident, bytes tail):
    cdef const unsigned char* parts[4]
    cdef size_t sizes[4]
    cdef unsigned char digest[16]
    cdef int i
    parts[0] = <const unsigned char*>PyBytes_AS_STRING(prefix)
    sizes[0] = <size_t>PyBytes_GET_SIZE(prefix)
    parts[1] = <const unsigned char*>PyBytes_AS_STRING(id_fields)
    sizes[1] = <size_t>PyBytes_GET_SIZE(id_fields)
    parts[2] = <const unsigned char*>PyBytes_AS_STRING(ident)
    sizes[2] = <size_t>PyBytes_GET_SIZE(ident)
    parts[3] = <const unsigned char*>PyBytes_AS_STRING(tail)
    sizes[3] = <size_t>PyBytes_GET_SIZE(tail)
    nats_otel_blake2b(digest, 16, parts, sizes, 4)
    for i in range(8):
        if digest[i]:
            return PyBytes_FromStringAndSize(<char*>digest, 8)
    return b"\x00" * 7 + b"\x01"  # an all-zero span id is invalid in OTLP


def server_span_id(ctx, ident):
    """`ids.server_span_id`."""
    id_fields = ctx.id_fields
    if type(ident) is not bytes or type(id_fields) is not bytes:
        return _py_server_span_id(ctx, ident)
    return _span_id(_server_prefix, id_fields, ident, b"")


def event_span_id(ctx, ident, position):
    """`ids.event_span_id`."""
    id_fields = ctx.id_fields
    if type(ident) is not bytes or type(id_fields) is not bytes or type(position) is not int \
            or not 0 <= position < 256:
        return _py_event_span_id(ctx, ident, position)
    return _span_id(_event_prefix, id_fields, ident, <bytes>_positions[position])


def fields(*texts):
    """`ids._fields`: each text as a 4-byte big-endian length and its UTF-8."""
    cdef Py_ssize_t total = 0, size, at = 0
    cdef const char* data
    cdef bytes out
    cdef char* p
    for text in texts:
        if type(text) is not str:
            return _py_fields(*texts)
        try:
            PyUnicode_AsUTF8AndSize(text, &size)
        except UnicodeEncodeError:  # lone surrogates: the twin writes them with surrogatepass
            return _py_fields(*texts)
        if size >= 0x100000000:
            return _py_fields(*texts)
        total += 4 + size
    out = PyBytes_FromStringAndSize(NULL, total)
    p = PyBytes_AS_STRING(out)
    for text in texts:
        data = PyUnicode_AsUTF8AndSize(text, &size)
        p[at] = <char>((size >> 24) & 0xFF)
        p[at + 1] = <char>((size >> 16) & 0xFF)
        p[at + 2] = <char>((size >> 8) & 0xFF)
        p[at + 3] = <char>(size & 0xFF)
        memcpy(p + at + 4, data, size)
        at += 4 + size
    return out


def context_fields(trace_id, parent_span_id):
    """`fields(trace_id.hex(), parent_span_id.hex())`, without the two hex strings."""
    cdef bytes out, part
    cdef char* p
    cdef const unsigned char* src
    cdef Py_ssize_t at = 0, n, i
    if type(trace_id) is not bytes or type(parent_span_id) is not bytes:
        return _py_fields(trace_id.hex(), parent_span_id.hex())
    out = PyBytes_FromStringAndSize(NULL, 8 + 2 * (PyBytes_GET_SIZE(trace_id) + PyBytes_GET_SIZE(parent_span_id)))
    p = PyBytes_AS_STRING(out)
    for part in (trace_id, parent_span_id):
        n = 2 * PyBytes_GET_SIZE(part)
        p[at] = <char>((n >> 24) & 0xFF)
        p[at + 1] = <char>((n >> 16) & 0xFF)
        p[at + 2] = <char>((n >> 8) & 0xFF)
        p[at + 3] = <char>(n & 0xFF)
        at += 4
        src = <const unsigned char*>PyBytes_AS_STRING(part)
        for i in range(n // 2):
            p[at] = _HEX[src[i] >> 4]
            p[at + 1] = _HEX[src[i] & 15]
            at += 2
    return out


def context_post_init(self):
    """`TraceContext.__post_init__`: `id_fields` from the two ids when not given."""
    if not self.id_fields:
        force_setattr(self, "id_fields", context_fields(self.trace_id, self.parent_span_id))


cdef inline int _hex_value(unsigned char c):
    if 48 <= c <= 57:
        return c - 48
    if 97 <= c <= 102:
        return c - 87
    return -1


def parse_traceparent(value):
    """`ids.parse_traceparent` for `00-<32 hex>-<16 hex>-<2 hex>` in lower case with non-zero
    ids (what servers pass on); everything else goes to the Python twin."""
    cdef unsigned char ids[24]
    cdef int i, hi, lo, flags, nonzero_trace = 0, nonzero_parent = 0
    cdef Py_ssize_t at, size = 0
    cdef const unsigned char* text
    if type(value) is not str or len(<str>value) != 55:
        return _py_parse_traceparent(value)
    try:
        # The UTF-8 form CPython keeps (no copy for ASCII text): 55 bytes only when ASCII.
        text = <const unsigned char*>PyUnicode_AsUTF8AndSize(value, &size)
    except UnicodeEncodeError:
        return _py_parse_traceparent(value)
    if size != 55 or text[0] != 48 or text[1] != 48 or text[2] != 45 or text[35] != 45 or text[52] != 45:
        return _py_parse_traceparent(value)
    for i in range(24):
        at = 3 + 2 * i if i < 16 else 36 + 2 * (i - 16)
        hi = _hex_value(text[at])
        lo = _hex_value(text[at + 1])
        if hi < 0 or lo < 0:
            return _py_parse_traceparent(value)
        ids[i] = <unsigned char>(hi * 16 + lo)
        if ids[i]:
            if i < 16:
                nonzero_trace = 1
            else:
                nonzero_parent = 1
    hi = _hex_value(text[53])
    lo = _hex_value(text[54])
    if hi < 0 or lo < 0 or not nonzero_trace or not nonzero_parent:
        return _py_parse_traceparent(value)  # raises the pure path's error, or parses
    flags = hi * 16 + lo
    return PyBytes_FromStringAndSize(<char*>ids, 16), PyBytes_FromStringAndSize(<char*>ids + 16, 8), flags
