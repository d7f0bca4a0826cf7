# The kernel's own record of one observed trace message (issue 48, item 1; docs/architecture.md,
# "Next"): what a `pipeline.Prepared` and its `ids.TraceContext` hold, the message's arrival
# unpacked and its forwarding egresses' span ids, in one object. `prepare` makes it,
# `Linker._observe` and `_locate` read it, and the converter holds it as the message's entry
# through the link window (`observe_held`): three objects a message were one `Prepared`,
# one `TraceContext` and the entry's tuple, and a tuple for an arrival (docs/performance.md,
# session 53).
#
# A record is read as a `Prepared` is (`msg`, `ident`, `issues`, `size`, `arrival`, `ctx`,
# `egresses()`) and as its context is (`id_fields`, `trace_state`, `sampled`, `adhoc_key`):
# `ids`' pure functions, which read only a context's `id_fields`, take it as it is. Inside
# the kernel every decoded message is a record: a `Prepared` given to it (`finish`,
# `Linker.observe`, `locate`) is made one at the door (`_record_from`), and what leaves it
# as a `Prepared` or a `TraceContext` (`prepare`, a linker of another type, the reference's
# mapper) is made from it when asked (`prepared()`, `context()`).


@cython.final
@cython.no_gc  # it refers to no container that could refer back to it
@cython.freelist(64)
cdef class MessageRecord:
    """One observed trace message as the kernel holds it: a `Prepared` with its context's
    fields in place of the context, its arrival as two fields, and its entry's span ids."""

    cdef readonly object raw        # the `RawTraceMessage` it was decoded from
    cdef readonly object msg        # its `TraceMessage`
    cdef readonly object ident      # `ids.identity`
    cdef readonly tuple issues
    cdef readonly object size       # `shapes.message_shape`
    # Its trace context's fields (`ids.TraceContext`)
    cdef readonly object id_fields
    cdef readonly object trace_state
    cdef readonly bint sampled
    cdef readonly object adhoc_key
    # `Prepared.arrival` unpacked: the hop's link key and the `Arrival` the link index holds
    # (both None at the origin)
    cdef readonly object arrival_key
    cdef readonly object arrival_entry
    # Its forwarding egresses' span ids as `Linker._observe` hashed them (None, the one id
    # itself, or a tuple of them), for the mapper to reuse
    cdef readonly object egress_ids

    @property
    def arrival(self):
        """`Prepared.arrival`: (its link key, its `Arrival`), or None at the origin."""
        return None if self.arrival_key is None else (self.arrival_key, self.arrival_entry)

    @property
    def ctx(self):
        """Its `TraceContext` (made when asked)."""
        return self.context()

    cpdef object context(self):
        """Its `TraceContext`, made from its fields."""
        return _trace_context_of(self.id_fields, self.trace_state, self.sampled, self.adhoc_key)

    cpdef object prepared(self):
        """Its `Prepared`, made from its fields (what leaves the kernel as the pure code reads it)."""
        return _prepared(self.raw, self.msg, self.context(), self.ident, self.arrival, self.issues, self.size)

    def egresses(self):
        """`Prepared.egresses`."""
        return self.prepared().egresses()

    def __repr__(self):
        return f"MessageRecord({self.prepared()!r})"


cdef MessageRecord _record_of(object raw, object msg, object ident, object arrival_key, object arrival_entry,
                              tuple issues, object size, object id_fields, object trace_state, bint sampled,
                              object adhoc_key):
    cdef MessageRecord record = MessageRecord.__new__(MessageRecord)  # tp_new: no Python call
    record.raw, record.msg, record.ident, record.issues, record.size = raw, msg, ident, issues, size
    record.id_fields, record.trace_state, record.sampled, record.adhoc_key = id_fields, trace_state, sampled, adhoc_key
    record.arrival_key, record.arrival_entry = arrival_key, arrival_entry
    return record


cdef MessageRecord _record_from(object prepared):
    """The record of a `Prepared` (one the reference made, or one given to the kernel's
    `finish`, `Linker.observe` or `locate`: inside the kernel every message is a record);
    a record as it is."""
    if type(prepared) is MessageRecord:
        return <MessageRecord>prepared
    ctx = prepared.ctx
    arrival = prepared.arrival
    key = entry = None
    if arrival is not None:
        key, entry = arrival
    issues = prepared.issues
    return _record_of(prepared.raw, prepared.msg, prepared.ident, key, entry,
                      issues if type(issues) is tuple else tuple(issues), prepared.size,
                      ctx.id_fields, ctx.trace_state, ctx.sampled, ctx.adhoc_key)


cdef inline object _as_context(object ctx):
    """A `TraceContext` for Python code that reads one (a record's made from its fields)."""
    return (<MessageRecord>ctx).context() if type(ctx) is MessageRecord else ctx


# A context's `id_fields`, read from a record or a `TraceContext` at its place, from anything
# else by name.

cdef inline object _id_fields_of(object ctx):
    if type(ctx) is MessageRecord:
        return (<MessageRecord>ctx).id_fields
    return field(ctx, CTX.id_fields) if type(ctx) is _TraceContext else ctx.id_fields


# --- the converter's entries: a record, or (raw, `Rejected`, None) for a message that gave none

cdef inline object _entry_raw(object entry):
    """The raw message an entry is of (None: not an entry)."""
    if type(entry) is MessageRecord:
        return (<MessageRecord>entry).raw
    if type(entry) is tuple and PyTuple_GET_SIZE(entry) == 3:
        return (<tuple>entry)[0]
    return None


def with_egress_ids(MessageRecord record, egress_ids):
    """A copy of `record` holding other forwarding span ids: for the twins' tests (the
    mapper writes the ids it is given)."""
    copy = _record_of(record.raw, record.msg, record.ident, record.arrival_key, record.arrival_entry, record.issues,
                      record.size, record.id_fields, record.trace_state, record.sampled, record.adhoc_key)
    copy.egress_ids = egress_ids
    return copy


def observed_entries(entries):
    """`pipeline.observed_entries` for this converter's entries: each record with its
    position (read as a `Prepared` is: `evidence.evidence_of` takes it as it is)."""
    return [(at, entry) for at, entry in enumerate(entries) if type(entry) is MessageRecord]


def observed(converter, raws):
    """`pipeline.observed`: the records of `raws` that `converter` observed and keeps."""
    pending = converter._pending
    found = []
    for raw in raws:
        entry = pending.get(id(raw))
        if type(entry) is MessageRecord and (<MessageRecord>entry).raw is raw:
            found.append(entry)
    return found
