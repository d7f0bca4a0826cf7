# The kernel's own parse of a trace message's JSON (issue 39), for the shape servers send:
# one pass over the payload's bytes straight into the records the linker and the mapper read
# (`ServerInfo`, the events), without msgspec's `_Document`, `_Request` and the Python
# `__post_init__` hook it calls per record (each a `force_setattr` call).
#
# It is a strict subset of msgspec's decode (`decode._DOCUMENT`): what it takes, it builds
# exactly as msgspec would (the twin and fuzz tests compare the records); anything it is not
# sure of - an escape in a string, a float, a negative or 19-digit number, a key given twice,
# an event whose first key is not `type`, an unknown event type, deep nesting in a skipped
# value, a field it does not read (`ts_ns`), trailing bytes - makes it decline, and the
# message goes whole to msgspec, then the reference, as before (counted: `declined_by_parser`).
# One pass, no recursion but the skipped values' (depth 8 at most), events bounded by
# `max_events`: a hostile payload costs no more than its size.
#
# A record is made by copying a template of its type (as msgspec's `__copy__` does: a C copy
# of its slots, no hook; `_struct_copy`, without the method call) and replacing the slots
# read from the payload (`set_field`, at the offsets `_fields.h` finds). The templates are
# msgspec's own decode of a minimal document: the defaults are msgspec's (`_parse_specs.pxi`).
# What repeats from report to report of one sender - a server's members before its numbers,
# an event's after its `ts` - is read once and kept (`_parse_kept.pxi`). An event is a slot
# (`_stage_record.pxi`: `EventSlot`): its time, read into `_event_ts`, and its shape, the
# record of its other fields, made at the first of them read into it, or the kept record
# itself when the rest of its members were kept: shared, never written after it is made.

from cpython.long cimport PyLong_FromLongLong
from cpython.list cimport PyList_Append

from libc.stdint cimport int64_t

from nats_otel.core._primitives cimport rfc3339_bytes_c, timestamp_ns_c

cdef Py_ssize_t _declined = 0
cdef uint64_t _event_ts = 0  # the time of the event `_parse_record` read last (its slot's, not its shape's)


def declined_by_parser():
    """How many trace messages the kernel's own JSON parse declined since the process
    started (msgspec decoded them instead, and the reference when msgspec refused them)."""
    return _declined


# --- records ----------------------------------------------------------------------------------

cdef object _parse_record(TypeSpec* spec, const unsigned char* s, Py_ssize_t n, Py_ssize_t at, Py_ssize_t* end):
    # The members of one record's object from `at` (after `{`, or after an event's `type`
    # member and its `,`; at `}` when it has none); `end` gets the index after its `}`.
    cdef Py_ssize_t name[2]
    cdef Py_ssize_t i, size, key_at
    cdef int slot
    cdef unsigned int seen = 0
    cdef bint varying
    cdef FieldSpec* entry
    # What is kept of it (`_parse_kept.pxi`): a server's members before its numbers, from
    # `start` to `cut`; an event's after its `ts`, from `rest_at` (`rest_seen`: read before).
    cdef Kept* prefix = NULL
    cdef Kept* rest = NULL
    cdef Kept* kept
    cdef Py_ssize_t start = at, cut = -1, rest_at = -1
    cdef unsigned int cut_seen = 0, rest_seen = 0
    # A server's record is the one kept for its prefix, itself: the members after it are
    # the report's numbers (`_PARSED`'s), and one of the record's own there makes it a copy
    cdef bint shared = False
    obj = cut_record = None
    if spec.keep == KEEP_PREFIX:
        prefix = _pair(&PREFIXES, s, at, n)
        if prefix is not NULL:
            kept = _taken(&PREFIXES, prefix, <const void*>spec, s, at, n, 0)
            if kept is not NULL:
                obj = <object>kept.record
                shared = True
                seen = kept.seen
                at += kept.size  # at the next member's key
                prefix = NULL  # kept already
    if obj is None:
        # An event's record is made at the first member read into it: its `ts` is its slot's
        # (`_event_ts`), and one whose members after it are kept is the kept record itself
        if spec.keep != KEEP_REST:
            obj = _struct_copy(<object>spec.template)
        if at < n and s[at] == 125:  # }
            at = -(at + 1) - 1
    while at >= 0:
        key_at = at
        at = _key(s, at, n, name)
        if at < 0:
            return _NO
        size = name[1] - name[0]
        entry = NULL
        slot = spec.by_slot[_name_slot(s + name[0], size)] if size > 0 else 0
        if slot > 0:  # the one field the name can be
            i = slot - 1
            if spec.fields[i].size == size and memcmp(s + name[0], spec.fields[i].name, size) == 0:
                entry = &spec.fields[i]
        elif slot < 0:  # several: each compared
            for i in range(spec.count):
                if spec.fields[i].size == size and memcmp(s + name[0], spec.fields[i].name, size) == 0:
                    entry = &spec.fields[i]
                    break
        varying = False
        if entry is NULL:
            at = _skip_member(s, at, n)
        else:
            if seen & (1u << i) or entry.kind == F_DECLINE:
                return _NO
            varying = (spec.varying >> i) & 1
            if varying and prefix is not NULL and cut < 0:  # the first number: the prefix ends here
                cut, cut_seen, cut_record = key_at, seen, _struct_copy(obj)
            seen |= 1u << i
            if shared and entry.offset >= 0:  # a field of the record itself: not the kept one's
                obj = _struct_copy(obj)
                shared = False
            elif obj is None and entry.kind != F_TS:
                obj = _struct_copy(<object>spec.template)
            at = _member(entry, obj, s, n, at)
        if at < 0:
            return _NO
        at = _next(s, at, n, 125)
        if varying and spec.keep == KEEP_REST and rest_at < 0 and at >= 0:  # after the first `ts`
            rest_at, rest_seen = at, seen
            rest = _pair(&RESTS, s, at, n)
            if rest is not NULL:
                kept = _taken(&RESTS, rest, <const void*>spec, s, at, n, seen)
                if kept is not NULL:  # the object ends with its bytes
                    seen |= kept.seen
                    end[0] = at + kept.size
                    if (seen & spec.required) != spec.required:
                        return _NO
                    if obj is None:  # nothing read but the time: the kept record is this event's shape
                        return <object>kept.record
                    _copy_kept(spec, obj, <object>kept.record, kept.seen)  # its fields into this record
                    return obj
    if at == -1 or (seen & spec.required) != spec.required:
        return _NO
    end[0] = -at - 1
    if obj is None:  # an event of its time alone: the template's fields
        obj = <object>spec.template
    if prefix is not NULL and cut > start:
        _keep(&PREFIXES, prefix, <const void*>spec, s + start, cut - start, cut_record, cut_seen)
    # Kept only when nothing but the time came before (the servers' order): then the record
    # holds the kept members' fields and the template's, and can be shared as it is
    if rest is not NULL and (rest_seen & ~spec.varying) == 0:
        _keep(&RESTS, rest, <const void*>spec, s + rest_at, end[0] - rest_at, obj, seen & ~rest_seen)
    return obj


cdef Py_ssize_t _member(FieldSpec* entry, object obj, const unsigned char* s, Py_ssize_t n, Py_ssize_t at) except? -2:
    # One member's value at `at` into its field of `obj` (a `ts` into `_event_ts`); the index
    # after the value, or -1 (declined).
    global _event_ts
    cdef Py_ssize_t value_end
    cdef long long number
    cdef int64_t ns
    cdef bint ascii
    if entry.kind == F_STR or entry.kind == F_TS or entry.kind == F_TIME:
        if entry.kind == F_TIME and _literal(s, at, n, b"null", 4) >= 0:
            return at + 4
        if at >= n or s[at] != 34:
            return -1
        value_end = _string_end(s, at + 1, n, &ascii)
        if value_end < 0:
            return -1
        if entry.kind == F_STR:
            text = _name(s, at + 1, value_end, ascii)
            if text is _NO:
                return -1
            set_field(obj, entry.offset, text)
        elif entry.kind == F_TIME:  # a string, checked as msgspec checks one (its UTF-8): not kept
            if not ascii and _text(s, at + 1, value_end, ascii) is _NO:
                return -1
        # A timestamp: the hook's nanoseconds, into the event's slot (`_event_ts`); its text,
        # as the hook leaves it, is the template's (`ts` "": not kept). Its error is msgspec's.
        elif ascii and rfc3339_bytes_c(s + at + 1, value_end - at - 1, &ns):
            _event_ts = <uint64_t>ns  # within 1970 to 2200
        else:  # another form: the hook's own function decides, from the text
            text = _text(s, at + 1, value_end, ascii)
            if text is _NO:
                return -1
            try:
                _event_ts = PyLong_AsUnsignedLongLong(timestamp_ns_c(text))  # checked: a uint64
            except Exception:  # whatever it raises, msgspec's decode raises it again
                return -1
        return value_end + 1
    if entry.kind == F_UINT or entry.kind == F_SEQ:
        at = _digits(s, at, n, &number)
        if at >= 0:
            if entry.kind == F_SEQ:
                _PARSED.seq = PyLong_FromLongLong(number)
            else:
                set_field(obj, entry.offset, PyLong_FromLongLong(number))
        return at
    if entry.kind == F_BOOL:
        if _literal(s, at, n, b"true", 4) >= 0:
            set_field(obj, entry.offset, True)
            return at + 4
        if _literal(s, at, n, b"false", 5) >= 0:
            set_field(obj, entry.offset, False)
            return at + 5
        return -1
    tags = _strings(s, n, at, &at, True)  # F_TAGS
    if tags is _NO:
        return -1
    set_field(obj, entry.offset, tuple(<list>tags))
    return at


cdef object _strings(const unsigned char* s, Py_ssize_t n, Py_ssize_t at, Py_ssize_t* end, bint names):
    # `[` strings `]` -> a list (a header's values, the server's tags: `names`, cached)
    cdef Py_ssize_t value_end
    cdef bint ascii
    cdef list out = []
    if at >= n or s[at] != 91:
        return _NO
    at = _ws(s, at + 1, n)
    if at < n and s[at] == 93:
        end[0] = at + 1
        return out
    while at >= 0:
        if at >= n or s[at] != 34:
            return _NO
        value_end = _string_end(s, at + 1, n, &ascii)
        if value_end < 0:
            return _NO
        text = _name(s, at + 1, value_end, ascii) if names else _text(s, at + 1, value_end, ascii)
        if text is _NO:
            return _NO
        PyList_Append(out, text)
        at = _next(s, value_end + 1, n, 93)
    if at == -1:
        return _NO
    end[0] = -at - 1
    return out


cdef enum:
    _HEADERS_MAX = 64  # names a header object the parse takes; more: msgspec's (each name is compared to all before it)


cdef object _headers(const unsigned char* s, Py_ssize_t n, Py_ssize_t at, Py_ssize_t* end):
    # `request.header` as `model.TraceHeaders` (name, values, ...: one value as a str, else a
    # tuple), names in any UTF-8 (a name given twice: msgspec's, which keeps the last)
    cdef Py_ssize_t name_end, i
    cdef bint ascii
    cdef list flat = []
    if at >= n or s[at] != 123:
        return _NO
    at = _ws(s, at + 1, n)
    if at < n and s[at] == 125:
        end[0] = at + 1
        return _NO_HEADERS
    while at >= 0:
        if at >= n or s[at] != 34 or PyList_GET_SIZE(flat) == 2 * _HEADERS_MAX:
            return _NO
        name_end = _string_end(s, at + 1, n, &ascii)
        if name_end < 0:
            return _NO
        name = _name(s, at + 1, name_end, ascii)
        if name is _NO:
            return _NO
        for i in range(0, PyList_GET_SIZE(flat), 2):  # a name given twice
            if <object>PyList_GET_ITEM(flat, i) == name:
                return _NO
        at = _ws(s, name_end + 1, n)
        if at >= n or s[at] != 58:
            return _NO
        values = _strings(s, n, _ws(s, at + 1, n), &at, False)
        if values is _NO:
            return _NO
        PyList_Append(flat, name)
        PyList_Append(flat, _header_values(<list>values))
        at = _next(s, at, n, 125)
    if at == -1:
        return _NO
    end[0] = -at - 1
    return _record_n(_TraceHeaders, PyList_GET_SIZE(flat), PySequence_Fast_ITEMS(flat))


cdef inline object _header_values(list values):
    # a name's values as `TraceHeaders` holds them: the one value itself, else a tuple
    return <object>PyList_GET_ITEM(values, 0) if PyList_GET_SIZE(values) == 1 else tuple(values)


# A `TraceHeaders` name's values read as `_header_values` lays them (a str, or a tuple of
# them): how many, and the `i`-th (borrowed). For what the parse or `_trace_headers_of`
# made; anything else is checked by its reader first.
cdef inline Py_ssize_t _values_count(object values):
    return 1 if type(values) is str else PyTuple_GET_SIZE(values)


cdef inline PyObject* _value_at(object values, Py_ssize_t i):
    return <PyObject*>values if type(values) is str else <PyObject*>PyTuple_GET_ITEM(values, i)


cdef object _trace_headers_of(dict headers):
    # `TraceHeaders.of(headers)`, for msgspec's dict of lists (only lists of str: its type)
    cdef list flat = []
    if not headers:
        return _NO_HEADERS
    for name, values in headers.items():
        PyList_Append(flat, name)
        PyList_Append(flat, _header_values(<list>values))
    return _record_n(_TraceHeaders, PyList_GET_SIZE(flat), PySequence_Fast_ITEMS(flat))


cdef object _event(const unsigned char* s, Py_ssize_t n, Py_ssize_t at, Py_ssize_t* end):
    # `{"type": "xx", ...}`: the tag must come first (msgspec finds it anywhere: elsewhere, or
    # a type this version does not know, is msgspec's and the reference's to decide)
    cdef Py_ssize_t name[2]
    cdef Py_ssize_t tag_end
    cdef bint ascii
    cdef TypeSpec* spec
    cdef unsigned char a, b
    if at >= n or s[at] != 123:
        return _NO
    at = _key(s, _ws(s, at + 1, n), n, name)
    if at < 0 or name[1] - name[0] != 4 or memcmp(s + name[0], b"type", 4) != 0 or at >= n or s[at] != 34:
        return _NO
    tag_end = _string_end(s, at + 1, n, &ascii)
    if tag_end != at + 3:
        return _NO
    a, b = s[at + 1], s[at + 2]
    if a == 101 and b == 103:       # eg
        spec = &EGRESS_SPEC
    elif a == 105 and b == 110:     # in
        spec = &INGRESS_SPEC
    elif a == 106 and b == 115:     # js
        spec = &JS_SPEC
    elif a == 115 and b == 105:     # si
        spec = &SI_SPEC
    elif a == 115 and b == 101:     # se
        spec = &SE_SPEC
    elif a == 115 and b == 109:     # sm
        spec = &SM_SPEC
    else:
        return _NO
    at = _next(s, tag_end + 1, n, 125)
    if at == -1:
        return _NO
    if at < -1:  # nothing but the tag: the record sees its `}`
        at = -at - 2
    return _parse_record(spec, s, n, at, end)


cdef bint _events(const unsigned char* s, Py_ssize_t n, Py_ssize_t at, Py_ssize_t* end,
                  Py_ssize_t max_events) except -1:
    # Into `_PARSED`'s slots (its shape and its time each): the ingress first and only
    # there, at least one event, at most `max_events`: what `prepare` takes (anything else is
    # the reference's, through msgspec)
    if at >= n or s[at] != 91:
        return False
    at = _ws(s, at + 1, n)
    while at >= 0:
        event = _event(s, n, at, &at)
        if (event is _NO or (type(event) is _Ingress) != (_PARSED.event_count == 0)
                or _PARSED.event_count == max_events):
            return False
        _PARSED.push(event, _event_ts)
        at = _next(s, at, n, 93)
    if at == -1:
        return False
    end[0] = -at - 1
    return True


cdef object _request(const unsigned char* s, Py_ssize_t n, Py_ssize_t at, Py_ssize_t* end, long long* msg_size):
    # `decode._Request`: its header (msgspec's default {} when absent), its msgsize (0) into `msg_size`
    cdef Py_ssize_t name[2]
    cdef Py_ssize_t size
    cdef long long number = 0
    cdef int seen = 0
    headers = None
    if at >= n or s[at] != 123:
        return _NO
    at = _ws(s, at + 1, n)
    if at < n and s[at] == 125:
        at = -(at + 1) - 1
    while at >= 0:
        at = _key(s, at, n, name)
        if at < 0:
            return _NO
        size = name[1] - name[0]
        if size == 6 and memcmp(s + name[0], b"header", 6) == 0:
            if seen & 1:
                return _NO
            seen |= 1
            headers = _headers(s, n, at, &at)
            if headers is _NO:
                return _NO
        elif size == 7 and memcmp(s + name[0], b"msgsize", 7) == 0:
            if seen & 2:
                return _NO
            seen |= 2
            at = _digits(s, at, n, &number)
        else:
            at = _skip_member(s, at, n)
        if at < 0:
            return _NO
        at = _next(s, at, n, 125)
    if at == -1:
        return _NO
    end[0] = -at - 1
    msg_size[0] = number
    return _NO_HEADERS if headers is None else headers


cdef bint _parse_document(object data, Py_ssize_t max_events) except -1:
    # `decode._Document` as `prepare` reads it, into `_PARSED`: False where it declines (its
    # event slots let go)
    _PARSED.drop_events()
    if _parse_into(data, max_events):
        return True
    _PARSED.clear()
    _PARSED.drop_events()
    return False


cdef bint _parse_into(object data, Py_ssize_t max_events) except -1:
    cdef const unsigned char* s
    cdef Py_ssize_t n, at, size
    cdef Py_ssize_t name[2]
    cdef long long hops = 0, msg_size = 0
    cdef int seen = 0
    server = headers = None
    if type(data) is not bytes:
        return False
    _PARSED.seq = 0  # the report's number as msgspec's default, until the server's block gives it
    s = <const unsigned char*>PyBytes_AS_STRING(data)
    n = PyBytes_GET_SIZE(data)
    at = _ws(s, 0, n)
    if at >= n or s[at] != 123:
        return False
    at = _ws(s, at + 1, n)
    while at >= 0:
        at = _key(s, at, n, name)
        if at < 0:
            return False
        size = name[1] - name[0]
        if size == 6 and memcmp(s + name[0], b"server", 6) == 0:
            if seen & 1 or at >= n or s[at] != 123:
                return False
            seen |= 1
            server = _parse_record(&SERVER_SPEC, s, n, _ws(s, at + 1, n), &at)
            if server is _NO:
                return False
        elif size == 6 and memcmp(s + name[0], b"events", 6) == 0:
            if seen & 2:
                return False
            seen |= 2
            if not _events(s, n, at, &at, max_events):
                return False
        elif size == 7 and memcmp(s + name[0], b"request", 7) == 0:
            if seen & 4:
                return False
            seen |= 4
            headers = _request(s, n, at, &at, &msg_size)
            if headers is _NO:
                return False
        elif size == 4 and memcmp(s + name[0], b"hops", 4) == 0:
            if seen & 8:
                return False
            seen |= 8
            at = _digits(s, at, n, &hops)
        else:
            at = _skip_member(s, at, n)
        if at < 0:
            return False
        at = _next(s, at, n, 125)
    if at == -1 or (seen & 3) != 3 or _ws(s, -at - 1, n) != n:  # both required; nothing after
        return False
    # Without a `request` member: no headers, size 0 (msgspec's defaults).
    _PARSED.server, _PARSED.headers = server, (_NO_HEADERS if headers is None else headers)
    _PARSED.msg_size, _PARSED.hops = PyLong_FromLongLong(msg_size), PyLong_FromLongLong(hops)
    return True
