# The compiled twin of `pipeline.prepare` (see there, and `decode.decode`,
# `ids.trace_context`, `ids.identity`, `shapes.message_shape`, `pipeline._arrival`, which it
# follows step by step) for the common case: msgspec's one-call decode succeeds (after the
# reference's `decompress` when the payload is compressed) and the traceparent is valid.
# Anything else - a payload `decompress` refuses, a document the fast decode refuses, a
# missing or broken traceparent - is handed to the Python code that decides it (the pure
# `prepare`, or `ids.trace_context` for an ad-hoc context), so every error and every unusual
# message is decided by the reference (and counted: `handed_to_reference`).

cdef MessageRecord _prepare_by_reference(object raw, object limits):
    _handed[H_PREPARE] += 1
    return _record_from(_reference_prepare(raw, limits))


# The limits `prepare` last read (held, so that its id is not reused by another object) and
# the three values it reads of them: one look-up per batch's limits, not three per message.
cdef object _limits_read = None
cdef object _max_payload = None, _max_decompressed = None, _max_events = None
# `_max_payload` as a C size when it is an int (clamped to what a size can be), or
# _AS_OBJECTS: a payload's size is compared in C, without an int made for it a message.
cdef enum:
    _AS_OBJECTS = -2
cdef Py_ssize_t _max_payload_c = _AS_OBJECTS


cdef inline void _read_limits(object limits) except *:
    global _limits_read, _max_payload, _max_decompressed, _max_events, _max_payload_c
    if limits is _limits_read:
        return
    max_payload, max_decompressed, max_events = (limits.max_payload_bytes, limits.max_decompressed_bytes,
                                                 limits.max_events)
    cdef Py_ssize_t payload_c = _AS_OBJECTS
    if type(max_payload) is int:
        payload_c = -1 if max_payload < 0 else (max_payload if max_payload <= PY_SSIZE_T_MAX else PY_SSIZE_T_MAX)
    # No Python code runs from here to the end: another thread sees all five changed or none.
    _max_payload, _max_decompressed, _max_events = max_payload, max_decompressed, max_events
    _max_payload_c = payload_c
    _limits_read = limits


cdef inline bint _payload_within(Py_ssize_t size) except -1:
    """`size <= limits.max_payload_bytes`, in C where the limit is an int."""
    if _max_payload_c != _AS_OBJECTS:
        return size <= _max_payload_c
    return size <= _max_payload


cpdef object prepare(object raw, object limits=_UNSET):
    """As `pipeline.prepare`; the pure-Python code decides whatever is not the common case."""
    return _prepare_record(raw, _DEFAULT_LIMITS if limits is _UNSET else limits).prepared()


cdef MessageRecord _prepare_record(object raw, object limits):
    """`prepare`, into the kernel's record of the message (`_stage_record.pxi`)."""
    _read_limits(limits)
    if type(raw) is not _RawTraceMessage:
        return _prepare_by_reference(raw, limits)
    headers = field(raw, RAW.headers)
    payload = field(raw, RAW.payload)
    if type(headers) is not dict or type(payload) is not bytes:
        return _prepare_by_reference(raw, limits)
    # decode.decode: RawTraceMessage.header("Content-Encoding"), then decompress. Without
    # the header only decompress's size check applies; with it, decompress itself runs.
    try:
        encoding = _content_encoding(<dict>headers) if headers else None
    except Exception:  # a header name that is not a string: the reference raises
        return _prepare_by_reference(raw, limits)
    data = _NO
    if _payload_within(PyBytes_GET_SIZE(payload)):
        if encoding is None:
            data = payload
        elif type(encoding) is str and encoding == "snappy":  # the server's spelling (`_stage_snappy.pxi`)
            data = _unframe_snappy(payload, _max_decompressed)
    if data is _NO:  # compressed otherwise, too large, or a stream the kernel declined
        try:
            data = _decompress(payload, encoding, limits)
        except Exception:  # refused: the reference raises the same error
            return _prepare_by_reference(raw, limits)
    # The kernel's own parse (`_stage_parse.pxi`) takes the shape servers send, and checks
    # what the lines below check; what it declines, msgspec decodes as before
    # (decode._decode_fast), and what msgspec refuses goes to the reference.
    global _declined
    cdef Py_ssize_t i
    cdef MessageRecord record = _new_record(raw)
    if _parse_document(data, _max_events):
        server, message_headers = _PARSED.server, _PARSED.headers
        msg_size, hops, seq = _PARSED.msg_size, _PARSED.hops, _PARSED.seq
        _PARSED.clear()
        _PARSED.hand_events(record)
    else:
        _declined += 1
        try:
            doc = _decode_document(data)
        except Exception:  # not for the fast path: the reference words the error, or decodes it its way
            return _prepare_by_reference(raw, limits)
        if type(doc) is not _Document:
            return _prepare_by_reference(raw, limits)
        events = field(doc, DOC.events)
        if not events or len(events) > _max_events or type(events[0]) is not _Ingress:
            return _prepare_by_reference(raw, limits)
        for i in range(1, len(events)):
            if type(events[i]) is _Ingress:
                return _prepare_by_reference(raw, limits)
        request = field(doc, DOC.request)
        server = field(doc, DOC.server)
        if type(request) is not _DecodedRequest or type(server) is not _ServerReport:
            return _prepare_by_reference(raw, limits)
        seq = field(server, REPORT.seq)
        server = _server_info(server)
        message_headers = _trace_headers_of(<dict>field(request, REQ.header))  # msgspec's dict of lists
        msg_size = field(request, REQ.msgsize)
        hops = field(doc, DOC.hops)
        _take_events(record, events[0], events, 1)  # each its own shape
    # The first values of the trace's headers (`_note_first`) and shapes.message_shape, in
    # one pass over the headers
    cdef PyObject* firsts[TRACE_HEADERS]
    _clear_firsts(firsts)
    cdef Py_ssize_t server_headers = 0  # the bytes of the headers a server adds, summed in C: one int made, not two a value
    cdef Py_ssize_t at, count
    cdef list own = None  # the message's own headers, when it has any (shapes.message_shape)
    cdef PyObject* header_class
    for at in range(0, PyTuple_GET_SIZE(message_headers), 2):  # `TraceHeaders`: name, values, ...
        key = <object>PyTuple_GET_ITEM(message_headers, at)
        values = <object>PyTuple_GET_ITEM(message_headers, at + 1)  # one str, else a tuple of them
        lowered = _lower(key)
        count = _values_count(values)
        if count:
            _note_first(firsts, lowered, _value_at(values, 0))
        header_class = PyDict_GetItemWithError(_HEADER_CLASS, lowered)
        if header_class is not NULL and <object>header_class is True:
            for i in range(count):
                server_headers += len(key) + len(<object>_value_at(values, i)) + 4
        elif header_class is NULL:  # neither a server's nor the trace context's
            if own is None:
                own = []
            own.append((lowered, [values] if type(values) is str else list(<tuple>values)))
    size = msg_size - server_headers if server_headers else msg_size
    if own is not None:  # a header of the message's own (`shape_digest`, in C)
        size = shape_digest(size, own)
    ingress = _shape_at(record, 0)  # the model's `Ingress` (its fields but its time: the slot's)
    record.server, record.headers, record.msg_size, record.hops = server, message_headers, msg_size, hops
    record.unknown_events, record.seq = (), seq
    # ids.trace_context, when the traceparent is valid; otherwise the reference decides
    # (an ad-hoc context, or the error), and prepare's issue follows
    cdef tuple issues = ()
    cdef PyObject* traceparent_p
    cdef unsigned char ids[24]
    cdef unsigned char flags_byte
    cdef bint sampled = True
    id_fields = None
    trace_state = adhoc_key = None
    traceparent_p = firsts[H_TRACEPARENT]
    if traceparent_p is not NULL:
        # The context keeps the ids as its `id_fields` only: the servers' form is encoded
        # from the text, the ids' bytes not made
        if _traceparent_fast(<object>traceparent_p, ids, &flags_byte):  # `parse_traceparent`, no tuple
            flags = flags_byte
            id_fields = _context_fields_of(<object>traceparent_p)
        else:
            try:  # not the servers' form: the Python twin parses it (`parse_traceparent` would too)
                trace_id, parent_id, flags = _reference_parse_traceparent(<object>traceparent_p)
                id_fields = context_fields_c(trace_id, parent_id)
            except Exception:  # broken: ids.trace_context below decides (ad-hoc, or its error)
                pass
        if id_fields is not None:
            trace_state, sampled = _first_or(firsts[H_TRACESTATE], ""), flags & 1
    if id_fields is None and traceparent_p is NULL:  # ad hoc (`Nats-Trace-Dest`), the usual kind in C
        adhoc_key = _adhoc_key(_first_or(firsts[H_DEST], None), raw.subject)
        if adhoc_key is not None:
            id_fields = _adhoc_fields(adhoc_key)
            trace_state = _first_or(firsts[H_TRACESTATE], None) or ""
        if id_fields is None:
            adhoc_key = None
    if id_fields is None:
        ctx = _trace_context(record.message(), raw.subject)
        id_fields, trace_state, sampled, adhoc_key = ctx.id_fields, ctx.trace_state, ctx.sampled, ctx.adhoc_key
        if adhoc_key is not None and traceparent_p is not NULL:
            issues = _BAD_TRACEPARENT
    cdef uint64_t ts_ns = record.event_slots[0].ts_ns
    ident = _identity(field(server, SRV.id), ts_ns, field(ingress, IN.cid))
    # pipeline._arrival: only a message that came in from another server has one
    arrival_key = arrival_entry = None
    if _forwards(field(ingress, IN.kind)):
        hop = _first_or(firsts[H_HOP], "")
        if _truthy(hop):
            arrival_key = (id_fields, hop, field(ingress, IN.name), field(server, SRV.name))
            arrival_entry = _record3(_Arrival, PyLong_FromUnsignedLongLong(ts_ns), size, ident)
    record.ident, record.issues, record.size = ident, issues, size
    record.id_fields, record.trace_state, record.sampled, record.adhoc_key = id_fields, trace_state, sampled, adhoc_key
    record.arrival_key, record.arrival_entry = arrival_key, arrival_entry
    return record


# The trace's own headers that `prepare` and the mapper read, by their slot in a message's
# `firsts`: each one's first value (`model.first_values`: of the spellings with a value, the
# first), borrowed from the message's headers, NULL when it has none. A message keeps no
# index of its headers: each pass over them notes these.
cdef enum:
    H_TRACEPARENT, H_TRACESTATE, H_HOP, H_DEST, H_ONLY, TRACE_HEADERS


cdef inline void _clear_firsts(PyObject** firsts):
    cdef int slot
    for slot in range(TRACE_HEADERS):
        firsts[slot] = NULL


cdef inline void _note_first(PyObject** firsts, str lowered, PyObject* first):
    # a header's first value into the slot of `lowered`, if it has one still empty
    cdef int slot
    if lowered == "traceparent":
        slot = H_TRACEPARENT
    elif lowered == "tracestate":
        slot = H_TRACESTATE
    elif lowered == _HOP_HEADER:
        slot = H_HOP
    elif lowered == "nats-trace-dest":
        slot = H_DEST
    elif lowered == "nats-trace-only":
        slot = H_ONLY
    else:
        return
    if firsts[slot] == NULL:
        firsts[slot] = first


cdef inline object _first_or(PyObject* first, object default):
    # a noted first value, or `default` where there is none or it is empty (`_or`)
    return default if first == NULL else _or(<object>first, default)


cdef object _trace_message(object server, object headers, object msg_size, object hops, object ingress,
                           object events, object unknown_events, object seq):
    # `TraceMessage(server, headers, msg_size, hops, ingress, events, unknown_events, seq)`,
    # field by field
    msg = _struct_new(_TraceMessage)
    set_field(msg, MSG.server, server)
    set_field(msg, MSG.headers, headers)
    set_field(msg, MSG.msg_size, msg_size)
    set_field(msg, MSG.hops, hops)
    set_field(msg, MSG.ingress, ingress)
    set_field(msg, MSG.events, events)
    set_field(msg, MSG.unknown_events, unknown_events)
    set_field(msg, MSG.seq, seq)
    return msg


cdef object _server_info(object report):
    # `ServerReport.info()`, for msgspec's record: the `ServerInfo` its first slots make (every
    # field of a `ServerInfo`, at the same offsets: `_records.pxi` checks), made slot by slot
    cdef Py_ssize_t offset
    info = _struct_new(_ServerInfo)
    for offset in range(SERVER_SLOTS_START, SERVER_SLOTS_END, sizeof(PyObject*)):
        set_field(info, offset, field(report, offset))
    return info


cdef object _prepared(object raw, object msg, object ctx, object ident, object arrival, tuple issues, object size):
    # `Prepared(raw, msg, ctx, ident, arrival, issues, size)`, field by field
    prepared = _struct_new(_Prepared)
    set_field(prepared, PREPARED.raw, raw)
    set_field(prepared, PREPARED.msg, msg)
    set_field(prepared, PREPARED.ctx, ctx)
    set_field(prepared, PREPARED.ident, ident)
    set_field(prepared, PREPARED.arrival, arrival)
    set_field(prepared, PREPARED.issues, issues)
    set_field(prepared, PREPARED.size, size)
    return prepared


cdef object _content_encoding(dict headers):
    # RawTraceMessage.header("Content-Encoding")
    for key, values in headers.items():
        if key.lower() == "content-encoding" and values:
            return values[0]
    return None


# The lowered forms of the last names with capitals, by the name object: the parse's names
# are its cached texts (`_name`), the same objects from message to message, so a server's
# `Nats-Trace-Hop` is lowered (a new string, hashed anew as the index's key) once, not per
# message. Direct-mapped, owned references: an entry's name cannot be freed and its id reused.
cdef enum:
    LOWERED_SLOTS = 64  # a power of two
cdef PyObject* _lowered_names[LOWERED_SLOTS]
cdef PyObject* _lowered_texts[LOWERED_SLOTS]


cdef str _lower(str key):
    # key.lower(), without a new string when an ASCII name has no capital (most do not)
    cdef Py_ssize_t n, i
    cdef size_t slot
    cdef unsigned char* text
    cdef unsigned char* out
    cdef bint upper = False
    if not PyUnicode_IS_ASCII(key):
        return key.lower()
    n = PyUnicode_GET_LENGTH(key)
    text = PyUnicode_1BYTE_DATA(key)
    for i in range(n):
        if 65 <= text[i] <= 90:
            upper = True
            break
    if not upper:
        return key
    slot = (<size_t><PyObject*>key >> 4) & (LOWERED_SLOTS - 1)
    if _lowered_names[slot] == <PyObject*>key:
        return <str>_lowered_texts[slot]
    lowered = PyUnicode_New(n, 127)
    out = PyUnicode_1BYTE_DATA(lowered)
    for i in range(n):
        out[i] = text[i] + 32 if 65 <= text[i] <= 90 else text[i]
    # No Python code runs between the read above and these writes (the GIL is held).
    Py_INCREF(key)
    Py_INCREF(lowered)
    Py_XDECREF(_lowered_names[slot])
    Py_XDECREF(_lowered_texts[slot])
    _lowered_names[slot] = <PyObject*>key
    _lowered_texts[slot] = <PyObject*>lowered
    return lowered


# "00" to "99": two digits a division (a nanosecond time has 19)
cdef const char* _DIGIT_PAIRS = (b"00010203040506070809101112131415161718192021222324252627282930313233343536373839"
                                 b"40414243444546474849505152535455565758596061626364656667686970717273747576777879"
                                 b"8081828384858687888990919293949596979899")


cdef Py_ssize_t _decimal(unsigned long long value, char* out):
    # the digits of str(value), written at out; returns how many. Made from the last digits
    # up, two at a time, in a buffer whose filled end is then copied.
    cdef char digits[20]
    cdef Py_ssize_t at = 20
    cdef unsigned int pair
    while value >= 100:
        pair = <unsigned int>(value % 100) * 2
        value //= 100
        at -= 2
        digits[at] = _DIGIT_PAIRS[pair]
        digits[at + 1] = _DIGIT_PAIRS[pair + 1]
    if value >= 10:
        pair = <unsigned int>value * 2
        at -= 2
        digits[at] = _DIGIT_PAIRS[pair]
        digits[at + 1] = _DIGIT_PAIRS[pair + 1]
    else:
        at -= 1
        digits[at] = <char>(48 + value)
    memcpy(out, digits + at, 20 - at)
    return 20 - at


cdef bytes _identity(object server_id, unsigned long long ts_value, object cid):
    # ids.identity: _fields(server id, str(ts_ns), str(cid)) in one buffer; odd values
    # (not a str, lone surrogates, a cid outside a uint64) go to the reference's `ids._fields`
    cdef Py_ssize_t id_size = 0, ts_size, cid_size, at
    cdef const char* id_text
    cdef char ts_digits[20]
    cdef char cid_digits[20]
    cdef unsigned long long cid_value
    cdef char* p
    if type(server_id) is not str or type(cid) is not int:
        return _reference_fields(server_id, str(ts_value), str(cid))
    try:
        cid_value = PyLong_AsUnsignedLongLong(cid)
        id_text = PyUnicode_AsUTF8AndSize(server_id, &id_size)
    except (OverflowError, UnicodeEncodeError):  # negative or over a uint64; lone surrogates
        return _reference_fields(server_id, str(ts_value), str(cid))
    if (<unsigned long long>id_size) >> 32:  # its length must fit 4 bytes
        return _reference_fields(server_id, str(ts_value), str(cid))
    ts_size = _decimal(ts_value, ts_digits)
    cid_size = _decimal(cid_value, cid_digits)
    out = PyBytes_FromStringAndSize(NULL, 12 + id_size + ts_size + cid_size)
    p = PyBytes_AS_STRING(out)
    _length(p, id_size)
    memcpy(p + 4, id_text, id_size)
    at = 4 + id_size
    _length(p + at, ts_size)
    memcpy(p + at + 4, ts_digits, ts_size)
    at += 4 + ts_size
    _length(p + at, cid_size)
    memcpy(p + at + 4, cid_digits, cid_size)
    return out
