# The compiled twin of `linking.LinkIndex` (see there for the matching rules): the same
# decisions, counters and length, with another layout. Where `linking` keeps one dict per
# side by key, one by (key, size) and one set of claims, this keeps one `_Bucket` per key
# holding both sides (`_Side`: its time-sorted entries, its entries by size, its claims), so
# that adding or resolving hashes the key once. A side of one entry (most keys: a context per
# message) holds it in a slot, and the order of observation is a ring of C records, not
# tuples: what each entry holds through `link.retention` is most of a sustained bridge's
# memory. Timestamps stay Python ints: the window is worked out in C only when they fit
# comfortably in an int64 (every real one does), and with Python ints otherwise (a hostile
# report can carry any uint64).
#
# Bounds checking stays on here (`boundscheck(True)` on each class): an entry that is not the NamedTuple it
# should be raises, as in the pure twin, instead of reading past a tuple.

# Timestamps and window bounds within +-2**62 are added and compared in int64 without overflow.
cdef long long _SMALL = 1 << 62


cdef inline bint _small(object value, long long* out):
    """True (and the value in `out`) when `value` is an int within +-2**62."""
    cdef int overflow = 0
    if type(value) is not int:
        return False
    out[0] = PyLong_AsLongLongAndOverflow(value, &overflow)
    return overflow == 0 and -_SMALL <= out[0] <= _SMALL


cdef inline tuple _entry(object value):
    """An `Egress` or `Arrival` (tuple subclasses), read by position from here on."""
    if not isinstance(value, tuple):
        raise TypeError(f"expected an Egress or Arrival, got {type(value).__name__}")
    return <tuple>value


@cython.freelist(64)
@cython.final
@cython.boundscheck(True)
cdef class _Side:
    """One side (egresses or arrivals) of one link key: `linking`'s by-key list, its
    by-(key, size) lists and its part of the claims.

    Most keys hold one entry a side (a context per message): it is kept in `one`, and the
    time-sorted list and the by-size lists are made only for a second entry, so that a side
    of one entry is this object alone (its list and the list's items were two more blocks
    per side, ~190 bytes a key, for `link.retention`)."""

    cdef object one    # the entry, while the side holds exactly one (`entries` None)
    cdef list entries  # time-sorted (by the whole tuple, as `linking` sorts them); two entries or more, else None
    cdef dict by_size  # size -> time-sorted entries; while there are two entries or more
    # The entries of a matched hop, until they expire: the first in `claimed_one` (a key has
    # one claim on each side in the common case: no set made and no entry hashed for it), any
    # others in `claimed` (None until a second).
    cdef object claimed_one
    cdef set claimed

    cdef inline bint _first_claim_is(self, object entry) except -1:
        return self.claimed_one is not None and (self.claimed_one is entry or self.claimed_one == entry)

    cdef inline bint is_claimed(self, object entry) except -1:
        return self._first_claim_is(entry) or (self.claimed is not None and entry in self.claimed)

    cdef inline void claim(self, object entry) except *:
        """Claim `entry` (already claimed: nothing changes)."""
        if self.claimed_one is None:
            if self.claimed is None or entry not in self.claimed:
                self.claimed_one = entry
        elif not self.is_claimed(entry):
            if self.claimed is None:
                self.claimed = set()
            self.claimed.add(entry)

    cdef inline bint unclaim(self, object entry) except -1:
        """Take `entry`'s claim back (it expired); false when it had none."""
        if self._first_claim_is(entry):
            self.claimed_one = None
            return True
        if self.claimed is not None and entry in self.claimed:
            self.claimed.discard(entry)
            return True
        return False

    cdef inline bint any_claimed(self):
        return self.claimed_one is not None or bool(self.claimed)

    cdef list claims(self):
        out = [] if self.claimed is None else list(self.claimed)
        if self.claimed_one is not None:
            out.append(self.claimed_one)
        return out

    cdef inline bint holds_any(self):
        return self.one is not None or self.entries is not None

    cdef list as_list(self):
        """The entries, time-sorted, as `linking` keeps them (a new list for one entry)."""
        if self.entries is not None:
            return self.entries
        return [] if self.one is None else [self.one]

    cdef bint add(self, tuple entry):
        """Insert `entry`; False when it was there already (a redelivery)."""
        cdef list entries = self.entries
        cdef list sized
        if entries is None:
            if self.one is None:  # the common case: its first entry, nothing to sort
                self.one = entry
                return True
            # The second entry, placed as `bisect_left` places it: the list, and the entries by
            # size (in time order)
            if self.one < entry:
                entries = self.entries = [self.one, entry]
            elif self.one == entry:
                return False
            else:
                entries = self.entries = [entry, self.one]
            self.one = None
            self.by_size = {}
            for other in entries:
                self.by_size.setdefault((<tuple>other)[1], []).append(other)
            return True
        at = bisect_left(entries, entry)
        if at < len(entries) and entries[at] == entry:
            return False
        entries.insert(at, entry)
        sized = self.by_size.get(entry[1])
        if sized is None:
            self.by_size[entry[1]] = [entry]
        else:
            sized.insert(bisect_left(sized, entry), entry)
        return True

    cdef bint alone(self, object size):
        """`linking.LinkIndex._alone`: no other entry of this size on this side."""
        if self.entries is None:
            return True
        return len(self.by_size.get(size, ())) <= 1

    cdef void remove(self, tuple entry):
        """Take a stored entry out (`expire`)."""
        cdef list entries = self.entries
        cdef list sized
        if entries is None:
            self.one = None
            return
        del entries[bisect_left(entries, entry)]
        if len(entries) <= 1:  # back to one entry (or none): no list
            self.one = entries[0] if entries else None
            self.entries = None
            self.by_size = None
            return
        sized = self.by_size[entry[1]]
        del sized[bisect_left(sized, entry)]
        if not sized:
            del self.by_size[entry[1]]

    cdef object candidate(self, object center, object below, object above, long long below_c,
                          long long above_c, bint small_window, object size, Py_ssize_t* count):
        """`linking.LinkIndex._candidates` for the window [center - below, center + above]:
        the one candidate (or the one of the same shape, when several fit in time), else None
        and how many fit (in `count`). A digest (`shapes.message_shape`) admits only entries of
        its own shape; an entry with a digest admits only its own shape."""
        cdef list entries = self.entries
        cdef list sized
        cdef long long center_c = 0, ts_c = 0
        cdef Py_ssize_t start, end
        count[0] = 0
        if entries is None:
            if self.one is None:
                return None
            entry = self.one  # the common case: one entry for the key, no search
            ts = (<tuple>entry)[0]
            if small_window and _small(center, &center_c) and _small(ts, &ts_c):
                fits = center_c - below_c <= ts_c <= center_c + above_c
            else:
                fits = center - below <= ts <= center + above
            if fits and _shapes_agree(size, (<tuple>entry)[1]):
                count[0] = 1
                return entry
            return None
        lo, hi = center - below, center + above
        if size >= _SHAPE_DIGEST:  # exact evidence: only the same message counts
            sized = self.by_size.get(size)
            if sized is None:
                return None
            start, end = bisect_left(sized, (lo,)), bisect_left(sized, (hi + 1,))
            count[0] = end - start
            return sized[start] if end - start == 1 else None
        start, end = bisect_left(entries, (lo,)), bisect_left(entries, (hi + 1,))
        if end - start <= 1:
            if end > start and (<tuple>entries[start])[1] >= _SHAPE_DIGEST:
                return None  # another message's, by its digest
            count[0] = end - start
            return entries[start] if end > start else None
        count[0] = end - start
        sized = self.by_size.get(size)
        if sized is None:
            return None
        start, end = bisect_left(sized, (lo,)), bisect_left(sized, (hi + 1,))
        if end - start == 1:
            count[0] = 1
            return sized[start]
        return None


cdef inline bint _shapes_agree(object arrival_shape, object egress_shape):
    """`shapes.shapes_agree`."""
    return arrival_shape == egress_shape or (arrival_shape < _SHAPE_DIGEST and egress_shape < _SHAPE_DIGEST)


@cython.freelist(64)
@cython.final
@cython.boundscheck(True)
cdef class _Bucket:
    """Both sides of one link key."""

    cdef object key
    cdef _Side egresses
    cdef _Side arrivals

    def __cinit__(self):
        # `__new__`: straight to tp_new, no Python call (a bucket and two sides per hop).
        self.egresses = _Side.__new__(_Side)
        self.arrivals = _Side.__new__(_Side)

    cdef inline _Side side(self, bint is_egress):
        return self.egresses if is_egress else self.arrivals

    cdef bint empty(self):
        """Nothing held and nothing claimed: the bucket can go (a claim outlives its entry
        when the arrival resolved was not the one stored; `linking` keeps it too)."""
        for side in (self.egresses, self.arrivals):
            if (<_Side>side).holds_any() or (<_Side>side).any_claimed():
                return False
        return True


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
                return _new(_Link, (result, None, candidates, True))
            if not _shapes_agree(probe[1], (<tuple>egress)[1]):  # never against exact evidence
                return _new(_Link, (_AMBIGUOUS, None, max(candidates, 2), True))
        elif first:
            sequences_learn(self.sequences, key, probe, egress)
        if first:
            bucket.arrivals.claim(probe)
            bucket.egresses.claim(egress)
        return _new(_Link, (_MATCHED, egress, 1, first))

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

    def __init__(self, settings=None, bint bounded=True):
        self.index = LinkIndex(settings, bounded)
        self._bounded = bounded
        self._adhoc_arrivals = {}

    cpdef observe(self, object prepared, object now=0.0):
        """Record a message's hop evidence (idempotent: a redelivery changes nothing)."""
        self._observe(prepared, now)

    cdef tuple _observe(self, object prepared, object now):
        """`observe`, returning the span ids of the message's forwarding egresses in their
        order (None when it has none): `map_encode` reuses them instead of hashing each again."""
        cdef LinkIndex index = self.index
        cdef tuple egress_ids = None
        cdef Py_ssize_t position = 0
        arrival = _read(prepared, _Prepared, PREPARED.arrival, "arrival")
        msg = _read(prepared, _Prepared, PREPARED.msg, "msg")
        server = _read(msg, _TraceMessage, MSG.server, "server")
        ingress = _read(msg, _TraceMessage, MSG.ingress, "ingress")
        # The fields at their offsets (five look-ups by name fewer per message).
        ledger_observe(ledger_of(index.sequences), _read(prepared, _Prepared, PREPARED.ident, "ident"),
                       _read(server, _ServerInfo, SRV.id, "id"), _read(server, _ServerInfo, SRV.seq, "seq"),
                       _read(ingress, _Ingress, IN.ts_ns, "ts_ns"), now, _read(ingress, _Ingress, IN.account, "account"))
        if arrival is not None:
            key, entry = arrival
            index._add(False, key, _entry(entry), now)
        # `Prepared.egresses`, one egress at a time.
        ctx = _read(prepared, _Prepared, PREPARED.ctx, "ctx")
        ident = _read(prepared, _Prepared, PREPARED.ident, "ident")
        for event in _read(msg, _TraceMessage, MSG.events, "events"):
            position += 1
            # `event.forwards`, without a call to the property (a Python frame per egress).
            if type(event) is _EgressEvent and _truthy(field(event, EG.hop)) and _forwards(field(event, EG.kind)):
                size = _read(prepared, _Prepared, PREPARED.size, "size")
                if size < 0:
                    size = _message_shape(_read(msg, _TraceMessage, MSG.msg_size, "msg_size"),
                                          _read(msg, _TraceMessage, MSG.headers, "headers"))
                server = _read(msg, _TraceMessage, MSG.server, "server")
                key = (_read(ctx, _TraceContext, CTX.id_fields, "id_fields"), field(event, EG.hop),
                       _read(server, _ServerInfo, SRV.name, "name"), field(event, EG.name))
                span_id = event_span_id(ctx, ident, position)
                index._add(True, key, <tuple>_new(_LinkEgress, (field(event, EG.ts_ns), size, ident, span_id)), now)
                # Grown a tuple at a time: one allocation for the usual one egress (a list and
                # its tuple would be two); a message forwards to a handful of servers at most.
                egress_ids = (span_id,) if egress_ids is None else egress_ids + (span_id,)
        if _read(ctx, _TraceContext, CTX.adhoc_key, "adhoc_key") is not None:
            self.note_adhoc(ident, arrival)
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
        ctx = _read(prepared, _Prepared, PREPARED.ctx, "ctx")
        ident = _read(prepared, _Prepared, PREPARED.ident, "ident")
        arrival = _read(prepared, _Prepared, PREPARED.arrival, "arrival")
        cdef bint adhoc
        if arrival is None:  # the origin: under the producer's span (a root for ad-hoc traces)
            adhoc = _read(ctx, _TraceContext, CTX.adhoc_key, "adhoc_key") is not None
            trace_id = adhoc_trace_id(ctx, ident) if adhoc else _read(ctx, _TraceContext, CTX.trace_id, "trace_id")
            return _new(_Placement, (ident, trace_id, _read(ctx, _TraceContext, CTX.parent_span_id, "parent_span_id"),
                                     "", 0)), None
        key, entry = arrival
        link = self.index._resolve(key, _entry(entry))
        result, egress = (<tuple>link)[0], (<tuple>link)[1]
        adhoc = _read(ctx, _TraceContext, CTX.adhoc_key, "adhoc_key") is not None
        if result == _MATCHED and egress is not None:
            trace_id = (self._adhoc_trace(ctx, (<tuple>egress)[2]) if adhoc
                        else _read(ctx, _TraceContext, CTX.trace_id, "trace_id"))
            return _new(_Placement, (ident, trace_id, (<tuple>egress)[3], _MATCHED, 0)), link
        # Never under another message's egress: see `pipeline.Linker.locate`.
        trace_id = adhoc_trace_id(ctx, ident) if adhoc else _read(ctx, _TraceContext, CTX.trace_id, "trace_id")
        candidates = (<tuple>link)[2] if result == _AMBIGUOUS else 0
        return _new(_Placement, (ident, trace_id, _read(ctx, _TraceContext, CTX.parent_span_id, "parent_span_id"),
                                 result, candidates)), link

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
