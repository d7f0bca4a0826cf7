# The compiled twin of `mapping.map_message` followed by `otlp_wire`'s span encoding (see
# `span_bytes.python_map_encode`, the reference): one decoded trace message -> its spans
# as encoded `ScopeSpans.spans` entries, with no span record, attribute dict or tuple built.
#
# The values and their order follow mapping.py; the attribute names and constant values
# are not written here but taken from mapping.py (`span_layout`, which checks that the
# layout is the one this file writes). Anything unusual (a string with lone surrogates, an
# odd type, headers differing only in case) makes `map_encode` hand the whole message to
# the Python twin, so the bytes are the pure path's in every case. The attributes' encoded
# pairs, and the roles and positions they are written by: `_stage_pairs.pxi`.


cdef enum:
    CLIENT = 0  # ConnectionKind.CLIENT

cdef tuple _ON = ("1", "true", "on")


cdef object _label(object kind):
    label = _KIND_LABELS.get(kind)
    return label if label is not None else f"kind-{kind}"


cdef int put_span_head(Buf* s, bytes trace_id, const char* span_id, const char* parent, Py_ssize_t parent_size,
                       object state, const char* prefix, Py_ssize_t prefix_size, object rest, bint always, int kind,
                       uint64_t start, uint64_t end) except -1:
    """A span's fields up to its attributes, as `otlp_wire._span` writes them; the name is
    `prefix + " " + rest`, or `prefix` alone when `rest` is empty and not `always`. The span
    id is 8 bytes at `span_id`."""
    cdef Py_ssize_t rest_size = 0
    cdef const char* rest_data = NULL
    if not put_ids_at(s, trace_id, span_id, 8, state, parent, parent_size):
        return 0
    if type(rest) is not str:
        return 0
    try:
        rest_data = PyUnicode_AsUTF8AndSize(rest, &rest_size)
    except UnicodeEncodeError:
        return 0
    put_byte(s, 0x2a)
    if rest_size or always:
        put_varint(s, <uint64_t>(prefix_size + 1 + rest_size))
        put(s, prefix, prefix_size)
        put_byte(s, 0x20)
        put(s, rest_data, rest_size)
    else:
        put_varint(s, <uint64_t>prefix_size)
        put(s, prefix, prefix_size)
    put_byte(s, 0x30)
    put_byte(s, kind)
    put_times(s, start, end)
    return 1


cdef int put_status(Buf* s, object error) except -1:
    """`mapping._status` as span field 15 (nothing for no error, or a note)."""
    cdef Buf status
    if not len(error) or error.startswith(_NOT_FAILURES):
        return 1
    buf_init(&status, 64)
    try:
        if not put_utf8(&status, 2, error):
            return 0
        put(&status, b"\x18\x02", 2)  # StatusCode.ERROR
        put_field(s, 15, status.data, status.size)
    finally:
        buf_free(&status)
    return 1


cdef inline object _note(object error):
    return error if len(error) and error.startswith(_NOT_FAILURES) else None


cdef int put_outcome(Buf* s, int role, int index, object error) except -1:
    """What `mapping._child` makes of an event's error: a note attribute, or the status."""
    note = _note(error)
    if note is not None and not put_pair(s, role, index, note):
        return 0
    return put_status(s, error)


cdef inline int close_span(Buf* blob, Buf* s) except -1:
    put_field(blob, 2, s.data, s.size)
    s.size = 0
    return 1


cdef inline object _allowlist_of(object options):
    # `options.header_allowlist`: a load at its slot for a `MappingOptions` (a frozen dataclass
    # with slots), not an attribute look-up per message
    return _read(options, MappingOptions, OPTIONS.header_allowlist, "header_allowlist")


cdef inline object _service_name_of(object options):
    # `options.service_name`, likewise
    return _read(options, MappingOptions, OPTIONS.service_name, "service_name")


cdef int _trace_headers(object headers, PyObject** firsts) except -1:
    """The first values of the trace's own headers (a `TraceHeaders`) into `firsts`
    (`_note_first`, in `_stage_prepare.pxi`); 0 for a name that is not a str or values that
    are not a str or a tuple of them (the Python twin decides)."""
    cdef Py_ssize_t at
    _clear_firsts(firsts)
    for at in range(0, PyTuple_GET_SIZE(headers), 2):
        name = <object>PyTuple_GET_ITEM(headers, at)
        values = <object>PyTuple_GET_ITEM(headers, at + 1)
        if not PyUnicode_CheckExact(name) or (type(values) is not str and type(values) is not tuple):
            return 0
        if _values_count(values):
            _note_first(firsts, _lower(<str>name), _value_at(values, 0))
    return 1


cdef inline object _egress_id_at(object egress_ids, Py_ssize_t at):
    """The span id at `at` of a message's forwarding egresses', as `Linker._observe` gives them
    (the one id itself, a tuple of them, or None); None past the last."""
    if type(egress_ids) is tuple:
        return (<tuple>egress_ids)[at] if at < PyTuple_GET_SIZE(egress_ids) else None
    return egress_ids if at == 0 else None


cdef int map_encode_c(Buf* blob, Buf* s, object msg, object ctx, object placement, object options,
                      list issues, object egress_ids) except -1:
    # `egress_ids`: the span ids of the forwarding egresses, in order, as the linker's `_observe`
    # hashed them for this message (the one id itself, or a tuple of them; None: hash them here).
    # Exact types only: the fields below are read at their offsets. Anything else (headers
    # not a `TraceHeaders`) is mapped by the Python twin.
    if type(placement) is not _Placement:
        return 0
    # The message and the context: the kernel's record of the message (both), or a
    # `TraceMessage` (made a record: `_message_record`) and a `TraceContext`
    cdef object ingress, headers, unknown, msg_size, hops, trace_state
    cdef MessageRecord record = _message_record(msg)
    if record is None:  # anything else: the Python twin's
        return 0
    ingress, headers, unknown = _shape_at(record, 0), record.headers, record.unknown_events
    msg_size, hops = record.msg_size, record.hops
    if type(ctx) is MessageRecord:
        trace_state, adhoc_key = (<MessageRecord>ctx).trace_state, (<MessageRecord>ctx).adhoc_key
    elif type(ctx) is _TraceContext:
        trace_state, adhoc_key = field(ctx, CTX.trace_state), field(ctx, CTX.adhoc_key)
    else:
        return 0
    cdef PyObject* firsts[TRACE_HEADERS]  # the trace's headers' first values (`_trace_headers`)
    cdef tuple where = <tuple>placement  # (ident, trace_id, parent_span_id, link, candidates)
    cdef object ident = where[0]
    cdef object trace_id = where[1]
    if type(headers) is not _TraceHeaders or type(ingress) is not _Ingress or not _trace_headers(headers, firsts):
        return 0
    cdef object subject = field(ingress, IN.subject)
    cdef object account = field(ingress, IN.account)
    cdef object ingress_kind = field(ingress, IN.kind)
    cdef object error = field(ingress, IN.error)
    cdef bytes parent  # the server span's
    cdef unsigned char server_id[8]
    cdef unsigned char hashed_id[8]
    cdef const char* span_id
    cdef Py_ssize_t forwarded = 0  # forwarding egresses met so far: the next one's id is egress_ids[forwarded]
    cdef bint forwards
    cdef uint64_t start, end, ts
    cdef int position = 0, i
    if type(trace_id) is not bytes or type(ident) is not bytes or type(trace_state) is not str \
            or type(where[2]) is not bytes:
        return 0
    parent = where[2]
    server_span_id_into(server_id, ctx, ident)
    start = record.event_slots[0].ts_ns
    end = start
    for position in range(1, record.event_count):
        if not _known_event(_shape_at(record, position)):
            return 0
        ts = record.event_slots[position].ts_ns
        if ts > end:
            end = ts
    hop = ""
    if _forwards(ingress_kind):
        hop = _first_or(firsts[H_HOP], "")
    # the server span
    if not put_span_head(s, trace_id, <char*>server_id, PyBytes_AS_STRING(parent), PyBytes_GET_SIZE(parent),
                         trace_state, "receive", 7, subject, False, 5, start, end):
        return 0
    for i in range(3):
        put_const(s, SERVER, i)
    if not (put_pair(s, SERVER, S_SUBJECT, subject) and put_pair(s, SERVER, S_SIZE, msg_size)
            and put_pair(s, SERVER, S_ACCOUNT, account) and put_pair(s, SERVER, S_KIND, _label(ingress_kind))
            and put_pair(s, SERVER, S_CID, field(ingress, IN.cid)) and put_pair(s, SERVER, S_NAME, field(ingress, IN.name))
            and put_pair(s, SERVER, S_HOPS, hops)):
        return 0
    if ingress_kind == CLIENT and not put_client_id(s, SERVER, S_CLIENT_ID, field(ingress, IN.cid)):
        return 0
    if _truthy(hop) and not put_pair(s, SERVER, S_HOP, hop):
        return 0
    if _truthy(_first_or(firsts[H_DEST], None)) and _first_or(firsts[H_ONLY], "").lower() in _ON:
        put_const(s, SERVER, S_ONLY)
    if adhoc_key is not None and not put_pair(s, SERVER, S_ADHOC, adhoc_key):
        return 0
    link = where[3]
    if _truthy(link) and link != "matched":
        if not put_pair(s, SERVER, S_LINK, link):
            return 0
        if _truthy(where[4]) and not put_pair(s, SERVER, S_CANDIDATES, where[4]):
            return 0
    if _truthy(unknown):
        put_pair(s, SERVER, S_UNMAPPED, len(unknown))
        for u in unknown:
            issues.append(f"unknown_event: {u['problem']} at position {u['position']}")
    note = _note(error)
    if note is not None and not put_pair(s, SERVER, S_NOTE, note):
        return 0
    if _truthy(headers) and not put_headers(s, headers, _allowlist_of(options)):
        return 0
    if not put_status(s, error):
        return 0
    close_span(blob, s)
    # one child span per event
    for position in range(1, record.event_count):
        event = _shape_at(record, position)
        ts = record.event_slots[position].ts_ns
        if ts < start:
            ts = start
        kind = type(event)
        span_id = <char*>hashed_id
        if kind is _EgressEvent:
            connection = field(event, EG.kind)
            name = field(event, EG.name)
            # `event.forwards`, as the linker's `_observe` tells a forwarding egress: it hashed
            # this one's id already (`egress_ids`, in the same order).
            forwards = _truthy(field(event, EG.hop)) and _forwards(connection)
            known = _egress_id_at(egress_ids, forwarded) if forwards else None
            if known is not None:
                forwarded += 1
            if type(known) is bytes and PyBytes_GET_SIZE(known) == 8:
                span_id = PyBytes_AS_STRING(known)
            else:
                event_span_id_into(hashed_id, ctx, ident, position)
            if not put_span_head(s, trace_id, span_id, <char*>server_id, 8, trace_state, "send", 4, subject, False, 4,
                                 start, ts):
                return 0
            for i in range(3):
                put_const(s, EGRESS, i)
            if not (put_pair(s, EGRESS, E_DEST, subject) and put_pair(s, EGRESS, E_ACCOUNT, _or(field(event, EG.account), account))
                    and put_pair(s, EGRESS, E_KIND, _label(connection)) and put_pair(s, EGRESS, E_CID, field(event, EG.cid))
                    and put_pair(s, EGRESS, E_NAME, name)):
                return 0
            if connection == CLIENT and not put_client_id(s, EGRESS, E_CLIENT_ID, field(event, EG.cid)):
                return 0
            value = field(event, EG.subscription)
            if _truthy(value) and not put_pair(s, EGRESS, E_SUB, value):
                return 0
            value = field(event, EG.queue)
            if _truthy(value) and not put_pair(s, EGRESS, E_QUEUE, value):
                return 0
            if forwards:
                if not (put_pair(s, EGRESS, E_HOP, field(event, EG.hop)) and put_pair(s, EGRESS, E_PEER, name)):
                    return 0
            if not put_outcome(s, EGRESS, E_NOTE, field(event, EG.error)):
                return 0
            close_span(blob, s)
            continue
        event_span_id_into(hashed_id, ctx, ident, position)
        if kind is _SubjectMapping:
            to = event.to
            if not (put_span_head(s, trace_id, span_id, <char*>server_id, 8, trace_state, "map", 3, to, True, 1, start,
                                  ts)
                    and put_pair(s, MAPPING, M_FROM, subject) and put_pair(s, MAPPING, M_TO, to)):
                return 0
            subject = to  # later egresses deliver on the mapped subject
        elif kind is _StreamExport:
            if not (put_span_head(s, trace_id, span_id, <char*>server_id, 8, trace_state, "stream export", 13,
                                  event.account, True, 1, start, ts)
                    and put_pair(s, EXPORT, X_ACCOUNT, event.account) and put_pair(s, EXPORT, X_SUBJECT, event.to)):
                return 0
        elif kind is _ServiceImport:
            if not (put_span_head(s, trace_id, span_id, <char*>server_id, 8, trace_state, "service import", 14,
                                  event.account, True, 1, start, ts)
                    and put_pair(s, IMPORT, I_ACCOUNT, event.account) and put_pair(s, IMPORT, I_FROM, event.from_subject)
                    and put_pair(s, IMPORT, I_TO, event.to)):
                return 0
            subject, account = event.to, event.account
        elif kind is _JetStreamEvent:
            if not put_span_head(s, trace_id, span_id, <char*>server_id, 8, trace_state, "store", 5, event.stream,
                                 False, 1, start, ts):
                return 0
            for i in range(3):
                put_const(s, JETSTREAM, i)
            if not (put_pair(s, JETSTREAM, J_DEST, event.subject or subject)
                    and put_pair(s, JETSTREAM, J_STREAM, event.stream)
                    and put_pair(s, JETSTREAM, J_NO_INTEREST, event.no_interest)):
                return 0
            if not put_outcome(s, JETSTREAM, J_NOTE, event.error):
                return 0
        else:
            return 0
        close_span(blob, s)
    return record.event_count  # its spans: the server's and one an event


cdef dict _resources = {}  # mapping.server_resource's key -> its resource

# The resources of the server records met last, found without the nine-field key: every
# message has a record of its own (its `seq` and `time` differ), but the kernel's parse
# gives the same server's records the very same field objects (`_json._name` caches the
# strings). A direct-mapped table by the address of the record's `id` string; each slot
# holds (a record, its service name, its resource). A record whose fields are the held
# record's fields (the same objects; tags equal: a tuple is made per record) has the same
# resource: identical values are equal values, so the key would be equal too. Any field
# that is not the same object (another server, a record msgspec decoded) goes by the key.
cdef enum:
    _BY_RECORD_SLOTS = 64  # a power of two
cdef list _resources_by_record = [None] * _BY_RECORD_SLOTS


cdef inline bint _same_fields(object server, object held):
    """The resource's fields of two `ServerInfo`s are the same objects (tags: equal)."""
    if server is held:  # the usual: the parse hands a server's reports its one record
        return True
    if (field(server, SRV.id) is not field(held, SRV.id) or field(server, SRV.name) is not field(held, SRV.name)
            or field(server, SRV.version) is not field(held, SRV.version)
            or field(server, SRV.host) is not field(held, SRV.host)
            or field(server, SRV.cluster) is not field(held, SRV.cluster)
            or field(server, SRV.domain) is not field(held, SRV.domain)
            or field(server, SRV.jetstream) is not field(held, SRV.jetstream)):
        return False
    tags, held_tags = field(server, SRV.tags), field(held, SRV.tags)
    return tags is held_tags or (type(tags) is tuple and type(held_tags) is tuple and <tuple>tags == <tuple>held_tags)


cdef object _resource_of(object server, object service_name):
    """`mapping.server_resource`: like the record met last with the same `id` object
    (`_resources_by_record`), else by its key made from the server's slots; the Python
    function (a frame, nine attribute reads) runs only for a server not seen yet."""
    if type(server) is not _ServerInfo:
        return _server_resource(server, service_name)
    server_id = field(server, SRV.id)
    # Objects are 16-byte aligned: the bits above those pick the slot.
    cdef Py_ssize_t slot = (<Py_ssize_t><PyObject*>server_id >> 4) & (_BY_RECORD_SLOTS - 1)
    held = (<list>_resources_by_record)[slot]
    if held is not None and (<tuple>held)[1] is service_name and _same_fields(server, (<tuple>held)[0]):
        return (<tuple>held)[2]
    tags = field(server, SRV.tags)
    if type(tags) is not tuple:  # the reference's key copies it into one
        return _server_resource(server, service_name)
    resource = _resource_by_fields(server, service_name, tags)
    (<list>_resources_by_record)[slot] = (server, service_name, resource)
    return resource


cdef object _resource_by_fields(object server, object service_name, tuple tags):
    key = (service_name, field(server, SRV.id), field(server, SRV.name), field(server, SRV.version),
           field(server, SRV.host), field(server, SRV.cluster), field(server, SRV.domain), tags,
           field(server, SRV.jetstream))
    cdef PyObject* hit = PyDict_GetItemWithError(_resources, key)
    if hit != NULL:
        return <object>hit
    resource = _server_resource(server, service_name)
    if PyDict_Size(_resources) >= 4096:  # as the reference's memo: bounded
        _resources.clear()
    _resources[key] = resource
    return resource


cdef object _map_encode_by_reference(object msg, object ctx, object placement, object options):
    _handed[H_MAP] += 1
    return _reference_map_encode(_as_message(msg), _as_context(ctx), placement, options)


# The two buffers `map_encode` writes a message's spans into, kept from call to call: two
# allocations and frees per message fewer, and no regrowing. A call takes them while it
# writes; one that finds them taken (another thread's call, switched to while Python code
# runs in the first: a resource not seen yet, the reference) writes into its own.
cdef Buf _kept_blob, _kept_span
cdef bint _kept_taken = False
buf_init(&_kept_blob, 1024)
buf_init(&_kept_span, 512)

cdef enum:
    _KEPT_MAX = 1 << 16  # a buffer grown past this by a large message is given back


cdef inline int _give_back(Buf* b, Py_ssize_t cap, Py_ssize_t limit) except -1:
    """A kept buffer grown past `limit` replaced by a new one of `cap` bytes."""
    cdef Buf fresh
    if b.cap > limit:
        buf_init(&fresh, cap)  # first: a MemoryError leaves `b` as it was, usable
        buf_free(b)
        b[0] = fresh
    return 0


cpdef object map_encode(object msg, object ctx, object placement, object options):
    """(resource, encoded spans, span count, issues) of one trace message: the bytes
    `python_map_encode` gives, written in C (or by it, for unusual input)."""
    cdef list issues = []
    encoded = _encoded_spans(msg, ctx, placement, options, None, issues)
    return (<tuple>encoded)[0], (<tuple>encoded)[1], (<tuple>encoded)[2], issues


cdef object _encoded_spans(object msg, object ctx, object placement, object options, object egress_ids,
                           list issues):
    """`map_encode` as the converter wants it: an `EncodedSpans`, its issues appended to
    `issues` (no tuple to unpack and no list of its own per message). `egress_ids`: the span
    ids of its forwarding egresses the linker hashed already (`Linker._observe`; None: hashed here)."""
    global _kept_taken
    cdef Buf own_blob, own_span
    cdef Buf* blob = &_kept_blob
    cdef Buf* s = &_kept_span
    cdef bint kept = not _kept_taken
    cdef Py_ssize_t count
    own_blob.data = own_span.data = NULL
    if kept:
        _kept_taken = True
        blob.size = 0
    else:
        blob, s = &own_blob, &own_span
    try:
        if not kept:
            buf_init(blob, 1024)
            buf_init(s, 512)
        resource = _spans_into(blob, s, msg, ctx, placement, options, egress_ids, issues, &count)
        spans = PyBytes_FromStringAndSize(blob.data, blob.size)
    finally:
        if kept:
            _kept_taken = False
            _give_back(blob, 1024, _KEPT_MAX)
            _give_back(s, 512, _KEPT_MAX)
        else:
            buf_free(blob)
            buf_free(s)
    return _record3(_EncodedSpans, resource, spans, count)


cdef object _spans_into(Buf* blob, Buf* s, object msg, object ctx, object placement, object options,
                        object egress_ids, list issues, Py_ssize_t* count):
    """The message's spans appended to `blob` (`s`: the scratch of one span), their number
    into `count`; returns their resource. Written in C, or, for what the C writer hands over,
    by the reference (what the writer wrote and noted undone first). `_encoded_spans` and a
    batch's conversion (`_convert_into`) both write through here."""
    cdef Py_ssize_t mark = blob.size, noted = len(issues)
    s.size = 0
    count[0] = map_encode_c(blob, s, msg, ctx, placement, options, issues, egress_ids)
    if count[0]:  # the writer took it: a record, or exactly a `TraceMessage`
        server = (<MessageRecord>msg).server if type(msg) is MessageRecord else field(msg, MSG.server)
        return _resource_of(server, _service_name_of(options))
    blob.size = mark
    del issues[noted:]
    resource, data, spans, more = _map_encode_by_reference(msg, ctx, placement, options)
    issues.extend(more)
    put_bytes(blob, data)
    count[0] = spans
    return resource
