# The link index's storage of one key (`_stage_link.pxi`'s `LinkIndex` holds a `_Bucket` per
# link key): both sides of the key (`_Side`: its time-sorted entries, its entries by size,
# its claims), and the window arithmetic the sides' look-ups share. A side of one entry
# (most keys: a context per message) holds it in a slot; a list and the by-size lists are
# made from its second entry.
#
# Bounds checking stays on here (`boundscheck(True)` on each class): an entry that is not the
# NamedTuple it should be raises, as in the pure twin, instead of reading past a tuple.

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
