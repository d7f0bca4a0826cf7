# The ids stage: the compiled counterparts of `ids`' hashing and parsing (see there): the
# BLAKE2b span ids (`_blake2b.h`, checked against hashlib), and the plain lower-case
# traceparent servers pass on. Anything else (an odd type, a traceparent to lower-case or
# to reject) goes to the Python twins, so the bytes and the errors are the pure path's.

cdef extern from "_blake2b.h":
    void nats_otel_blake2b(unsigned char* out, size_t outlen, const unsigned char** parts, const size_t* sizes,
                           int count)

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


cdef void _span_id_into(unsigned char* out, bytes prefix, bytes id_fields, bytes ident, bytes tail):
    """The 8-byte span id of these inputs, written at `out`: no bytes object for a span id
    that only goes into a span's protobuf (`_stage_map`)."""
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
            memcpy(out, digest, 8)
            return
    memcpy(out, b"\x00\x00\x00\x00\x00\x00\x00\x01", 8)  # an all-zero span id is invalid in OTLP


cdef bytes _span_id(bytes prefix, bytes id_fields, bytes ident, bytes tail):
    cdef unsigned char span_id[8]
    _span_id_into(span_id, prefix, id_fields, ident, tail)
    return PyBytes_FromStringAndSize(<char*>span_id, 8)


cpdef object server_span_id(object ctx, object ident):
    """`ids.server_span_id`."""
    id_fields = _id_fields_of(ctx)
    if type(ident) is not bytes or type(id_fields) is not bytes:
        return _reference_server_span_id(ctx, ident)
    return _span_id(_SERVER_PREFIX, id_fields, ident, b"")


cpdef object event_span_id(object ctx, object ident, object position):
    """`ids.event_span_id`."""
    if type(position) is not int or not 0 <= position < 256:
        return _reference_event_span_id(ctx, ident, position)
    return _event_id(_id_fields_of(ctx), ident, position, ctx)


cdef inline object _event_id(object id_fields, object ident, Py_ssize_t position, object ctx):
    """`event_span_id(ctx, ident, position)`, given the context's `id_fields` read already."""
    if type(ident) is not bytes or type(id_fields) is not bytes or not 0 <= position < 256:
        return _reference_event_span_id(ctx, ident, position)
    return _span_id(_EVENT_PREFIX, id_fields, ident, <bytes>_POSITIONS[position])


cdef int server_span_id_into(unsigned char* out, object ctx, object ident) except -1:
    """`server_span_id` written at `out` (8 bytes); from the Python twin's bytes when odd
    inputs send it there."""
    id_fields = _id_fields_of(ctx)
    if type(ident) is not bytes or type(id_fields) is not bytes:
        return _copy_span_id(out, _reference_server_span_id(ctx, ident))
    _span_id_into(out, _SERVER_PREFIX, id_fields, ident, b"")
    return 0


cdef int event_span_id_into(unsigned char* out, object ctx, object ident, int position) except -1:
    """`event_span_id` written at `out` (8 bytes), as `server_span_id_into`."""
    id_fields = _id_fields_of(ctx)
    if type(ident) is not bytes or type(id_fields) is not bytes or not 0 <= position < 256:
        return _copy_span_id(out, _reference_event_span_id(ctx, ident, position))
    _span_id_into(out, _EVENT_PREFIX, id_fields, ident, <bytes>_POSITIONS[position])
    return 0


cdef int _copy_span_id(unsigned char* out, object span_id) except -1:
    if type(span_id) is not bytes or PyBytes_GET_SIZE(span_id) != 8:  # every id `ids` makes is
        raise TypeError(f"a span id of 8 bytes expected, got {span_id!r}")
    memcpy(out, PyBytes_AS_STRING(span_id), 8)
    return 0


# A hex digit's value by its byte; 0x100 for anything but 0-9 and a-f (lower case, as servers
# pass it on): two digits read `(hi << 4) | lo`, and any bit above the byte says one was not.
cdef unsigned short _HEX[256]
for _byte in range(256):
    _HEX[_byte] = 0x100
for _byte, _digit in zip(b"0123456789abcdef", range(16)):
    _HEX[_byte] = _digit
del _byte, _digit


cdef inline unsigned int _hex_bytes(const unsigned char* text, unsigned char* out, int count) noexcept:
    """`count` bytes from their `2 * count` hex digits at `text`; the OR of what was read (a
    bit above 0xFF: a digit that is not one; 0: every byte zero)."""
    cdef unsigned int pair, seen = 0
    cdef int i
    for i in range(count):
        pair = (_HEX[text[2 * i]] << 4) | _HEX[text[2 * i + 1]]
        out[i] = <unsigned char>pair
        seen |= pair
    return seen


cdef bint _traceparent_fast(object value, unsigned char* ids, unsigned char* flags) except -1:
    """The 16 + 8 id bytes (at `ids`) and the flags of `00-<32 hex>-<16 hex>-<2 hex>` in lower
    case with non-zero ids (what servers pass on); false for anything else, which is the
    Python twin's to parse or refuse."""
    cdef Py_ssize_t size = 0
    cdef const unsigned char* text
    cdef unsigned int trace_seen, parent_seen, flags_seen
    if type(value) is not str or len(<str>value) != 55:
        return False
    try:
        # The UTF-8 form CPython keeps (no copy for ASCII text): 55 bytes only when ASCII.
        text = <const unsigned char*>PyUnicode_AsUTF8AndSize(value, &size)
    except UnicodeEncodeError:
        return False
    if size != 55 or text[0] != 48 or text[1] != 48 or text[2] != 45 or text[35] != 45 or text[52] != 45:
        return False
    trace_seen = _hex_bytes(text + 3, ids, 16)
    parent_seen = _hex_bytes(text + 36, ids + 16, 8)
    flags_seen = _hex_bytes(text + 53, flags, 1)
    return (trace_seen | parent_seen | flags_seen) <= 0xFF and trace_seen != 0 and parent_seen != 0


cdef bytes _context_fields_of(object traceparent):
    """`context_fields_c(trace_id, parent_span_id)` of a traceparent `_traceparent_fast` took:
    its ids' lower-case hex digits are already the text the fields hold, copied, not
    decoded and encoded again."""
    cdef Py_ssize_t size = 0
    cdef const char* text = PyUnicode_AsUTF8AndSize(traceparent, &size)  # kept by CPython: no copy
    out = PyBytes_FromStringAndSize(NULL, 56)
    cdef char* p = PyBytes_AS_STRING(out)
    _length(p, 32)
    memcpy(p + 4, text + 3, 32)
    _length(p + 36, 16)
    memcpy(p + 40, text + 36, 16)
    return out


cpdef object parse_traceparent(object value):
    """`ids.parse_traceparent`: the common form in C (`_traceparent_fast`), everything else
    by the Python twin (which raises the pure path's error, or parses)."""
    cdef unsigned char ids[24]
    cdef unsigned char flags
    if not _traceparent_fast(value, ids, &flags):
        return _reference_parse_traceparent(value)
    return PyBytes_FromStringAndSize(<char*>ids, 16), PyBytes_FromStringAndSize(<char*>ids + 16, 8), flags


# --- the shape's digest of a message with headers of its own (`shapes.shape_digest`) -------

cdef unsigned long long _SHAPE_DIGEST_C = SHAPE_DIGEST

cdef inline unsigned char* _put_le(unsigned char* at, unsigned long long value, int count) noexcept:
    """`value.to_bytes(count, "little")` written at `at` (its low `count` bytes); the end."""
    cdef int i
    for i in range(count):
        at[i] = <unsigned char>(value >> (8 * i))
    return at + count


cpdef object shape_digest(object size, list own):
    """`shapes.shape_digest` over one buffer in C (~0.3 µs where the twin took ~2.6: every
    message whose application sets a header of its own pays it, on every hop). What it is not
    sure of (a size past 64 bits, a name or value that is not a `str`, has no UTF-8 form or is
    past a 4-byte length, an odd item) the Python twin decides, and raises what it raises."""
    cdef int overflow = 0
    cdef long long size_c
    cdef Py_ssize_t total = 16, length = 0, i, j, count = len(own)
    cdef list ordered
    cdef const char* text
    cdef unsigned char* at
    cdef unsigned char digest[8]
    cdef const unsigned char* parts[1]
    cdef size_t sizes[1]
    cdef unsigned long long value = 0
    if type(size) is not int:
        return _shape_digest(size, own)
    size_c = PyLong_AsLongLongAndOverflow(size, &overflow)
    if overflow:  # 16 signed bytes hold it; the twin writes them
        return _shape_digest(size, own)
    try:
        ordered = sorted(own)  # names, then (a name twice, in two spellings) the values
        for i in range(count):  # the buffer's size, and every part checked before any is written
            item = ordered[i]
            if type(item) is not tuple or len(<tuple>item) != 2:
                return _shape_digest(size, own)
            name, values = <tuple>item
            if type(name) is not str or type(values) is not list:
                return _shape_digest(size, own)
            PyUnicode_AsUTF8AndSize(name, &length)  # raises where name.encode() would
            if length >= 0x100000000 or len(<list>values) >= 0x100000000:  # past a 4-byte length
                return _shape_digest(size, own)
            total += 8 + length
            for j in range(len(<list>values)):
                if type((<list>values)[j]) is not str:
                    return _shape_digest(size, own)
                PyUnicode_AsUTF8AndSize((<list>values)[j], &length)
                if length >= 0x100000000:
                    return _shape_digest(size, own)
                total += 4 + length
    except Exception:  # what the twin does with it, it says (the same error, or its digest)
        return _shape_digest(size, own)
    data = PyBytes_FromStringAndSize(NULL, total)
    at = <unsigned char*>PyBytes_AS_STRING(data)
    at = _put_le(at, <unsigned long long>size_c, 8)  # size.to_bytes(16, "little", signed=True)
    memset(at, 0xFF if size_c < 0 else 0, 8)
    at += 8
    for i in range(count):
        name, values = <tuple>ordered[i]
        text = PyUnicode_AsUTF8AndSize(name, &length)
        at = _put_le(at, <unsigned long long>length, 4)
        memcpy(at, text, length)
        at = _put_le(at + length, <unsigned long long>len(<list>values), 4)
        for j in range(len(<list>values)):
            text = PyUnicode_AsUTF8AndSize((<list>values)[j], &length)
            at = _put_le(at, <unsigned long long>length, 4)
            memcpy(at, text, length)
            at += length
    parts[0] = <const unsigned char*>PyBytes_AS_STRING(data)
    sizes[0] = <size_t>total
    nats_otel_blake2b(digest, 8, parts, sizes, 1)
    for i in range(8):  # int.from_bytes(digest, "little")
        value |= (<unsigned long long>digest[i]) << (8 * i)
    return (value & (_SHAPE_DIGEST_C - 1)) | _SHAPE_DIGEST_C


# --- ad-hoc trace ids (`ids.trace_context`'s ad-hoc context, `ids.adhoc_trace_id`) -----------

cdef bytes _ADHOC_GROUP_PREFIX = _reference_role(b"adhoc-group")
cdef bytes _ADHOC_TRACE_PREFIX = _reference_role(b"adhoc-trace")
cdef str _TRACE_DISABLED = _TRACE_DISABLED_


cdef inline void _length(char* p, Py_ssize_t n):
    """`ids._fields`' length prefix of a field of `n` bytes (under 2**32): 4 bytes, big-endian."""
    p[0] = <char>((n >> 24) & 0xFF)
    p[1] = <char>((n >> 16) & 0xFF)
    p[2] = <char>((n >> 8) & 0xFF)
    p[3] = <char>(n & 0xFF)


cdef bytes _trace_id_of(bytes prefix, const char* first, size_t first_size, const char* second,
                       size_t second_size):
    """`ids._trace_id` of the BLAKE2b-128 of `prefix`, then the bytes at `first` and `second`."""
    cdef const unsigned char* parts[3]
    cdef size_t sizes[3]
    cdef unsigned char digest[16]
    cdef int i
    parts[0] = <const unsigned char*>PyBytes_AS_STRING(prefix)
    sizes[0] = <size_t>PyBytes_GET_SIZE(prefix)
    parts[1], sizes[1] = <const unsigned char*>first, first_size
    parts[2], sizes[2] = <const unsigned char*>second, second_size
    nats_otel_blake2b(digest, 16, parts, sizes, 3)
    for i in range(16):
        if digest[i]:
            return PyBytes_FromStringAndSize(<char*>digest, 16)
    return b"\x00" * 15 + b"\x01"  # an all-zero trace id is invalid in OTLP


cpdef object adhoc_trace_id(object ctx, object origin):
    """`ids.adhoc_trace_id` (the Python twin for odd inputs)."""
    id_fields = _id_fields_of(ctx)
    if type(id_fields) is not bytes or type(origin) is not bytes:
        return _adhoc_trace_id(ctx, origin)
    return _trace_id_of(_ADHOC_TRACE_PREFIX, PyBytes_AS_STRING(id_fields), PyBytes_GET_SIZE(id_fields),
                        PyBytes_AS_STRING(origin), PyBytes_GET_SIZE(origin))


cdef inline object _adhoc_key(object dest, object arrival_subject):
    """`ids.trace_context`'s ad-hoc key of a message without a traceparent: the subject it
    arrived on, else its `Nats-Trace-Dest` (`dest`, that header's first value, or None);
    None when it has none."""
    if arrival_subject:
        return arrival_subject
    if not dest or dest == _TRACE_DISABLED:
        return None
    return dest


cdef object _adhoc_fields(object key):
    """The `id_fields` of the ad-hoc context correlated by `key` (`ids.trace_context`); None
    where the Python twin decides (a key that is not a plain `str` with a UTF-8 form)."""
    cdef Py_ssize_t size = 0
    cdef const char* text
    cdef char length[4]
    if type(key) is not str:
        return None
    try:
        text = PyUnicode_AsUTF8AndSize(key, &size)  # `_fields`' encoding, but for surrogates
    except UnicodeEncodeError:
        return None
    if size >= 0x100000000:  # past `_fields`' 4-byte length: its error
        return None
    _length(length, size)  # `_fields(key)`: its length, then its bytes
    trace_id = _trace_id_of(_ADHOC_GROUP_PREFIX, length, 4, text, <size_t>size)
    return context_fields_c(trace_id, b"")


# --- the trace context (`ids.TraceContext`): made field by field, its ids read back -------

cdef object _trace_context_of(bytes id_fields, object trace_state, bint sampled, object adhoc_key):
    """`TraceContext(id_fields, trace_state, sampled, adhoc_key)`, field by field."""
    ctx = _struct_new(_TraceContext)
    set_field(ctx, CTX.id_fields, id_fields)
    set_field(ctx, CTX.trace_state, trace_state)
    set_field(ctx, CTX.sampled, sampled)
    set_field(ctx, CTX.adhoc_key, adhoc_key)
    return ctx


cdef object _context_id(object ctx, bint parent):
    """`ctx.parent_span_id` if `parent`, else `ctx.trace_id` (`ids.context_id`): read back
    from its hex field of the context's `id_fields` in C; the Python twin reads anything
    else (neither a `TraceContext` exactly nor the kernel's record; not two fields end to
    end, the one read of hex digits of whole bytes)."""
    cdef Py_ssize_t size, trace_size, parent_size, start, count
    cdef const unsigned char* text
    cdef unsigned char ids[32]
    if type(ctx) is not _TraceContext and type(ctx) is not MessageRecord:
        return ctx.parent_span_id if parent else ctx.trace_id
    id_fields = _id_fields_of(ctx)
    if type(id_fields) is not bytes:
        return _reference_context_id(id_fields, parent)
    size = PyBytes_GET_SIZE(id_fields)
    if size < 8:
        return _reference_context_id(id_fields, parent)
    text = <const unsigned char*>PyBytes_AS_STRING(id_fields)
    trace_size = _field_size(text)
    if trace_size > size - 8:
        return _reference_context_id(id_fields, parent)
    parent_size = _field_size(text + 4 + trace_size)
    if parent_size != size - 8 - trace_size:
        return _reference_context_id(id_fields, parent)
    if parent:
        start, count = 8 + trace_size, parent_size
    else:
        start, count = 4, trace_size
    if count % 2 or count > 2 * sizeof(ids) or _hex_bytes(text + start, ids, count // 2) > 0xFF:
        return _reference_context_id(id_fields, parent)
    return PyBytes_FromStringAndSize(<char*>ids, count // 2)


def context_id(ctx, bint parent):
    """`_context_id`, for the twins' tests."""
    return _context_id(ctx, parent)


cdef inline Py_ssize_t _field_size(const unsigned char* p) noexcept:
    """The 4-byte big-endian length `ids._fields` writes before a field."""
    return (<Py_ssize_t>p[0] << 24) | (<Py_ssize_t>p[1] << 16) | (<Py_ssize_t>p[2] << 8) | p[3]
