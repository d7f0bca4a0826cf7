# The compiled twin of `linking.LinkIndex` (see there for the matching rules): the same
# decisions, counters and length, with another layout. Where `linking` keeps one dict per
# side by key, one by (key, size) and one set of claims, this keeps one `_Bucket` per key
# holding both sides (`_link_buckets.pxi`), so that adding or resolving hashes the key once,
# and the order of observation as a ring of C records, not tuples: what each entry holds
# through `link.retention` is most of a sustained bridge's memory. Timestamps stay Python
# ints: the window is worked out in C only when they fit comfortably in an int64 (every real
# one does), and with Python ints otherwise (a hostile report can carry any uint64).
#
# Bounds checking stays on here (`boundscheck(True)` on each class): an entry that is not the
# NamedTuple it should be raises, as in the pure twin, instead of reading past a tuple.

cdef struct _Observed:
    # One record of the index's fifo: an entry as observed (the references are the fifo's own).
    PyObject* observed  # the `now` it was observed at
    PyObject* bucket    # its key's `_Bucket`
    PyObject* entry     # the `Egress` or `Arrival`
    bint is_egress


@cython.final
@cython.boundscheck(True)
cdef class LinkIndex:
    """Both sides of every hop observed, by link key and size, time-sorted; bounded when
    `expire`d. The compiled twin of `linking.PythonLinkIndex`."""

    cdef readonly object settings
    cdef readonly object sequences  # `sequences.HopSequences`: the crowded keys
    cdef public object evicted
    cdef public dict expired_unmatched
    cdef dict _buckets  # link key -> _Bucket
    cdef _Bucket _spare  # the bucket the next new key gets (`_add`)
    # (observed at, is egress, bucket, entry) in observation order: a ring of C records, not
    # a deque of tuples (a 4-tuple an entry, ~80 bytes and a block held for `retention_s`).
    cdef _Observed* _fifo
    cdef Py_ssize_t _fifo_size, _fifo_head, _fifo_length
    cdef dict _refreshed  # (is egress, key, entry) observed again -> its later fifo records (`linking`)
    cdef bint _bounded
    cdef Py_ssize_t _count  # entries held
    cdef object _latency_ns, _skew_ns
    cdef long long _latency_c, _skew_c
    cdef bint _small_window  # both fit for C arithmetic

    def __init__(self, settings=None, bint bounded=True):
        self.settings = _DEFAULT_LINK if settings is None else settings
        self._latency_ns, self._skew_ns = self.settings.latency_ns, self.settings.skew_ns
        self._small_window = (type(self._latency_ns) is int and type(self._skew_ns) is int
                              and 0 <= self._latency_ns <= _SMALL and 0 <= self._skew_ns <= _SMALL)
        if self._small_window:
            self._latency_c, self._skew_c = self._latency_ns, self._skew_ns
        self._bounded = bounded
        self._buckets = {}
        self._refreshed = {}
        self._count = 0
        self.evicted = 0
        self.expired_unmatched = {"upstream": 0, "downstream": 0}
        self.sequences = _HopSequences(self._latency_ns, self._skew_ns, self.settings.capacity,
                                       self.settings.retention_s, bounded, self.held)

    def __len__(self):
        """Entries held (egresses and arrivals)."""
        return self._count

    def __dealloc__(self):
        cdef Py_ssize_t i
        cdef _Observed* record
        if self._fifo is NULL:
            return
        for i in range(self._fifo_length):
            record = &self._fifo[(self._fifo_head + i) % self._fifo_size]
            Py_XDECREF(record.observed)
            Py_XDECREF(record.bucket)
            Py_XDECREF(record.entry)
        PyMem_Free(self._fifo)
        self._fifo = NULL

    cdef int _resize(self, Py_ssize_t size) except -1:
        """The ring moved to `size` records (>= those held), oldest first."""
        cdef _Observed* ring = <_Observed*>PyMem_Malloc(size * sizeof(_Observed))
        cdef Py_ssize_t i
        if ring is NULL:
            raise MemoryError()
        for i in range(self._fifo_length):
            ring[i] = self._fifo[(self._fifo_head + i) % self._fifo_size]
        PyMem_Free(self._fifo)
        self._fifo, self._fifo_size, self._fifo_head = ring, size, 0
        return 0

    cdef int _remember(self, object now, bint is_egress, _Bucket bucket, object entry) except -1:
        """`fifo.append((now, is_egress, bucket, entry))`."""
        cdef _Observed* record
        if self._fifo_length == self._fifo_size:
            self._resize(max(64, 2 * self._fifo_size))
        record = &self._fifo[(self._fifo_head + self._fifo_length) % self._fifo_size]
        Py_INCREF(now)
        Py_INCREF(bucket)
        Py_INCREF(entry)
        record.observed, record.bucket, record.entry = <PyObject*>now, <PyObject*>bucket, <PyObject*>entry
        record.is_egress = is_egress
        self._fifo_length += 1
        return 0

    cdef _Observed _take_oldest(self):
        """`fifo.popleft()`: the caller owns the record's references."""
        cdef _Observed record = self._fifo[self._fifo_head]
        self._fifo_head = (self._fifo_head + 1) % self._fifo_size
        self._fifo_length -= 1
        return record

    def held(self):
        """Every key held, with its time-sorted egresses and arrivals."""
        return [((<_Bucket>bucket).key, (<_Bucket>bucket).egresses.as_list(),
                 (<_Bucket>bucket).arrivals.as_list()) for bucket in self._buckets.values()]

    def observe_report(self, ident, server_id, seq, ts_ns, now=0.0, account=""):
        """Any report seen, with or without hop evidence (see `linking.LinkIndex`)."""
        self.sequences.ledger.observe(ident, server_id, seq, ts_ns, now, account)

    def add_egress(self, key, egress, now=0.0):
        """Record a forwarding egress (a redelivered trace message is recorded once)."""
        self._add(True, key, _entry(egress), now)

    def add_arrival(self, key, arrival, now=0.0):
        """Record a downstream ingress (a redelivered trace message is recorded once)."""
        self._add(False, key, _entry(arrival), now)

    cdef void _add(self, bint is_egress, object key, tuple entry, object now) except *:
        # One look-up for a key new or known (a key's tuple is hashed anew at each): the
        # spare bucket goes in if the key is new, and a new spare is made next time.
        if self._spare is None:
            self._spare = _Bucket.__new__(_Bucket)
        cdef _Bucket bucket = <_Bucket>PyDict_SetDefault(self._buckets, key, self._spare)
        if bucket is self._spare:
            bucket.key = key
            self._spare = None
        if not bucket.side(is_egress).add(entry):
            if self._bounded:  # observed again (a redelivery): kept `retention_s` from now
                self._refreshed[(is_egress, key, entry)] = self._refreshed.get((is_egress, key, entry), 0) + 1
                self._remember(now, is_egress, bucket, entry)
            return
        self._count += 1
        if self._bounded:
            self._remember(now, is_egress, bucket, entry)

    def resolve(self, key, arrival):
        """The egress that forwarded the message of `arrival`, if the evidence says so."""
        return self._resolve(key, _entry(arrival))

    cdef object _resolve(self, object key, tuple probe):
        cdef Py_ssize_t count
        cdef _Bucket bucket = self._buckets.get(key)
        if bucket is None:
            return _UNMATCHED_LINK
        egress = bucket.egresses.candidate(probe[0], self._latency_ns, self._skew_ns, self._latency_c,
                                           self._skew_c, self._small_window, probe[1], &count)
        if egress is None and count == 0:
            return _UNMATCHED_LINK
        if egress is not None:
            # The other way round: this arrival must be the egress's only candidate too, else a
            # lost report could make two arrivals claim one egress.
            back = bucket.arrivals.candidate((<tuple>egress)[0], self._skew_ns, self._latency_ns, self._skew_c,
                                             self._latency_c, self._small_window, (<tuple>egress)[1], &count)
            if back is None or (<tuple>back)[2] != probe[2]:
                egress = None
            elif probe[1] < _SHAPE_DIGEST and not (bucket.egresses.alone((<tuple>egress)[1])
                                                   and bucket.arrivals.alone(probe[1])):
                egress = None  # several alike messages on the key: only proven order decides (`linking`)
        first = not bucket.arrivals.is_claimed(probe)
        if egress is None:  # several candidates: order and latency decide, if they can
            result, egress, candidates = self.sequences.resolve(key, bucket.egresses.as_list(),
                                                                bucket.arrivals.as_list(), probe)
            if egress is None:
                return _record4(_Link, result, None, candidates, True)
            if not _shapes_agree(probe[1], (<tuple>egress)[1]):  # never against exact evidence
                return _record4(_Link, _AMBIGUOUS, None, max(candidates, 2), True)
        elif first:
            sequences_learn(self.sequences, key, probe, egress)
        if first:
            bucket.arrivals.claim(probe)
            bucket.egresses.claim(egress)
        return _record4(_Link, _MATCHED, egress, 1, first)

    def expire(self, now):
        """Drop entries observed more than `retention_s` before `now`, and the oldest past
        `capacity` (counted in `evicted`). O(1) amortised per entry."""
        cdef _Bucket bucket
        cdef _Side side
        cdef _Observed record
        cdef bint is_egress
        horizon = now - self.settings.retention_s
        capacity = self.settings.capacity
        while self._fifo_length and (<object>self._fifo[self._fifo_head].observed < horizon
                                     or self._fifo_length > capacity):
            record = self._take_oldest()
            # Its references move from the ring to these names (each taken one, then the ring's let go).
            observed, bucket, entry = <object>record.observed, <_Bucket>record.bucket, <object>record.entry
            is_egress = record.is_egress
            Py_XDECREF(record.observed)
            Py_XDECREF(record.bucket)
            Py_XDECREF(record.entry)
            if self._refreshed:
                later = self._refreshed.pop((is_egress, bucket.key, entry), 0)
                if later:  # observed again since: its last record expires it
                    if later > 1:
                        self._refreshed[(is_egress, bucket.key, entry)] = later - 1
                    continue
            if not is_egress:
                sequences_forget(self.sequences, bucket.key, entry)
            if observed >= horizon:
                self.evicted += 1
            side = bucket.side(is_egress)
            if not side.unclaim(entry):
                self.expired_unmatched["upstream" if is_egress else "downstream"] += 1
            side.remove(<tuple>entry)
            self._count -= 1
            if bucket.empty():
                del self._buckets[bucket.key]
        if self._fifo_size > 64 and self._fifo_length * 4 < self._fifo_size:  # a burst's ring given back as it drains
            self._resize(self._fifo_size // 2)
        self.sequences.expire(now)

    @property
    def _claimed(self):
        """The claims as `linking.PythonLinkIndex` holds them: {(is egress, key, entry)}."""
        out = set()
        for bucket in self._buckets.values():
            for is_egress in (True, False):
                claimed = (<_Bucket>bucket).side(is_egress).claims()
                out.update((is_egress, (<_Bucket>bucket).key, entry) for entry in claimed)
        return out


# The compiled twin of `pipeline.Linker` (see there): the same calls to the index, without
# a Python call per egress, per index operation or per NamedTuple built.

@cython.final
@cython.boundscheck(True)
cdef class Linker:
    """The hop evidence of observed messages, and where each message's spans go."""

    cdef readonly LinkIndex index
    cdef bint _bounded
    cdef dict _adhoc_arrivals  # ad-hoc reports only: identity -> its arrival (None at the origin)
    cdef object _link_found  # the link decision `_locate` found beside its placement, until its caller takes it

    def __init__(self, settings=None, bint bounded=True):
        self.index = LinkIndex(settings, bounded)
        self._bounded = bounded
        self._adhoc_arrivals = {}

    cpdef observe(self, object prepared, object now=0.0):
        """Record a message's hop evidence (idempotent: a redelivery changes nothing)."""
        self._observe(_record_from(prepared), now)

    cdef object _observe(self, MessageRecord record, object now):
        """`observe`, returning the span ids of the message's forwarding egresses in their
        order, which `map_encode` reuses instead of hashing each again: None when it has
        none, the one id itself when it has one (nearly every message that forwards: a
        tuple of one was 48 bytes held through the window), a tuple of them when more."""
        cdef LinkIndex index = self.index
        egress_ids = None
        cdef Py_ssize_t position
        ident, size, id_fields = record.ident, record.size, record.id_fields
        server, ingress = record.server, _shape_at(record, 0)
        # The fields at their offsets (look-ups by name fewer per message); the times the slots'.
        ledger_observe(ledger_of(index.sequences), ident, _read(server, _ServerInfo, SRV.id, "id"), record.seq,
                       _time_of(record, 0), now, _read(ingress, _Ingress, IN.account, "account"))
        if record.arrival_key is not None:
            index._add(False, record.arrival_key, _entry(record.arrival_entry), now)
        # `Prepared.egresses`, one egress at a time.
        for position in range(1, record.event_count):
            event = _shape_at(record, position)
            # `event.forwards`, without a call to the property (a Python frame per egress).
            if type(event) is _EgressEvent and _truthy(field(event, EG.hop)) and _forwards(field(event, EG.kind)):
                if size < 0:
                    size = _message_shape(record.msg_size, record.headers)
                key = (id_fields, field(event, EG.hop), _read(server, _ServerInfo, SRV.name, "name"),
                       field(event, EG.name))
                span_id = _event_id(id_fields, ident, position, record)
                index._add(True, key, <tuple>_record4(_LinkEgress, _time_of(record, position), size, ident, span_id),
                           now)
                # The first id itself; from the second, a tuple grown a tuple at a time (a
                # message forwards to a handful of servers at most).
                if egress_ids is None:
                    egress_ids = span_id
                elif type(egress_ids) is bytes:
                    egress_ids = (egress_ids, span_id)
                else:
                    egress_ids = <tuple>egress_ids + (span_id,)
        if record.adhoc_key is not None:
            self.note_adhoc(ident, record.arrival)
        return egress_ids

    def note_adhoc(self, ident, arrival):
        """An ad-hoc report's arrival (None at its origin): the walk to its origin's identity."""
        adhoc = self._adhoc_arrivals
        adhoc[ident] = arrival
        if self._bounded and len(adhoc) > self.index.settings.capacity:
            del adhoc[next(iter(adhoc))]

    def place(self, prepared):
        """Trace id and parent of a message's spans, from what was observed."""
        return self.locate(prepared)[0]

    cpdef tuple locate(self, prepared):
        """`place`, with the link decision behind it (None at the origin)."""
        placement = self._locate(_record_from(prepared))
        link = self.take_link()
        return placement, link

    cdef inline object take_link(self):
        """The link decision of the last `_locate` (None at the origin), let go here."""
        link = self._link_found
        self._link_found = None
        return link

    cdef object _locate(self, MessageRecord record):
        """`locate`'s placement, its link decision left for `take_link`: `_finish` calls it
        once a trace message, and a pair made and unpacked for each was one allocation.
        The record is its own context (its `id_fields` and `adhoc_key`)."""
        cdef bint adhoc = record.adhoc_key is not None
        ident, key, entry = record.ident, record.arrival_key, record.arrival_entry
        if key is None:  # the origin: under the producer's span (a root for ad-hoc traces)
            trace_id = adhoc_trace_id(record, ident) if adhoc else _context_id(record, False)
            placement = _record5(_Placement, ident, trace_id, _context_id(record, True), "", 0)
            self._link_found = None
            return placement
        link = self.index._resolve(key, _entry(entry))
        result, egress = (<tuple>link)[0], (<tuple>link)[1]
        if result == _MATCHED and egress is not None:
            trace_id = self._adhoc_trace(record, (<tuple>egress)[2]) if adhoc else _context_id(record, False)
            placement = _record5(_Placement, ident, trace_id, (<tuple>egress)[3], _MATCHED, 0)
            self._link_found = link
            return placement
        # Never under another message's egress: see `pipeline.Linker.locate`.
        trace_id = adhoc_trace_id(record, ident) if adhoc else _context_id(record, False)
        candidates = (<tuple>link)[2] if result == _AMBIGUOUS else 0
        placement = _record5(_Placement, ident, trace_id, _context_id(record, True), result, candidates)
        self._link_found = link  # set last: nothing runs between here and the caller's `take_link`
        return placement

    cdef object _adhoc_trace(self, object ctx, object ident):
        """The trace id of the ad-hoc message whose report `ident` is: its origin's."""
        for _ in range(_ADHOC_DEPTH):
            arrival = self._adhoc_arrivals.get(ident)
            if arrival is None:  # the origin (or forgotten: then this report names the trace)
                break
            key, entry = arrival
            link = self.index._resolve(key, _entry(entry))
            if (<tuple>link)[0] != _MATCHED or (<tuple>link)[1] is None:
                break
            ident = (<tuple>(<tuple>link)[1])[2]
        return adhoc_trace_id(ctx, ident)
