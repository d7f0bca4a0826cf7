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
# msgspec's own decode of a minimal document: the defaults are msgspec's.

from cpython.long cimport PyLong_FromLongLong
from cpython.list cimport PyList_Append

from msgspec.json import decode as _msgspec_decode

from libc.stdint cimport int64_t

from nats_otel.core._primitives cimport rfc3339_bytes_c, timestamp_ns_c

cdef enum:
    F_STR = 1       # a string
    F_UINT = 2      # a non-negative integer below 10**18 (cid, seq, kind)
    F_BOOL = 3
    F_TAGS = 4      # a list of strings, kept as a tuple
    F_TS = 5        # `ts`: a string, and `ts_ns` from it (the events' hook)
    F_TIME = 6      # `time`: a string or null, and `time_ns` from it (the server's hook)
    F_DECLINE = 7   # a field the parse does not read: a message that has it goes to msgspec

cdef struct FieldSpec:
    const char* name    # the name on the wire (msgspec's `encode_name`)
    Py_ssize_t size
    Py_ssize_t offset
    Py_ssize_t derived  # F_TS, F_TIME: the offset of the field derived from it
    int kind

cdef struct TypeSpec:
    FieldSpec fields[16]
    int count
    unsigned int required   # a bit per field that msgspec requires
    PyObject* template      # held by _TEMPLATES
    # The field a member's name can be, by `_name_slot` of the name: its index + 1; 0 when
    # none; -1 when several share the slot (then they are searched one by one). A name can
    # only be a field's whose slot it has, so one compare decides most members.
    signed char by_slot[64]


cdef inline Py_ssize_t _name_slot(const unsigned char* name, Py_ssize_t size) noexcept:
    # the length and the first and last bytes (size > 0): the wire names differ there
    return (size * 7 + name[0] * 3 + name[size - 1]) & 63

cdef TypeSpec SERVER_SPEC, INGRESS_SPEC, EGRESS_SPEC, JS_SPEC, SI_SPEC, SE_SPEC, SM_SPEC
cdef list _TEMPLATES = []   # keeps the templates and the names' bytes alive
cdef Py_ssize_t _declined = 0

# The field kinds by Python name; any other field of a record is F_DECLINE.
_KIND_OF = {"name": F_STR, "id": F_STR, "host": F_STR, "cluster": F_STR, "domain": F_STR, "version": F_STR,
            "tags": F_TAGS, "jetstream": F_BOOL, "seq": F_UINT, "time": F_TIME, "ts": F_TS, "kind": F_UINT,
            "cid": F_UINT, "account": F_STR, "subject": F_STR, "error": F_STR, "hop": F_STR,
            "subscription": F_STR, "queue": F_STR, "to": F_STR, "from_subject": F_STR, "stream": F_STR,
            "no_interest": F_BOOL}
_DERIVED = {"ts": "ts_ns", "time": "time_ns"}


cdef void _spec(TypeSpec* spec, object cls, bytes minimal, bint tagged) except *:
    cdef Py_ssize_t i, slot
    _plain(cls, True)  # its records are copies of the template (`_struct_copy`)
    fields = _struct_fields(cls)
    if len(fields) + tagged > 16:
        raise TypeError(f"{cls.__name__} has more fields than the parse reads")
    template = _msgspec_decode(minimal, type=cls)
    _TEMPLATES.append(template)
    spec.template = <PyObject*>template
    spec.count = 0
    spec.required = 0
    entries = [(f.encode_name, f.name, f.required) for f in fields]
    if tagged:  # a second `type` key: msgspec's to decide
        entries.append(("type", "", False))
    for encode_name, name, required in entries:
        encoded = encode_name.encode()
        _TEMPLATES.append(encoded)
        entry = &spec.fields[spec.count]
        entry.name = encoded
        entry.size = len(encoded)
        entry.kind = _KIND_OF.get(name, F_DECLINE)
        entry.offset = field_offset(cls, name) if name else -1
        entry.derived = field_offset(cls, _DERIVED[name]) if name in _DERIVED else -1
        if required:
            if entry.kind == F_DECLINE:
                raise TypeError(f"{cls.__name__}.{name} is required and not read")
            spec.required |= 1u << spec.count
        spec.count += 1
    for i in range(64):
        spec.by_slot[i] = 0
    for i in range(spec.count):
        if spec.fields[i].size == 0:
            raise TypeError(f"{cls.__name__} has a field without a name on the wire")
        slot = _name_slot(<const unsigned char*>spec.fields[i].name, spec.fields[i].size)
        spec.by_slot[slot] = i + 1 if spec.by_slot[slot] == 0 else -1


try:
    _spec(&SERVER_SPEC, _ServerInfo, b'{"name":"","id":""}', False)
    _spec(&INGRESS_SPEC, _Ingress, b'{"ts":"1970-01-01T00:00:00Z","kind":0}', True)
    _spec(&EGRESS_SPEC, _EgressEvent, b'{"ts":"1970-01-01T00:00:00Z","kind":0}', True)
    _spec(&JS_SPEC, _JetStreamEvent, b'{"ts":"1970-01-01T00:00:00Z"}', True)
    _spec(&SI_SPEC, _ServiceImport, b'{"ts":"1970-01-01T00:00:00Z"}', True)
    _spec(&SE_SPEC, _StreamExport, b'{"ts":"1970-01-01T00:00:00Z"}', True)
    _spec(&SM_SPEC, _SubjectMapping, b'{"ts":"1970-01-01T00:00:00Z"}', True)
except TypeError as exc:
    raise ImportError(f"a record is not laid out as the kernel's parse reads it: {exc}") from exc


def declined_by_parser():
    """How many trace messages the kernel's own JSON parse declined since the process
    started (msgspec decoded them instead, and the reference when msgspec refused them)."""
    return _declined


def own_parse(data, Py_ssize_t max_events=10_000):
    """The parse alone, for the tests: (server, events, headers, msgsize, hops), or None
    where it declines."""
    parsed = _parse_document(data, max_events)
    return None if parsed is _NO else parsed


# --- records ----------------------------------------------------------------------------------

cdef object _parse_record(TypeSpec* spec, const unsigned char* s, Py_ssize_t n, Py_ssize_t at, Py_ssize_t* end):
    # The members of one record's object from `at` (after `{`, or after an event's `type`
    # member and its `,`; at `}` when it has none); `end` gets the index after its `}`.
    cdef Py_ssize_t name[2]
    cdef Py_ssize_t i, size, value_end
    cdef int slot
    cdef unsigned int seen = 0
    cdef long long number
    cdef int64_t ns
    cdef bint ascii
    cdef FieldSpec* entry
    obj = _struct_copy(<object>spec.template)
    if at < n and s[at] == 125:  # }
        at = -(at + 1) - 1
    while at >= 0:
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
        if entry is NULL:
            at = _skip_member(s, at, n)
        else:
            if seen & (1u << i) or entry.kind == F_DECLINE:
                return _NO
            seen |= 1u << i
            if entry.kind == F_STR or entry.kind == F_TS or entry.kind == F_TIME:
                if entry.kind == F_TIME and _literal(s, at, n, b"null", 4) >= 0:
                    at += 4  # the template's None, and its time_ns None
                    at = _next(s, at, n, 125)
                    continue
                if at >= n or s[at] != 34:
                    return _NO
                value_end = _string_end(s, at + 1, n, &ascii)
                if value_end < 0:
                    return _NO
                if entry.kind == F_STR:
                    text = _name(s, at + 1, value_end, ascii)
                else:
                    text = _text(s, at + 1, value_end, ascii)
                if text is _NO:
                    return _NO
                set_field(obj, entry.offset, text)
                if entry.kind != F_STR:  # the hook's derived nanoseconds; its error is msgspec's
                    if ascii and rfc3339_bytes_c(s + at + 1, value_end - at - 1, &ns):
                        set_field(obj, entry.derived, PyLong_FromLongLong(ns))
                    else:  # another form: the hook's own function decides
                        try:
                            set_field(obj, entry.derived, timestamp_ns_c(text))
                        except Exception:  # whatever it raises, msgspec's decode raises it again
                            return _NO
                at = value_end + 1
            elif entry.kind == F_UINT:
                at = _digits(s, at, n, &number)
                if at < 0:
                    return _NO
                set_field(obj, entry.offset, PyLong_FromLongLong(number))
            elif entry.kind == F_BOOL:
                if _literal(s, at, n, b"true", 4) >= 0:
                    set_field(obj, entry.offset, True)
                    at += 4
                elif _literal(s, at, n, b"false", 5) >= 0:
                    set_field(obj, entry.offset, False)
                    at += 5
                else:
                    return _NO
            else:  # F_TAGS
                tags = _strings(s, n, at, &at, True)
                if tags is _NO:
                    return _NO
                set_field(obj, entry.offset, tuple(<list>tags))
        if at < 0:
            return _NO
        at = _next(s, at, n, 125)
    if at == -1 or (seen & spec.required) != spec.required:
        return _NO
    end[0] = -at - 1
    return obj


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


cdef object _headers(const unsigned char* s, Py_ssize_t n, Py_ssize_t at, Py_ssize_t* end):
    # `request.header`: name -> list of values, names in any UTF-8 (a name given twice: msgspec's)
    cdef Py_ssize_t name_end, size
    cdef bint ascii
    cdef dict out = {}
    if at >= n or s[at] != 123:
        return _NO
    at = _ws(s, at + 1, n)
    if at < n and s[at] == 125:
        end[0] = at + 1
        return out
    while at >= 0:
        if at >= n or s[at] != 34:
            return _NO
        name_end = _string_end(s, at + 1, n, &ascii)
        if name_end < 0:
            return _NO
        name = _name(s, at + 1, name_end, ascii)
        if name is _NO:
            return _NO
        at = _ws(s, name_end + 1, n)
        if at >= n or s[at] != 58:
            return _NO
        values = _strings(s, n, _ws(s, at + 1, n), &at, False)
        if values is _NO:
            return _NO
        size = PyDict_Size(out)
        PyDict_SetItem(out, name, values)
        if PyDict_Size(out) == size:  # a name given twice
            return _NO
        at = _next(s, at, n, 125)
    if at == -1:
        return _NO
    end[0] = -at - 1
    return out


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


cdef object _events(const unsigned char* s, Py_ssize_t n, Py_ssize_t at, Py_ssize_t* end, Py_ssize_t max_events):
    # The ingress first and only there, at least one event, at most `max_events`: what
    # `prepare` takes (anything else is the reference's, through msgspec)
    cdef list out = []
    if at >= n or s[at] != 91:
        return _NO
    at = _ws(s, at + 1, n)
    while at >= 0:
        event = _event(s, n, at, &at)
        if event is _NO or (type(event) is _Ingress) != (len(out) == 0) or len(out) == max_events:
            return _NO
        PyList_Append(out, event)
        at = _next(s, at, n, 93)
    if at == -1:
        return _NO
    end[0] = -at - 1
    return out


cdef object _request(const unsigned char* s, Py_ssize_t n, Py_ssize_t at, Py_ssize_t* end):
    # `decode._Request`: (header, msgsize), msgspec's defaults when absent
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
    return ({} if headers is None else headers), PyLong_FromLongLong(number)


cdef object _parse_document(object data, Py_ssize_t max_events):
    # `decode._Document` as `prepare` reads it: (server, events, headers, msgsize, hops)
    cdef const unsigned char* s
    cdef Py_ssize_t n, at, size
    cdef Py_ssize_t name[2]
    cdef long long hops = 0
    cdef int seen = 0
    server = events = request = None
    if type(data) is not bytes:
        return _NO
    s = <const unsigned char*>PyBytes_AS_STRING(data)
    n = PyBytes_GET_SIZE(data)
    at = _ws(s, 0, n)
    if at >= n or s[at] != 123:
        return _NO
    at = _ws(s, at + 1, n)
    while at >= 0:
        at = _key(s, at, n, name)
        if at < 0:
            return _NO
        size = name[1] - name[0]
        if size == 6 and memcmp(s + name[0], b"server", 6) == 0:
            if seen & 1 or at >= n or s[at] != 123:
                return _NO
            seen |= 1
            server = _parse_record(&SERVER_SPEC, s, n, _ws(s, at + 1, n), &at)
            if server is _NO:
                return _NO
        elif size == 6 and memcmp(s + name[0], b"events", 6) == 0:
            if seen & 2:
                return _NO
            seen |= 2
            events = _events(s, n, at, &at, max_events)
            if events is _NO:
                return _NO
        elif size == 7 and memcmp(s + name[0], b"request", 7) == 0:
            if seen & 4:
                return _NO
            seen |= 4
            request = _request(s, n, at, &at)
            if request is _NO:
                return _NO
        elif size == 4 and memcmp(s + name[0], b"hops", 4) == 0:
            if seen & 8:
                return _NO
            seen |= 8
            at = _digits(s, at, n, &hops)
        else:
            at = _skip_member(s, at, n)
        if at < 0:
            return _NO
        at = _next(s, at, n, 125)
    if at == -1 or (seen & 3) != 3 or _ws(s, -at - 1, n) != n:  # both required; nothing after
        return _NO
    if request is None:  # no `request` member: no headers, size 0 (as msgspec's defaults)
        return server, events, {}, 0, PyLong_FromLongLong(hops)
    return server, events, (<tuple>request)[0], (<tuple>request)[1], PyLong_FromLongLong(hops)
