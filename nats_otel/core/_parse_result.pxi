# What the kernel's own parse (`_stage_parse.pxi`) hands on for one trace message: the
# parts of its document (`_ParsedDocument`, one filled for every parse: `_PARSED`) and its
# events' slots (`EventSlot`, `_stage_record.pxi`), which the message's record takes
# (`hand_events`); and the parse alone, for the tests (`own_parse`, `event_shapes`).

from cpython.mem cimport PyMem_Realloc


def own_parse(data, Py_ssize_t max_events=10_000):
    """The parse alone, for the tests: (server, events, headers, msgsize, hops, seq), or None
    where it declines; the events as the model's records (a record's slots made into them)."""
    if not _parse_document(data, max_events):
        return None
    cdef MessageRecord record = _new_record(None)
    _PARSED.hand_events(record)
    events = [record.ingress]
    events.extend(record.events)
    server, headers, msg_size, hops, seq = _PARSED.take()
    return server, events, headers, msg_size, hops, seq


def event_shapes(data, Py_ssize_t max_events=10_000):
    """The parse's event slots, for the tests: [(shape, ts_ns)], or None where it declines."""
    if not _parse_document(data, max_events):
        return None
    _PARSED.clear()
    shapes = [(<object>_PARSED.slots[i].shape, _PARSED.slots[i].ts_ns) for i in range(_PARSED.event_count)]
    _PARSED.drop_events()
    return shapes


@cython.final
cdef class _ParsedDocument:
    """What `_parse_document` read (`decode._Document` as `prepare` reads it), until `take`
    lets it go. One is filled for every parse (`_PARSED`): a tuple of its five parts and
    one of the request's two, made and unpacked for each trace message, were two allocations.
    The server block's `seq` is the report's (`TraceMessage.seq`), read into it as the block
    is parsed. The events are slots (`EventSlot`: a shape and a time), handed to the
    message's record (`hand_events`); their room is kept from parse to parse (at most
    `max_events` slots, 16 bytes each)."""
    cdef object server, headers, msg_size, hops, seq
    cdef EventSlot* slots
    cdef Py_ssize_t event_count, event_room

    def __dealloc__(self):
        self.drop_events()
        PyMem_Free(self.slots)

    cdef tuple take(self):
        """(server, headers, msgsize, hops, seq), and nothing held here any more but the
        event slots."""
        parts = (self.server, self.headers, self.msg_size, self.hops, self.seq)
        self.clear()
        return parts

    cdef inline void clear(self):
        """Let the parts go once read (`prepare` reads them at their slots, then clears)."""
        self.server = self.headers = self.msg_size = self.hops = self.seq = None

    cdef int push(self, object shape, uint64_t ts_ns) except -1:
        """One event's slot after the others (its shape held here until handed on)."""
        cdef EventSlot* grown
        if self.event_count == self.event_room:
            grown = <EventSlot*>PyMem_Realloc(self.slots, (self.event_room * 2 + 8) * sizeof(EventSlot))
            if grown is NULL:
                raise MemoryError()
            self.slots, self.event_room = grown, self.event_room * 2 + 8
        Py_INCREF(shape)
        self.slots[self.event_count].shape = <PyObject*>shape
        self.slots[self.event_count].ts_ns = ts_ns
        self.event_count += 1
        return 0

    cdef void drop_events(self) noexcept:
        """Let the event slots' shapes go (a parse that declined, or one begun)."""
        cdef Py_ssize_t i
        for i in range(self.event_count):
            Py_XDECREF(self.slots[i].shape)
        self.event_count = 0

    cdef int hand_events(self, MessageRecord record) except -1:
        """The event slots into `record` (empty): their shapes are the record's now."""
        cdef EventSlot* slots = _event_room(record, self.event_count)
        memcpy(slots, self.slots, self.event_count * sizeof(EventSlot))
        record.event_count = self.event_count
        self.event_count = 0
        return 0


cdef _ParsedDocument _PARSED = _ParsedDocument()
