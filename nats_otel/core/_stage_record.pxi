# The kernel's own record of one observed trace message (issue 48, item 1; docs/architecture.md,
# "Next"): what a `pipeline.Prepared`, its `model.TraceMessage` and its `ids.TraceContext`
# hold, the message's arrival unpacked and its forwarding egresses' span ids, in one
# object. `prepare` makes it, `Linker._observe` and `_locate`, the mapper and the network
# sample read it, and the converter holds it as the message's entry through the link window
# (`observe_held`): four objects a message were one `Prepared`, one `TraceMessage`, one
# `TraceContext` and the entry's tuple, and a tuple for an arrival (docs/performance.md,
# session 53).
#
# A record is read as a `Prepared` is (`msg`, `ident`, `issues`, `size`, `arrival`, `ctx`,
# `egresses()`), as its message's fields are (`server`, `headers`, `ingress`, `events`...)
# and as its context is (`id_fields`, `trace_state`, `sampled`, `adhoc_key`): the kernel's
# mapper and network sample take it as the message and as the context, and `ids`' pure
# functions, which read only a context's `id_fields`, take it as it is. Inside
# the kernel every decoded message is a record: a `Prepared` given to it (`finish`,
# `Linker.observe`, `locate`) is made one at the door (`_record_from`), and what leaves it
# as a `Prepared`, a `TraceMessage` or a `TraceContext` (`prepare`, a linker of another
# type, the reference's mapper) is made from it when asked (`prepared()`, `message()`,
# `context()`).
#
# Its events are not a model record each (issue 48, item 1: "a Struct per event"): each is
# a slot of two fields, its time and its **shape** - the model event with every field of
# the event but its time, which the parse shares between every message whose event has the
# same members after its `ts` (a connection's kind, id, name, account, subject: the kept
# rest, `_parse_kept.pxi`). So an event costs its message 16 bytes in the record, where
# it was a msgspec `Struct` and its time's `int` (~120 bytes, two blocks) and the events' tuple
# (docs/performance.md, session 54). The kernel reads a slot's time, never its shape's
# `ts_ns`; a model event is made of the two only when Python asks (`ingress`, `events`,
# `message()`). A hand-made message whose events are not all the model's, each with a uint64
# time, is odd (`odd_events`): each event is its own shape, its time read from it by name
# (`_time_of`), and the mapper and the network sample hand it to the reference.

from cpython.long cimport PyLong_FromUnsignedLongLong
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from cpython.ref cimport Py_XDECREF
from libc.stdint cimport uint64_t


cdef struct EventSlot:
    PyObject* shape     # (owned) the event's model record, its time aside (its `ts_ns` not read)
    uint64_t ts_ns      # the event's time: what the servers' `ts` names


cdef enum:
    # The slots a record holds in itself: an ingress and two events (a message delivered,
    # stored, or mapped then delivered); more take a block of PyMem's. The corpus: 264 of
    # its 268 messages have two, 4 three, 1 four; four inline held 31 bytes a message more.
    INLINE_EVENTS = 3

cdef object _U64_END = 2**64


cdef inline bint _known_event(object event):
    """Of one of the model's types of event after the ingress exactly (its fields at their offsets)."""
    kind = type(event)
    return (kind is _EgressEvent or kind is _SubjectMapping or kind is _StreamExport or kind is _ServiceImport
            or kind is _JetStreamEvent)


cdef inline bint _model_event(object event):
    """Of one of the model's event types exactly, the ingress's too."""
    return type(event) is _Ingress or _known_event(event)


cdef object _event_of(MessageRecord record, Py_ssize_t i):
    """The model event of slot `i`: its shape, or a copy of it with the slot's time (an odd
    record's shapes are its events)."""
    shape = <object>record.event_slots[i].shape
    cdef uint64_t ts_ns = record.event_slots[i].ts_ns
    if record.odd_events:
        return shape
    held = field(shape, TS_NS)
    if type(held) is int and PyLong_AsUnsignedLongLong(held) == ts_ns:
        return shape
    event = _struct_copy(shape)
    set_field(event, TS_NS, PyLong_FromUnsignedLongLong(ts_ns))
    return event


@cython.final
@cython.no_gc  # it refers to no container that could refer back to it
@cython.freelist(64)
cdef class MessageRecord:
    """One observed trace message as the kernel holds it: a `Prepared` with its message's
    and its context's fields in place of the message and the context, its arrival as two
    fields, and its entry's span ids."""

    cdef readonly object raw        # the `RawTraceMessage` it was decoded from
    # Its message's fields (`model.TraceMessage`)
    cdef readonly object server
    cdef readonly object headers
    cdef readonly object msg_size
    cdef readonly object hops
    # The ingress and the events after it: `event_count` slots at `event_slots` (at
    # `_inline_events`, or PyMem's when more), read at their slots (`ingress`, `events`: made when asked)
    cdef EventSlot* event_slots
    cdef Py_ssize_t event_count
    cdef EventSlot _inline_events[INLINE_EVENTS]
    # Its events are not all the model's with a uint64 time (a hand-made message): their
    # shapes are the events, the slots' times not set
    cdef readonly bint odd_events
    cdef readonly object unknown_events
    cdef readonly object seq
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

    def __dealloc__(self):
        _release_events(self)

    @property
    def ingress(self):
        """`TraceMessage.ingress` (made when asked)."""
        return _event_of(self, 0) if self.event_count else None

    @property
    def events(self):
        """`TraceMessage.events` (made when asked)."""
        cdef Py_ssize_t i, n = self.event_count - 1 if self.event_count else 0
        out = PyTuple_New(n)
        for i in range(n):
            event = _event_of(self, i + 1)
            Py_INCREF(event)
            PyTuple_SET_ITEM(out, i, event)
        return out

    def shapes(self):
        """Its events' shapes, the ingress's first: the objects it holds for them (for the
        tests and the held-memory bench; `ingress` and `events` are made when asked)."""
        return tuple([_shape_at(self, i) for i in range(self.event_count)])

    @property
    def arrival(self):
        """`Prepared.arrival`: (its link key, its `Arrival`), or None at the origin."""
        return None if self.arrival_key is None else (self.arrival_key, self.arrival_entry)

    @property
    def msg(self):
        """Its `TraceMessage` (made when asked)."""
        return self.message()

    @property
    def ctx(self):
        """Its `TraceContext` (made when asked)."""
        return self.context()

    cpdef object message(self):
        """Its `TraceMessage`, made from its fields."""
        return _trace_message(self.server, self.headers, self.msg_size, self.hops, self.ingress, self.events,
                              self.unknown_events, self.seq)

    cpdef object context(self):
        """Its `TraceContext`, made from its fields."""
        return _trace_context_of(self.id_fields, self.trace_state, self.sampled, self.adhoc_key)

    cpdef object prepared(self):
        """Its `Prepared`, made from its fields (what leaves the kernel as the pure code reads it)."""
        return _prepared(self.raw, self.message(), self.context(), self.ident, self.arrival, self.issues, self.size)

    def egresses(self):
        """`Prepared.egresses`."""
        return self.prepared().egresses()

    def __repr__(self):
        return f"MessageRecord({self.prepared()!r})"


cdef inline MessageRecord _new_record(object raw):
    """An empty record of `raw` (tp_new: no Python call); its maker sets the rest."""
    cdef MessageRecord record = MessageRecord.__new__(MessageRecord)
    record.raw = raw
    record.event_slots = record._inline_events
    return record


# --- a record's event slots

cdef void _release_events(MessageRecord record) noexcept:
    """Let its shapes go, and its slots' memory when not its own (its deallocation)."""
    cdef Py_ssize_t i
    for i in range(record.event_count):
        Py_XDECREF(record.event_slots[i].shape)
    record.event_count = 0
    if record.event_slots is not NULL and record.event_slots != record._inline_events:
        PyMem_Free(record.event_slots)
    record.event_slots = record._inline_events


cdef EventSlot* _event_room(MessageRecord record, Py_ssize_t count) except NULL:
    """Room for `count` slots in an empty record (its own, or PyMem's when more)."""
    if count > INLINE_EVENTS:
        record.event_slots = <EventSlot*>PyMem_Malloc(count * sizeof(EventSlot))
        if record.event_slots is NULL:
            record.event_slots = record._inline_events
            raise MemoryError()
    return record.event_slots


cdef void _take_events(MessageRecord record, object ingress, object events, Py_ssize_t first) except *:
    """`ingress` and `events[first:]` (model events, each its own shape, or a hand-made
    message's: odd) into the empty `record`'s slots."""
    if type(events) is not tuple and type(events) is not list:  # a hand-made message's: as iterating it raises
        events = tuple(events)
    cdef Py_ssize_t i, n = len(events) - first
    cdef EventSlot* slots = _event_room(record, 1 + n)
    cdef uint64_t ts_ns
    for i in range(1 + n):
        event = ingress if i == 0 else events[first + i - 1]
        ts_ns = 0
        if not record.odd_events:
            ts = field(event, TS_NS) if _model_event(event) else None
            if type(ts) is int and 0 <= ts < _U64_END:  # as decode makes it (the hook checks)
                ts_ns = PyLong_AsUnsignedLongLong(ts)
            else:
                record.odd_events = True
        Py_INCREF(event)
        slots[i].shape, slots[i].ts_ns = <PyObject*>event, ts_ns
        record.event_count = i + 1


cdef inline object _shape_at(MessageRecord record, Py_ssize_t i):
    """The shape of slot `i` (borrowed: the record holds it)."""
    return <object>record.event_slots[i].shape


cdef object _time_of(MessageRecord record, Py_ssize_t i):
    """The time of slot `i` as an `int` (an odd record's event's own `ts_ns`, read by name)."""
    if record.odd_events:
        return (<object>record.event_slots[i].shape).ts_ns
    return PyLong_FromUnsignedLongLong(record.event_slots[i].ts_ns)


cdef void _take_message(MessageRecord record, object msg) except *:
    """`msg`'s fields (a `TraceMessage`) into `record`."""
    if type(msg) is _TraceMessage:
        record.server, record.headers = field(msg, MSG.server), field(msg, MSG.headers)
        record.msg_size, record.hops = field(msg, MSG.msg_size), field(msg, MSG.hops)
        _take_events(record, field(msg, MSG.ingress), field(msg, MSG.events), 0)
        record.unknown_events, record.seq = field(msg, MSG.unknown_events), field(msg, MSG.seq)
    else:
        record.server, record.headers, record.msg_size, record.hops = msg.server, msg.headers, msg.msg_size, msg.hops
        _take_events(record, msg.ingress, msg.events, 0)
        record.unknown_events, record.seq = msg.unknown_events, msg.seq


cdef void _take_context(MessageRecord record, object ctx) except *:
    """`ctx`'s fields (a `TraceContext`) into `record`."""
    record.id_fields, record.trace_state, record.sampled, record.adhoc_key = (ctx.id_fields, ctx.trace_state,
                                                                              ctx.sampled, ctx.adhoc_key)


cdef MessageRecord _record_from(object prepared):
    """The record of a `Prepared` (one the reference made, or one given to the kernel's
    `finish`, `Linker.observe` or `locate`: inside the kernel every message is a record);
    a record as it is (one made empty from Python, with no events to read, refused)."""
    if type(prepared) is MessageRecord:
        if (<MessageRecord>prepared).event_count == 0:
            raise TypeError("an empty MessageRecord (the kernel makes them: prepare, Converter.observe_held)")
        return <MessageRecord>prepared
    ctx = prepared.ctx  # read first, as the reference's `finish` does: not a `Prepared`, the same error
    cdef MessageRecord record = _new_record(prepared.raw)
    _take_message(record, prepared.msg)
    _take_context(record, ctx)
    arrival = prepared.arrival
    if arrival is not None:
        record.arrival_key, record.arrival_entry = arrival
    issues = prepared.issues
    record.issues = issues if type(issues) is tuple else tuple(issues)
    record.ident, record.size = prepared.ident, prepared.size
    return record


cdef MessageRecord _message_record(object msg):
    """The record the mapper and the network sample read a message from: the kernel's
    record as it is, a `TraceMessage` whose events are a tuple made one (its events read at
    their slots); None, for the reference, for anything else, for a hand-made message's
    odd events, and for a record made empty from Python (no slot to read)."""
    cdef MessageRecord record
    if type(msg) is MessageRecord:
        record = <MessageRecord>msg
    elif type(msg) is _TraceMessage and type(field(msg, MSG.events)) is tuple:
        record = _new_record(None)
        _take_message(record, msg)
    else:
        return None
    return None if record.event_count == 0 or record.odd_events else record


cdef inline object _as_message(object msg):
    """A `TraceMessage` for Python code that reads one (a record's made from its fields)."""
    return (<MessageRecord>msg).message() if type(msg) is MessageRecord else msg


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
    copy = _record_from(record.prepared())
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
