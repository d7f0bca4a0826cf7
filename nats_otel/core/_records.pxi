# The records the kernel reads, and where each field it reads lies in them: the one place a
# record's layout is known. A msgspec Struct's field (or a `__slots__` class's attribute) is
# a slot at a fixed offset (`_fields.h`), found here once, when the kernel is imported; each
# read after an exact type check is then a load. The NamedTuples built or read by position
# are checked here too.
#
# A record not laid out as read here (a field that is not a plain slot, a NamedTuple's
# fields renamed or moved) makes the import fail with ImportError: `accel` then records why
# and the pure-Python reference runs.

cdef struct MessageFields:      # model.TraceMessage
    Py_ssize_t server, ingress, events, unknown_events, msg_size, hops, headers, seq
cdef struct IngressFields:      # model.Ingress
    Py_ssize_t ts_ns, kind, cid, name, account, subject, error
cdef struct EgressFields:       # model.Egress (the event)
    Py_ssize_t ts_ns, kind, cid, name, hop, account, subscription, queue, error
cdef struct JetStreamFields:    # model.JetStreamEvent
    Py_ssize_t error
cdef struct ServerFields:       # model.ServerInfo
    Py_ssize_t id, name, version, host, cluster, domain, tags, jetstream
cdef struct ReportFields:       # model.ServerReport (msgspec's, the parse declined)
    Py_ssize_t seq
cdef struct ContextFields:      # ids.TraceContext
    Py_ssize_t id_fields, trace_state, sampled, adhoc_key
cdef struct PreparedFields:     # pipeline.Prepared
    Py_ssize_t raw, msg, ctx, ident, arrival, issues, size
cdef struct ConvertedFields:    # results.Converted
    Py_ssize_t spans, issues, link, network, encoded
cdef struct RawFields:          # decode.RawTraceMessage
    Py_ssize_t headers, payload
cdef struct DocumentFields:     # decode._Document
    Py_ssize_t server, events, request, hops
cdef struct RequestFields:      # decode._Request
    Py_ssize_t header, msgsize
cdef struct OptionsFields:      # mapping.MappingOptions (a frozen dataclass with slots)
    Py_ssize_t service_name, header_allowlist

# The link window's bookkeeping (`_stage_ledger.pxi` writes into these plain classes' slots)
cdef struct LedgerFields:       # report_ledger.ReportLedger
    Py_ssize_t _reports, _fixed, _servers, _bounded, _fifo, receiving, _members, _covers
cdef struct RunsFields:         # report_ledger._ServerRuns
    Py_ssize_t firsts, lasts, since_ns, until_ns, touched, due
cdef struct MemberFields:       # report_ledger._Member
    Py_ssize_t heard
cdef struct SequencesFields:    # sequences.HopSequences
    Py_ssize_t _bounded, latency, _link_pairs, ledger, _decided
cdef struct LatencyFields:      # link_latency.LinkLatency
    Py_ssize_t _samples, _estimates
cdef struct PairsFields:        # sequences._LinkPairs
    Py_ssize_t pairs, times

cdef MessageFields MSG
cdef IngressFields IN
cdef EgressFields EG
cdef JetStreamFields JS
cdef ServerFields SRV
cdef ReportFields REPORT
cdef Py_ssize_t SERVER_SLOTS_START, SERVER_SLOTS_END  # where a `ServerInfo`'s slots lie (`_plain`)
cdef ContextFields CTX
cdef PreparedFields PREPARED
cdef ConvertedFields CONVERTED
cdef RawFields RAW
cdef DocumentFields DOC
cdef RequestFields REQ
cdef OptionsFields OPTIONS
cdef LedgerFields LEDGER
cdef RunsFields RUNS
cdef MemberFields MEMBER
cdef SequencesFields SEQ
cdef LatencyFields LATENCY
cdef PairsFields PAIRS
cdef Py_ssize_t TS_NS  # every event's `ts_ns` (a field of their base class: one offset)

# NamedTuples built with `tuple.__new__` or read by position.
_BY_POSITION = {
    _Placement: ("ident", "trace_id", "parent_span_id", "link", "candidates"),
    _Link: ("result", "egress", "candidates", "first"),
    _LinkEgress: ("ts_ns", "size", "ident", "span_id"),
    _Arrival: ("ts_ns", "size", "ident"),
    _HopSample: ("from_server", "to_server", "kind", "latency_ns"),
    _NetworkSample: ("server", "account", "subject", "in_server_ns", "failed", "hop", "failed_hops", "trace_id",
                     "id_fields", "ident"),
    _EncodedSpans: ("resource", "data", "span_count"),
}

try:
    MSG = _offsets(_TraceMessage, "server ingress events unknown_events msg_size hops headers seq")
    IN = _offsets(_Ingress, "ts_ns kind cid name account subject error")
    EG = _offsets(_EgressEvent, "ts_ns kind cid name hop account subscription queue error")
    JS = _offsets(_JetStreamEvent, "error")
    SRV = _offsets(_ServerInfo, "id name version host cluster domain tags jetstream")
    REPORT = _offsets(_ServerReport, "seq")
    # `_server_info` copies a `ServerReport`'s first slots into a `ServerInfo`: its fields all,
    # end to end (`_plain`), where the report has them
    _plain(_ServerInfo)
    for _field in _struct_fields(_ServerInfo):
        if field_offset(_ServerReport, _field.name) != field_offset(_ServerInfo, _field.name):
            raise TypeError(f"ServerReport.{_field.name} is not where ServerInfo has it")
    SERVER_SLOTS_START, SERVER_SLOTS_END = object.__basicsize__, _ServerInfo.__basicsize__
    CTX = _offsets(_TraceContext, "id_fields trace_state sampled adhoc_key")
    PREPARED = _offsets(_Prepared, "raw msg ctx ident arrival issues size")
    CONVERTED = _offsets(_Converted, "spans issues link network encoded")
    for _record in (_TraceMessage, _TraceContext, _Prepared, _Converted):  # made field by field (`_struct_new`)
        _plain(_record)
    RAW = _offsets(_RawTraceMessage, "headers payload")
    DOC = _offsets(_Document, "server events request hops")
    REQ = _offsets(_DecodedRequest, "header msgsize")
    OPTIONS = _offsets(MappingOptions, "service_name header_allowlist")
    LEDGER = _offsets(_ReportLedger, "_reports _fixed _servers _bounded _fifo receiving _members _covers")
    RUNS = _offsets(_ServerRuns, "firsts lasts since_ns until_ns touched due")
    MEMBER = _offsets(_Member, "heard")
    SEQ = _offsets(_HopSequences, "_bounded latency _link_pairs ledger _decided")
    LATENCY = _offsets(_LinkLatency, "_samples _estimates")
    PAIRS = _offsets(_LinkPairs, "pairs times")
    TS_NS = field_offset(_Ingress, "ts_ns")
    for _event_type in (_EgressEvent, _SubjectMapping, _StreamExport, _ServiceImport, _JetStreamEvent):
        if field_offset(_event_type, "ts_ns") != TS_NS:
            raise TypeError("the event types' ts_ns fields are not one slot")
    for _record, _fields_read in _BY_POSITION.items():
        if not issubclass(_record, tuple) or _record._fields != _fields_read:
            raise TypeError(f"{_record.__name__}'s fields changed: {_record._fields}")
    # model.TraceHeaders, made with `tuple.__new__` and read at its items: a tuple and no more
    if _TraceHeaders.__bases__ != (tuple,) or _TraceHeaders.__slots__ != ():
        raise TypeError("TraceHeaders is not a plain tuple of its items")
except TypeError as exc:
    raise ImportError(f"a record is not laid out as the kernel reads it: {exc}") from exc
