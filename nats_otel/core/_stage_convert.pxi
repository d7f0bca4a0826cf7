# The convert stage: the compiled counterparts of `pipeline.finish`, `PythonConverter` and
# `convert_batch` (see there, the references): the same steps in the same order, with the
# same results, counters and errors. They are glue - a few calls, checks and records per
# trace message - calling the other stages in C.

def finish(prepared, linker, options, encoded=False):
    """As `pipeline.finish`: map an observed message where the linker places it."""
    return _finish(_record_from(prepared), linker, options, encoded, None)


cdef object _finish(MessageRecord record, object linker, object options, bint encoded, object egress_ids):
    # `egress_ids`: the span ids of its forwarding egresses, as the linker hashed them when it
    # observed this message (`Linker._observe`: the one id itself, a tuple of them, or None).
    # The kernel's own stages are called in C (cpdef); a linker of another type, as Python.
    if type(linker) is Linker:
        placement = (<Linker>linker)._locate(record)
        link = (<Linker>linker).take_link()
    else:
        placement, link = linker.locate(record.prepared())
    prepared_issues = record.issues
    cdef list spans = []
    encoding = None
    if encoded:
        # The mapper appends its issues to the prepared ones: the list `Converted` keeps.
        issues = [*prepared_issues] if _truthy(prepared_issues) else []
        encoding = _encoded_spans(record, record, placement, options, egress_ids, issues)  # the message and the context
    else:
        result = _map_message(record.message(), record.context(), placement, options)
        spans, map_issues = result.spans, result.issues
        issues = [*prepared_issues, *map_issues] if _truthy(prepared_issues) else map_issues
    sample = _conclude(record, placement, link, issues)
    converted = _struct_new(_Converted)  # `Converted(spans, issues, link, sample, encoding)`
    set_field(converted, CONVERTED.spans, spans)
    set_field(converted, CONVERTED.issues, issues)
    set_field(converted, CONVERTED.link, _placement_link(placement))
    set_field(converted, CONVERTED.network, sample)
    set_field(converted, CONVERTED.encoded, encoding)
    return converted


cdef inline object _placement_link(object placement):
    """`placement.link`."""
    return (<tuple>placement)[3] if type(placement) is _Placement else placement.link


cdef object _conclude(MessageRecord record, object placement, object link, list issues):
    """What `_finish` (and a batch's conversion, `_convert_into`) does once the message is
    mapped, as `pipeline.finish`: a hop not linked noted in `issues`; the network sample."""
    egress_ns = None
    if link is not None:
        if type(link) is _Link:
            egress, first = (<tuple>link)[1], (<tuple>link)[3]
        else:
            egress, first = link.egress, link.first
        if egress is not None and first:
            egress_ns = (<tuple>egress)[0] if type(egress) is _LinkEgress else egress.ts_ns
    if type(placement) is _Placement:
        ident, trace_id = (<tuple>placement)[0], (<tuple>placement)[1]
        placement_link, candidates = (<tuple>placement)[3], (<tuple>placement)[4]
    else:
        ident, trace_id = placement.ident, placement.trace_id
        placement_link, candidates = placement.link, placement.candidates
    if _truthy(placement_link) and placement_link != _MATCHED:
        message = record.message()  # `upstream_hop` reads its headers as a `TraceMessage`'s
        issues.append(f"hop_{placement_link}: no single upstream egress for hop "
                      f"{_upstream_hop(message)} from {message.ingress.name}"
                      + (f" ({candidates} candidates)" if candidates else ""))
    # The trace and the server span's id inputs, for the latency histograms' exemplars (as in
    # pipeline.finish).
    return network_sample(record, egress_ns, trace_id, record.id_fields, ident)


cdef list _aligned(object raws, object observed):
    """`observed` as a list (itself if it is one: `convert_many` consumes it), checked to be
    `observe_held`'s entries of `raws`, in order (checked whole before any is converted: a
    mismatch converts none)."""
    cdef list entries = observed if type(observed) is list else list(observed)
    cdef list messages = raws if type(raws) is list else list(raws)
    cdef Py_ssize_t at
    if len(entries) != len(messages):
        raise ValueError(f"{len(entries)} observed entries for {len(messages)} messages")
    for at in range(len(entries)):
        if _entry_raw(entries[at]) is not messages[at]:
            raise ValueError(f"observed entry {at} is not observe_held's entry of that message")
    return entries


@cython.final
cdef class Converter:
    """Streaming conversion (the live bridge): `observe` on arrival, `convert` later."""

    cdef public object options
    cdef public object limits
    cdef public object linker
    # id(raw) -> its entry: its record (`_stage_record.pxi`: the raw, its decoded form, its
    # forwarding egresses' span ids), or (raw, its `Rejected`, None): see
    # `pipeline.PythonConverter` (which keeps (raw, its decoded form))
    cdef readonly dict _pending
    cdef Py_ssize_t _pending_capacity

    def __init__(self, options=None, limits=None, link=None, Py_ssize_t pending_capacity=200_000):
        self.options = _DEFAULT_OPTIONS if options is None else options
        self.limits = _DEFAULT_LIMITS if limits is None else limits
        self.linker = Linker(_DEFAULT_LINK if link is None else link)
        self._pending = {}
        self._pending_capacity = pending_capacity

    def observe(self, raw, now=0.0):
        """Decode a message that just arrived and record its hop evidence."""
        self.observe_many((raw,), now)

    def observe_many(self, raws, now=0.0):
        """`observe` each of a batch that just arrived."""
        cdef dict pending = self._pending
        cdef PyObject* entry
        for raw in raws:
            key = id(raw)
            entry = PyDict_GetItemWithError(pending, key)
            if entry is NULL or _entry_raw(<object>entry) is not raw:
                pending[key] = self._prepare_one(raw, now)
        self._bound()

    def observe_held(self, raws, now=0.0, release=None):
        """`observe_many`, handing the batch's entries (one per raw, in order) to the caller
        instead of keeping them in `_pending`: `convert_many(raws, observed=...)` takes them
        back; with `release`, each raw's payload replaced by it once observed. See
        `pipeline.PythonConverter.observe_held`."""
        cdef dict pending = self._pending
        cdef list entries = []
        for raw in raws:
            entry = pending.pop(id(raw), None) if pending else None  # observed before, kept
            entries.append(entry if entry is not None and _entry_raw(entry) is raw else self._prepare_one(raw, now))
            if release is not None:
                if type(raw) is _RawTraceMessage:  # a load and a store: no Python call a message
                    set_field(raw, RAW.payload, release)
                else:
                    _force_setattr(raw, "payload", release)
        return entries

    def adopt(self, observed):
        """Keep entries from `observe_held` in `_pending` after all (bounded), as if observed
        by `observe_many`: for a caller that will not convert them as observed."""
        cdef dict pending = self._pending
        for entry in observed:
            raw = _entry_raw(entry)
            if raw is None:
                raise TypeError(f"not an entry of observe_held: {type(entry).__name__}")
            pending[id(raw)] = entry
        self._bound()

    cdef void _bound(self) except *:
        over = len(self._pending) - self._pending_capacity
        if over > 0:  # the oldest are decoded again when their turn comes
            for key in list(islice(self._pending, over)):
                del self._pending[key]

    def convert(self, raw, now=0.0, encoded=False):
        """Spans of an observed (or not yet observed) message, or why it gave none."""
        # `convert_many` of one, without the batch's tuple and list
        index = self.linker.index
        index.expire(now)
        return self._convert_one(raw, now, encoded, index)

    def convert_many(self, raws, now=0.0, encoded=False, observed=None):
        """`convert` each of a batch (observed with `observe_many` or `observe`, or not; or
        with `observe_held`, its entries given back as `observed`). A list given as
        `observed` is consumed, as in `pipeline.PythonConverter.convert_many`: its entries
        replaced by their results one by one (each freed while still in the CPU's caches),
        and returned."""
        index = self.linker.index
        cdef bint as_bytes = encoded
        cdef list entries
        cdef Py_ssize_t at
        if observed is None:
            index.expire(now)
            return [self._convert_one(raw, now, as_bytes, index) for raw in raws]
        entries = _aligned(raws, observed)
        index.expire(now)
        for at in range(len(entries)):
            entries[at] = self._result_of(entries[at], as_bytes)
        return entries

    def convert_encoded(self, raws, now=0.0, observed=None):
        """`pipeline.PythonConverter.convert_encoded`: the batch converted straight into one
        export request (`EncodedBatch`, `_stage_batch.pxi`). Given `observed` (a list, it is
        consumed, as by `convert_many`); else each message found as `convert_many` finds it."""
        entries = None if observed is None else _aligned(raws, observed)
        self.linker.index.expire(now)
        return _convert_encoded(self, raws if type(raws) is list else list(raws), entries, now)

    cdef object _entry_of(self, object raw, object now, object index):
        """Its entry, observed or (never observed, or forgotten) prepared now."""
        entry = self._pending.pop(id(raw), None)
        if entry is None or _entry_raw(entry) is not raw:
            # never observed (or forgotten): its evidence is new, the bounds apply again
            entry = self._prepare_one(raw, now)
            index.expire(now)
        return entry

    cdef object _convert_one(self, object raw, object now, bint encoded, object index):
        return self._result_of(self._entry_of(raw, now, index), encoded)

    cdef inline object _result_of(self, object entry, bint encoded):
        """An entry's `Converted`, or its `Rejected`."""
        if type(entry) is MessageRecord:
            return _finish(<MessageRecord>entry, self.linker, self.options, encoded, (<MessageRecord>entry).egress_ids)
        return (<tuple>entry)[1]

    cdef object _prepare_one(self, object raw, object now):
        """Its `_pending` entry: its record, its forwarding egresses' span ids in it; or (raw,
        why it has no decoded form, None)."""
        cdef MessageRecord record
        try:
            record = _prepare_record(raw, self.limits)
        except _DecodeError as exc:
            return (raw, _Rejected(exc.reason, exc.detail, raw.subject), None)
        if type(self.linker) is Linker:
            record.egress_ids = (<Linker>self.linker)._observe(record, now)
        else:
            self.linker.observe(record.prepared(), now)
        return record


def convert_batch(raws, options=_DEFAULT_OPTIONS, limits=_DEFAULT_LIMITS, link=_DEFAULT_LINK, report_runs=None):
    """As `pipeline.convert_batch`: whole-input conversion, the result ignoring input order."""
    # The whole input is the window here: nothing is forgotten, nothing expires.
    linker = Linker(link, bounded=False)
    if report_runs is not None:
        linker.index.sequences.ledger.use_runs(report_runs)
    cdef list prepared = []
    cdef MessageRecord record
    for raw in raws:
        if isinstance(raw, _Rejected):
            prepared.append(raw)
            continue
        try:
            record = _prepare_record(raw, limits)
        except _DecodeError as exc:
            prepared.append(_Rejected(exc.reason, exc.detail, raw.subject))
            continue
        record.egress_ids = (<Linker>linker)._observe(record, 0.0)
        prepared.append(record)
    return [_finish(<MessageRecord>p, linker, options, False, (<MessageRecord>p).egress_ids)
            if type(p) is MessageRecord else p for p in prepared]
