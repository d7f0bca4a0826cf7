# cython: language_level=3, boundscheck=False, wraparound=False
"""The compiled twin of `pipeline.prepare` (see there, and `decode.decode`,
`ids.trace_context`, `ids.identity`, `linking.body_size`, `pipeline._arrival`, which it
follows step by step) for the common case: no compression, msgspec's one-call decode
succeeds, and a valid traceparent. Anything else - a compressed payload, a document the
fast decode refuses, an ad-hoc or broken trace context - is handed to the pure-Python
`prepare`, so every error and every unusual message is decided by the reference.
Configured by pipeline.py with what it uses, so this module imports none of the core."""

cdef object _python_prepare = None
cdef object _decode_document = None
cdef object _Ingress = None
cdef object _TraceMessage = None
cdef object _TraceContext = None
cdef object _Prepared = None
cdef object _Arrival = None
cdef object _parse_traceparent = None
cdef object _context_fields = None
cdef object _fields = None
cdef object _FORWARDING = None
cdef object _new = tuple.__new__
cdef object _DEFAULT_LIMITS = None


def configure(python_prepare, default_limits, decode_document, ingress, trace_message, trace_context, prepared,
              arrival, parse_traceparent, context_fields, fields, forwarding_kinds):
    """The reference `prepare` and its default `DecodeLimits`, `decode._DOCUMENT.decode`,
    the record types, and the id helpers in use (compiled when built)."""
    global _DEFAULT_LIMITS
    _DEFAULT_LIMITS = default_limits
    global _python_prepare, _decode_document, _Ingress, _TraceMessage, _TraceContext, _Prepared, _Arrival
    global _parse_traceparent, _context_fields, _fields, _FORWARDING
    _python_prepare, _decode_document = python_prepare, decode_document
    _Ingress, _TraceMessage, _TraceContext, _Prepared, _Arrival = ingress, trace_message, trace_context, prepared, arrival
    _parse_traceparent, _context_fields, _fields, _FORWARDING = parse_traceparent, context_fields, fields, forwarding_kinds


cdef bint _uncompressed(dict headers):
    # RawTraceMessage.header("Content-Encoding"), then decompress's test for "no encoding".
    for key, values in headers.items():
        if key.lower() == "content-encoding" and values:
            encoding = values[0]
            return (encoding or "identity").strip().lower() in ("", "identity")
    return True


cdef dict _first_values(dict headers):
    # model.first_values
    cdef dict first = {}
    for key, values in headers.items():
        if values:
            first.setdefault(key.lower(), values[0])
    return first


cdef object _body_size(object msg_size, dict headers):
    # linking.body_size
    for name, values in headers.items():
        if name.lower() == "nats-trace-hop":
            for value in values:
                msg_size -= len(name) + len(value) + 4
            return msg_size
    return msg_size


def prepare(raw, limits=None):
    """As `pipeline.prepare`; the pure-Python one decides whatever is not the common case."""
    if limits is None:
        limits = _DEFAULT_LIMITS
    headers = raw.headers
    if type(headers) is not dict or (headers and not _uncompressed(headers)):
        return _python_prepare(raw, limits)
    payload = raw.payload
    if len(payload) > limits.max_payload_bytes:
        return _python_prepare(raw, limits)
    try:
        doc = _decode_document(payload)
    except Exception:  # not for the fast path: the reference words the error, or decodes it its way
        return _python_prepare(raw, limits)
    # decode._decode_fast's checks
    events = doc.events
    if not events or len(events) > limits.max_events or type(events[0]) is not _Ingress:
        return _python_prepare(raw, limits)
    cdef Py_ssize_t i
    for i in range(1, len(events)):
        if type(events[i]) is _Ingress:
            return _python_prepare(raw, limits)
    request = doc.request
    message_headers = request.header
    index = _first_values(message_headers)
    ingress = events[0]
    server = doc.server
    msg = _TraceMessage(server, message_headers, request.msgsize, doc.hops, ingress, tuple(events[1:]), (), index)
    # ids.trace_context, when the traceparent is valid (otherwise the reference decides)
    traceparent = index.get("traceparent")
    if traceparent is None:
        return _python_prepare(raw, limits)
    try:
        trace_id, parent_id, flags = _parse_traceparent(traceparent)
    except Exception:
        return _python_prepare(raw, limits)
    id_fields = _context_fields(trace_id, parent_id)
    ctx = _TraceContext(trace_id, parent_id, index.get("tracestate") or "", bool(flags & 1), None, id_fields)
    ident = _fields(server.id, str(ingress.ts_ns), str(ingress.cid))  # ids.identity
    size = _body_size(msg.msg_size, message_headers)
    # pipeline._arrival: only a message that came in from another server has one
    arrival = None
    if ingress.kind in _FORWARDING:
        hop = index.get("nats-trace-hop") or ""
        if hop:
            arrival = ((id_fields, hop, ingress.name, server.name), _new(_Arrival, (ingress.ts_ns, size, ident)))
    return _Prepared(raw, msg, ctx, ident, arrival, (), size)
