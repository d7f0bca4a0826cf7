# The compiled twin of `network.network_sample` (see there, the reference): the same
# sample, read from the decoded message's slots (`_fields.h`) instead of through attribute
# look-ups; it runs once per trace message, beside mapping, and the Python version cost
# about as much as a tenth of mapping and encoding one.
#
# Only the records `decode` builds are read here, each after an exact type check; anything
# else (a hand-built message with other types, an event type this file does not know, an
# error that is not a string) goes to the reference, so every sample is the reference's.

cdef inline int _failure(object error) except -1:
    # mapping.is_failure, for a str (1, 0), or -2: not a str, the reference decides
    if type(error) is not str:
        return -2
    return 1 if PyUnicode_GET_LENGTH(error) != 0 and not (<str>error).startswith(_NOT_FAILURES) else 0


cdef object _network_by_reference(object msg, object upstream_egress_ns, object trace_id, object id_fields,
                                  object ident):
    _handed[H_NETWORK] += 1
    return _reference_network_sample(_as_message(msg), upstream_egress_ns, trace_id, id_fields, ident)


cpdef object network_sample(object msg, object upstream_egress_ns, object trace_id=b"", object id_fields=b"",
                            object ident=b""):
    """As `network.network_sample`; the reference decides whatever is not decode's records
    (`msg`: a `TraceMessage`, or the kernel's record of one)."""
    cdef MessageRecord record = _message_record(msg)
    if record is None:
        return _network_by_reference(msg, upstream_egress_ns, trace_id, id_fields, ident)
    ingress, server = _shape_at(record, 0), record.server
    if (type(ingress) is not _Ingress or type(server) is not _ServerInfo
            or (upstream_egress_ns is not None and type(upstream_egress_ns) is not int)):
        return _network_by_reference(msg, upstream_egress_ns, trace_id, id_fields, ident)
    cdef int failed = _failure(field(ingress, IN.error))
    if failed < 0:
        return _network_by_reference(msg, upstream_egress_ns, trace_id, id_fields, ident)
    cdef tuple failed_hops = ()
    cdef int event_failed
    cdef Py_ssize_t position
    cdef uint64_t ingress_ts = record.event_slots[0].ts_ns, end = ingress_ts  # end: TraceMessage.end_ns
    for position in range(1, record.event_count):
        event = _shape_at(record, position)
        kind = type(event)
        if kind is _EgressEvent:
            event_failed = _failure(field(event, EG.error))
        elif kind is _JetStreamEvent:
            event_failed = _failure(field(event, JS.error))
        elif kind in _QUIET_EVENTS:
            event_failed = 0
        else:
            return _network_by_reference(msg, upstream_egress_ns, trace_id, id_fields, ident)
        if event_failed < 0:
            return _network_by_reference(msg, upstream_egress_ns, trace_id, id_fields, ident)
        if event_failed:
            failed = 1
            # Egress.forwards
            if kind is _EgressEvent and field(event, EG.hop) and _forwards(field(event, EG.kind)):
                failed_hops += ((field(event, EG.name), _label(field(event, EG.kind))),)
        if record.event_slots[position].ts_ns > end:
            end = record.event_slots[position].ts_ns
    server_name = field(server, SRV.name)
    hop = None
    if upstream_egress_ns is not None:
        hop = _record4(_HopSample, field(ingress, IN.name), server_name, _label(field(ingress, IN.kind)),
                       PyLong_FromUnsignedLongLong(ingress_ts) - upstream_egress_ns)
    # The sample's ten fields laid out for `_record_n` (no tuple of them made and freed).
    cdef object account = field(ingress, IN.account), subject = field(ingress, IN.subject)
    cdef object in_server = PyLong_FromUnsignedLongLong(end - ingress_ts), failed_flag = True if failed else False
    cdef PyObject* items[10]
    items[0], items[1], items[2], items[3], items[4] = (<PyObject*>server_name, <PyObject*>account, <PyObject*>subject,
                                                        <PyObject*>in_server, <PyObject*>failed_flag)
    items[5], items[6], items[7], items[8], items[9] = (<PyObject*>hop, <PyObject*>failed_hops, <PyObject*>trace_id,
                                                        <PyObject*>id_fields, <PyObject*>ident)
    return _record_n(_NetworkSample, 10, items)
