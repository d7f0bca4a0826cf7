# The records the kernel's parse (`_stage_parse.pxi`) builds, and where each field it reads
# lies in them: for each record type (`TypeSpec`), the wire name of each field, its kind,
# its offset in the record (`_fields.h`) and what the model's hook derives from it, found
# when the kernel is imported from the model's own classes. What varies from report to
# report of one sender, and so what the parse keeps of the rest (`_parse_kept.pxi`), is
# named here too. A record that is not laid out as read makes the import fail (ImportError:
# `accel` then records why, and the pure-Python reference runs).

from msgspec.json import decode as _msgspec_decode

cdef enum:
    F_STR = 1       # a string
    F_UINT = 2      # a non-negative integer below 10**18 (cid, seq, kind)
    F_BOOL = 3
    F_TAGS = 4      # a list of strings, kept as a tuple
    F_TS = 5        # `ts`: a string read into `ts_ns`, not kept (the events' hook)
    F_TIME = 6      # the server's `time`: a string or null, checked as one and not kept (`ServerReport`)
    F_DECLINE = 7   # a field the parse does not read: a message that has it goes to msgspec
    F_SEQ = 8       # the server's `seq`: as F_UINT, into the report's `seq`

cdef enum:  # what the parse keeps of a record's object (`_parse_kept.pxi`)
    KEEP_NONE = 0
    KEEP_PREFIX = 1     # the members before the first varying one (a server's)
    KEEP_REST = 2       # the members after the first varying one (an event's, after `ts`)


cdef struct FieldSpec:
    const char* name    # the name on the wire (msgspec's `encode_name`)
    Py_ssize_t size
    Py_ssize_t offset   # -1: not a field of the record (F_SEQ: the report's, `_PARSED`'s; F_TIME)
    Py_ssize_t derived  # F_TS: the offset of the field derived from it
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
    # The fields whose values change from report to report of one sender (a bit each: the
    # server's `seq` and `time`, an event's `ts`), and what of the rest is kept
    # (`_parse_kept.pxi`): the members before the first of them, or those after it.
    unsigned int varying
    int keep                # KEEP_*


cdef inline Py_ssize_t _name_slot(const unsigned char* name, Py_ssize_t size) noexcept:
    # the length and the first and last bytes (size > 0): the wire names differ there
    return (size * 7 + name[0] * 3 + name[size - 1]) & 63

cdef TypeSpec SERVER_SPEC, INGRESS_SPEC, EGRESS_SPEC, JS_SPEC, SI_SPEC, SE_SPEC, SM_SPEC
cdef list _TEMPLATES = []   # keeps the templates and the names' bytes alive

# The field kinds by Python name; any other field of a record is F_DECLINE.
_KIND_OF = {"name": F_STR, "id": F_STR, "host": F_STR, "cluster": F_STR, "domain": F_STR, "version": F_STR,
            "tags": F_TAGS, "jetstream": F_BOOL, "ts": F_TS, "kind": F_UINT,
            "cid": F_UINT, "account": F_STR, "subject": F_STR, "error": F_STR, "hop": F_STR,
            "subscription": F_STR, "queue": F_STR, "to": F_STR, "from_subject": F_STR, "stream": F_STR,
            "no_interest": F_BOOL}
_DERIVED = {"ts": "ts_ns"}
# The members of the server's block that are the report's (`ServerReport`'s fields that are
# not `ServerInfo`'s): `seq` read into `_PARSED`, `time` checked, neither into the record.
_REPORT_KIND_OF = {"seq": F_SEQ, "time": F_TIME}


cdef void _spec(TypeSpec* spec, object cls, bytes minimal, bint tagged, object wire=None) except *:
    # `wire`: the class whose fields the object's members are (`cls` when None); those
    # `cls` lacks are the report's (`_REPORT_KIND_OF`)
    cdef Py_ssize_t i, slot
    _plain(cls, True)  # its records are copies of the template (`_struct_copy`)
    own = {f.name for f in _struct_fields(cls)}
    fields = _struct_fields(cls if wire is None else wire)
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
        entry.kind = _KIND_OF.get(name, F_DECLINE) if name in own or not name else _REPORT_KIND_OF.get(name, F_DECLINE)
        entry.offset = field_offset(cls, name) if name in own else -1
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
    spec.varying = 0
    spec.keep = KEEP_NONE


cdef void _keeps(TypeSpec* spec, int keep, tuple varying):
    cdef int i
    spec.keep = keep
    for i in range(spec.count):
        if spec.fields[i].name in varying:
            spec.varying |= 1u << i


try:
    _spec(&SERVER_SPEC, _ServerInfo, b'{"name":"","id":""}', False, _ServerReport)
    _spec(&INGRESS_SPEC, _Ingress, b'{"ts":"1970-01-01T00:00:00Z","kind":0}', True)
    _spec(&EGRESS_SPEC, _EgressEvent, b'{"ts":"1970-01-01T00:00:00Z","kind":0}', True)
    _spec(&JS_SPEC, _JetStreamEvent, b'{"ts":"1970-01-01T00:00:00Z"}', True)
    _spec(&SI_SPEC, _ServiceImport, b'{"ts":"1970-01-01T00:00:00Z"}', True)
    _spec(&SE_SPEC, _StreamExport, b'{"ts":"1970-01-01T00:00:00Z"}', True)
    _spec(&SM_SPEC, _SubjectMapping, b'{"ts":"1970-01-01T00:00:00Z"}', True)
except TypeError as exc:
    raise ImportError(f"a record is not laid out as the kernel's parse reads it: {exc}") from exc
_keeps(&SERVER_SPEC, KEEP_PREFIX, (b"seq", b"time"))
_keeps(&INGRESS_SPEC, KEEP_REST, (b"ts",))
_keeps(&EGRESS_SPEC, KEEP_REST, (b"ts",))
_keeps(&JS_SPEC, KEEP_REST, (b"ts",))
_keeps(&SI_SPEC, KEEP_REST, (b"ts",))
_keeps(&SE_SPEC, KEEP_REST, (b"ts",))
_keeps(&SM_SPEC, KEEP_REST, (b"ts",))
