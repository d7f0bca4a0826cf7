# cython: language_level=3, boundscheck=False, wraparound=False
"""The compiled twin of the per-sample loop of `NetworkMetrics.record` (network_metrics.py),
for the common case: a sample whose server's rows (and hop's rows) were found before, with
no failed hop, its numbers plain ints. It counts those, in order, into C integers per row
(`Slot`) and writes each row once (`_Slots.flush`), and stops at the first other sample:
the Python loop, which stays the reference (new label sets, the bound on them, failures of
hops, account and subject labels), counts that one after the rows are written, and hands
back; so every bucket's exemplar is its last sample, as there. The Python twin's test:
tests/bridge/test_network_metrics.py (the same exposition, exemplars included)."""

from cpython.long cimport PyLong_AsLongLong
from cpython.object cimport PyObject
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE
from libc.string cimport memset

cdef extern from *:
    bint __builtin_saddll_overflow(long long a, long long b, long long* out) nogil

DEF MAX_BOUNDS = 64  # more buckets than this: every sample goes to the reference

from nats_otel.core.network import HopSample as _Hop, NetworkSample as _Sample

# Read by position below: a change of their fields makes this module refuse to import (and
# `accel` then records why, and the Python loop counts every sample).
if tuple(_Sample._fields) != ("server", "account", "subject", "in_server_ns", "failed", "hop", "failed_hops",
                              "trace_id", "id_fields", "ident"):
    raise ImportError(f"NetworkSample's fields are {_Sample._fields}: the compiled counting reads others")
if tuple(_Hop._fields[:4]) != ("from_server", "to_server", "kind", "latency_ns"):
    raise ImportError(f"HopSample's fields are {_Hop._fields}: the compiled counting reads others")


cdef Py_ssize_t _fill(list bounds, long long* out) except -2:
    """The bucket bounds as C integers; -1 if they do not fit."""
    cdef Py_ssize_t i, n = len(bounds)
    if n > MAX_BOUNDS:
        return -1
    for i in range(n):
        if type(bounds[i]) is not int:
            return -1
        try:
            out[i] = PyLong_AsLongLong(bounds[i])
        except OverflowError:
            return -1
    return n


cdef inline bint _small(object value, long long* out):
    """An exact int that fits a C long long (else the reference counts the sample)."""
    if type(value) is not int:
        return False
    try:
        out[0] = PyLong_AsLongLong(value)
    except OverflowError:
        return False
    return True


cdef inline Py_ssize_t _bucket(const long long* bounds, Py_ssize_t n, long long value):
    """`bisect_left(bounds, value)`: the first bucket whose `le` holds the value."""
    cdef Py_ssize_t lo = 0, hi = n, mid
    while lo < hi:
        mid = (lo + hi) // 2
        if bounds[mid] < value:
            lo = mid + 1
        else:
            hi = mid
    return lo


cdef inline tuple _rows_of(dict cache, object key):
    """The (latency row, error row, exemplars) lists cached under `key`, or None."""
    rows = cache.get(key)
    if (type(rows) is not tuple or PyTuple_GET_SIZE(rows) != 3 or type(<object>PyTuple_GET_ITEM(rows, 0)) is not list
            or type(<object>PyTuple_GET_ITEM(rows, 1)) is not list
            or type(<object>PyTuple_GET_ITEM(rows, 2)) is not list):
        return None
    return rows


# The rows a call counts into, with what it counted since it last wrote them: the counts of
# each bucket, the sum, the errors (C integers) and each bucket's last sample. Written into
# the Python rows (`_flush`) once per call, or before a sample the reference counts: a batch
# touches a few servers and edges, so a handful of Python int additions a row per batch
# where adding into the rows per sample made ~5 new ints a sample (issue 48).
DEF SLOTS = 16

cdef struct Slot:
    PyObject* key_a     # the server's name, or the edge's from_server
    PyObject* key_b     # the edge's to_server and kind (NULL for a server's rows)
    PyObject* key_c
    PyObject* rows      # the cached (latency, errors, exemplars) tuple: the cache holds it
    Py_ssize_t n        # its buckets, but +Inf
    long long counts[MAX_BOUNDS + 1]
    PyObject* last[MAX_BOUNDS + 1]   # the batch list holds these samples through the call
    long long total
    long long errors


cdef class _Slots:
    cdef Slot slots[SLOTS]
    cdef int used

    cdef int flush(self) except -1:
        """Add what each slot counted into its Python rows, and forget the slots."""
        cdef int i
        cdef Py_ssize_t b
        cdef Slot* slot
        for i in range(self.used):
            slot = &self.slots[i]
            latency = <list>PyTuple_GET_ITEM(<tuple>slot.rows, 0)
            exemplars = <list>PyTuple_GET_ITEM(<tuple>slot.rows, 2)
            for b in range(slot.n + 1):
                if slot.counts[b]:
                    latency[b] = latency[b] + slot.counts[b]
                    exemplars[b] = <object>slot.last[b]
            self.flush_total(slot)
            if slot.key_b is NULL:
                errors = <list>PyTuple_GET_ITEM(<tuple>slot.rows, 1)
                errors[0] = errors[0] + slot.errors
        self.used = 0
        return 0

    cdef int flush_total(self, Slot* slot) except -1:
        """The slot's sum into its row's (Python ints: exact past 64 bits)."""
        latency = <list>PyTuple_GET_ITEM(<tuple>slot.rows, 0)
        latency[slot.n + 1] = latency[slot.n + 1] + slot.total
        slot.total = 0
        return 0

    cdef Slot* find(self, object a, object b, object c, dict cache, Py_ssize_t n) except? NULL:
        """The slot of a server's rows (`b` and `c` None) or an edge's, found in `cache` (by
        the server's name, or by the edge's tuple) the first time; NULL when the cache has
        none (the reference counts the sample). There is room for a new slot: `record_known`
        flushes them before a sample when fewer than two are free."""
        cdef int i
        cdef Slot* slot
        cdef PyObject* pa = <PyObject*>a
        cdef PyObject* pb = NULL if b is None else <PyObject*>b
        cdef PyObject* pc = NULL if c is None else <PyObject*>c
        for i in range(self.used):
            slot = &self.slots[i]
            if slot.key_a == pa and slot.key_b == pb and slot.key_c == pc:
                return slot
        rows = _rows_of(cache, a if b is None else (a, b, c))
        if rows is None or len(<list>PyTuple_GET_ITEM(rows, 0)) != n + 2 \
                or len(<list>PyTuple_GET_ITEM(rows, 2)) != n + 1 or len(<list>PyTuple_GET_ITEM(rows, 1)) < 1:
            return NULL
        for i in range(self.used):  # its rows under another key object of equal value: one slot,
            if self.slots[i].rows == <PyObject*>rows:  # so that each bucket's last sample is the last
                return &self.slots[i]
        slot = &self.slots[self.used]
        self.used += 1
        memset(slot, 0, sizeof(Slot))
        # The keys are the sample's (the batch list holds them through the call); the rows, the cache's.
        slot.key_a, slot.key_b, slot.key_c, slot.rows, slot.n = pa, pb, pc, <PyObject*>rows, n
        return slot


cdef inline int _add(_Slots slots, Slot* slot, const long long* bounds, long long value, object sample) except -1:
    """`network_metrics._count` into the slot: the bucket, the sum; the sample is the bucket's
    last (its exemplar)."""
    cdef Py_ssize_t at = _bucket(bounds, slot.n, value)
    cdef long long total
    if __builtin_saddll_overflow(slot.total, value, &total):  # past 64 bits: into the Python int first
        slots.flush_total(slot)
        total = value
    slot.counts[at] += 1
    slot.total = total
    slot.last[at] = <PyObject*>sample
    return 0


def record_known(list samples, Py_ssize_t start, dict server_rows, dict hop_rows, list server_bounds,
                 list hop_bounds):
    """Count the samples from `start` on whose rows are in `server_rows`/`hop_rows`
    (NetworkMetrics' caches, keyed by server name and by edge: no account or subject labels)
    into those rows, in order, up to the first it does not take; return that one's index
    (`len(samples)` when it took them all), for the reference loop. The rows are written
    before it returns: as the loop would have left them."""
    cdef long long sb[MAX_BOUNDS]
    cdef long long hb[MAX_BOUNDS]
    cdef Py_ssize_t ns = _fill(server_bounds, sb), nh = _fill(hop_bounds, hb), at, end = len(samples)
    cdef long long in_server = 0, hop_ns = 0
    cdef object sample, hop, failed, failed_hops
    cdef Slot* server_slot
    cdef Slot* hop_slot
    if ns < 0 or nh < 0 or start < 0:
        return start
    cdef _Slots slots = _Slots.__new__(_Slots)
    for at in range(start, end):
        sample = samples[at]
        if slots.used > SLOTS - 2:  # room for this sample's two rows
            slots.flush()
        if type(sample) is not _Sample:  # its fields are those checked at import
            slots.flush()
            return at
        failed = <object>PyTuple_GET_ITEM(sample, 4)
        hop = <object>PyTuple_GET_ITEM(sample, 5)
        failed_hops = <object>PyTuple_GET_ITEM(sample, 6)
        if (type(failed) is not bool or type(failed_hops) is not tuple or PyTuple_GET_SIZE(failed_hops)
                or not _small(<object>PyTuple_GET_ITEM(sample, 3), &in_server)):
            slots.flush()
            return at  # a failed hop (rare), or odd values: the reference counts it
        server_slot = slots.find(<object>PyTuple_GET_ITEM(sample, 0), None, None, server_rows, ns)
        hop_slot = NULL
        if server_slot is not NULL and hop is not None:
            if type(hop) is not _Hop or not _small(<object>PyTuple_GET_ITEM(hop, 3), &hop_ns):
                server_slot = NULL
            else:
                hop_slot = slots.find(<object>PyTuple_GET_ITEM(hop, 0), <object>PyTuple_GET_ITEM(hop, 1),
                                      <object>PyTuple_GET_ITEM(hop, 2), hop_rows, nh)
                if hop_slot is NULL:
                    server_slot = NULL
        if server_slot is NULL:
            slots.flush()
            return at
        _add(slots, server_slot, sb, in_server, sample)
        server_slot.errors += failed is True
        if hop_slot is not NULL:
            _add(slots, hop_slot, hb, hop_ns, sample)
    slots.flush()
    return end
