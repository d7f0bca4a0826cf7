# cython: language_level=3, boundscheck=False, wraparound=False
"""The compiled twin of `network.network_sample` (see there, the reference): the same
sample, read from the decoded message's slots (`_fields.h`) instead of through attribute
look-ups; it runs once per trace message, beside mapping, and the Python version cost
about as much as a tenth of mapping and encoding one.

Only the records `decode` builds are read here, each after an exact type check; anything
else (a hand-built message with other types, an event type this file does not know, an
error that is not a string) goes to the reference, so every sample is the reference's."""

include "_fields.pxi"

cdef object _python_network_sample = None
cdef object _kind_label = None
cdef dict _kind_labels = {}
cdef tuple _not_failures = ()
cdef frozenset _forwarding = frozenset()
cdef object _TraceMessage = None, _ServerInfo = None, _Ingress = None, _Egress = None, _JetStream = None
cdef tuple _quiet_events = ()  # the event types that carry no error (only their time is read)
cdef object _HopSample = None, _NetworkSample = None
cdef object _new = tuple.__new__


cdef struct MessageFields:
    Py_ssize_t server, ingress, events
cdef struct IngressFields:
    Py_ssize_t kind, name, account, subject, error
cdef struct EgressFields:
    Py_ssize_t kind, name, hop, error
cdef MessageFields MSG
cdef IngressFields IN
cdef EgressFields EG
cdef Py_ssize_t JS_ERROR, SERVER_NAME
cdef Py_ssize_t TS_NS  # every event's `ts_ns` (a field of their base class: one offset)


def configure(python_network_sample, not_failures, kind_labels, kind_label, forwarding_kinds, record_types,
              quiet_event_types, sample_types):
    """The reference, `mapping._NOT_FAILURES`, `model`'s kind labels and forwarding kinds,
    the record types read here (TraceMessage, ServerInfo, Ingress, Egress, JetStreamEvent),
    the other event types, and the NamedTuples built (HopSample, NetworkSample). Raises
    TypeError when a field read here is not a plain slot: then the reference is used."""
    global _python_network_sample, _not_failures, _kind_labels, _kind_label, _forwarding
    global _TraceMessage, _ServerInfo, _Ingress, _Egress, _JetStream, _quiet_events, _HopSample, _NetworkSample
    global MSG, IN, EG, JS_ERROR, SERVER_NAME, TS_NS
    _TraceMessage, _ServerInfo, _Ingress, _Egress, _JetStream = record_types
    _quiet_events = tuple(quiet_event_types)
    _HopSample, _NetworkSample = sample_types
    if _HopSample._fields != ("from_server", "to_server", "kind", "latency_ns") or _NetworkSample._fields != (
            "server", "account", "subject", "in_server_ns", "failed", "hop", "failed_hops"):
        raise TypeError("HopSample's or NetworkSample's fields changed")  # built by position below
    MSG = _offsets(_TraceMessage, "server ingress events")
    IN = _offsets(_Ingress, "kind name account subject error")
    EG = _offsets(_Egress, "kind name hop error")
    JS_ERROR = field_offset(_JetStream, "error")
    SERVER_NAME = field_offset(_ServerInfo, "name")
    TS_NS = field_offset(_Ingress, "ts_ns")
    if any(field_offset(kind, "ts_ns") != TS_NS for kind in (_Egress, _JetStream, *_quiet_events)):
        raise TypeError("the event types' ts_ns fields are not one slot")
    _python_network_sample, _kind_label = python_network_sample, kind_label
    _not_failures, _kind_labels, _forwarding = tuple(not_failures), dict(kind_labels), frozenset(forwarding_kinds)


cdef inline object _label(object kind):
    # model.kind_label
    label = _kind_labels.get(kind)
    return label if label is not None else _kind_label(kind)


cdef inline int _failure(object error) except -1:
    # mapping.is_failure, for a str (1, 0), or -2: not a str, the reference decides
    if type(error) is not str:
        return -2
    return 1 if error and not (<str>error).startswith(_not_failures) else 0


def network_sample(msg, upstream_egress_ns):
    """As `network.network_sample`; the reference decides whatever is not decode's records."""
    if type(msg) is not _TraceMessage:
        return _python_network_sample(msg, upstream_egress_ns)
    ingress = field(msg, MSG.ingress)
    server = field(msg, MSG.server)
    events = field(msg, MSG.events)
    if (type(ingress) is not _Ingress or type(server) is not _ServerInfo or type(events) is not tuple
            or (upstream_egress_ns is not None and type(upstream_egress_ns) is not int)):
        return _python_network_sample(msg, upstream_egress_ns)
    cdef int failed = _failure(field(ingress, IN.error))
    if failed < 0:
        return _python_network_sample(msg, upstream_egress_ns)
    cdef tuple failed_hops = ()
    cdef int event_failed
    ingress_ts = field(ingress, TS_NS)
    if type(ingress_ts) is not int:
        return _python_network_sample(msg, upstream_egress_ns)
    end = ingress_ts  # TraceMessage.end_ns: the latest event time
    for event in <tuple>events:
        kind = type(event)
        if kind is _Egress:
            event_failed = _failure(field(event, EG.error))
        elif kind is _JetStream:
            event_failed = _failure(field(event, JS_ERROR))
        elif kind in _quiet_events:
            event_failed = 0
        else:
            return _python_network_sample(msg, upstream_egress_ns)
        if event_failed < 0:
            return _python_network_sample(msg, upstream_egress_ns)
        if event_failed:
            failed = 1
            # Egress.forwards
            if kind is _Egress and field(event, EG.hop) and field(event, EG.kind) in _forwarding:
                failed_hops += ((field(event, EG.name), _label(field(event, EG.kind))),)
        ts = field(event, TS_NS)
        if type(ts) is not int:  # only ints here: the reference raises in its own order
            return _python_network_sample(msg, upstream_egress_ns)
        if ts > end:
            end = ts
    server_name = field(server, SERVER_NAME)
    hop = None
    if upstream_egress_ns is not None:
        hop = _new(_HopSample, (field(ingress, IN.name), server_name, _label(field(ingress, IN.kind)),
                                ingress_ts - upstream_egress_ns))
    return _new(_NetworkSample, (server_name, field(ingress, IN.account), field(ingress, IN.subject),
                                 end - ingress_ts, bool(failed), hop, failed_hops))
