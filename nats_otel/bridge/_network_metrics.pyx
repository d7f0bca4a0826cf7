# cython: language_level=3, boundscheck=False, wraparound=False
"""The compiled twin of the per-sample loop of `NetworkMetrics.record` (network_metrics.py),
for the common case: a sample whose server's rows (and hop's rows) were found before, with
no failed hop, its numbers plain ints. It counts those (each the exemplar of its bucket, as
there), in order, and stops at the first other sample: the Python loop, which stays the
reference (new label sets, the bound on them, failures of hops, account and subject
labels), counts that one and hands back, so every bucket's exemplar is its last sample."""

from cpython.long cimport PyLong_AsLongLong
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE

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


cdef inline int _count(list row, list exemplars, const long long* bounds, Py_ssize_t n, object value_ns,
                       long long value, object sample) except -1:
    """`network_metrics._count`: the bucket, then the sum (Python ints: exact); the sample is
    the bucket's exemplar."""
    cdef Py_ssize_t at = _bucket(bounds, n, value)
    row[at] = row[at] + 1
    row[n + 1] = row[n + 1] + value_ns
    exemplars[at] = sample
    return 0


cdef inline tuple _rows_of(dict cache, object key):
    """The (latency row, error row, exemplars) lists cached under `key`, or None."""
    rows = cache.get(key)
    if (type(rows) is not tuple or PyTuple_GET_SIZE(rows) != 3 or type(<object>PyTuple_GET_ITEM(rows, 0)) is not list
            or type(<object>PyTuple_GET_ITEM(rows, 1)) is not list
            or type(<object>PyTuple_GET_ITEM(rows, 2)) is not list):
        return None
    return rows


def record_known(list samples, Py_ssize_t start, dict server_rows, dict hop_rows, list server_bounds,
                 list hop_bounds):
    """Count the samples from `start` on whose rows are in `server_rows`/`hop_rows`
    (NetworkMetrics' caches, keyed by server name and by edge: no account or subject labels)
    into those rows, in order, up to the first it does not take; return that one's index
    (`len(samples)` when it took them all), for the reference loop."""
    cdef long long sb[MAX_BOUNDS]
    cdef long long hb[MAX_BOUNDS]
    cdef Py_ssize_t ns = _fill(server_bounds, sb), nh = _fill(hop_bounds, hb), at, end = len(samples)
    cdef long long in_server = 0, hop_ns = 0
    cdef list latency, errors, exemplars, hop_latency = None, hop_exemplars = None
    cdef tuple rows, hop_rows_of = None
    cdef object sample, hop, failed, failed_hops
    if ns < 0 or nh < 0 or start < 0:
        return start
    for at in range(start, end):
        sample = samples[at]
        if type(sample) is not _Sample:  # its fields are those checked at import
            return at
        failed = <object>PyTuple_GET_ITEM(sample, 4)
        hop = <object>PyTuple_GET_ITEM(sample, 5)
        failed_hops = <object>PyTuple_GET_ITEM(sample, 6)
        if type(failed) is not bool or type(failed_hops) is not tuple or PyTuple_GET_SIZE(failed_hops):
            return at  # a failed hop (rare), or odd values: the reference counts it
        rows = _rows_of(server_rows, <object>PyTuple_GET_ITEM(sample, 0))
        if rows is None or not _small(<object>PyTuple_GET_ITEM(sample, 3), &in_server):
            return at
        latency, errors = <list>PyTuple_GET_ITEM(rows, 0), <list>PyTuple_GET_ITEM(rows, 1)
        exemplars = <list>PyTuple_GET_ITEM(rows, 2)
        if hop is not None:
            if type(hop) is not _Hop or not _small(<object>PyTuple_GET_ITEM(hop, 3), &hop_ns):
                return at
            hop_rows_of = _rows_of(hop_rows, (<object>PyTuple_GET_ITEM(hop, 0), <object>PyTuple_GET_ITEM(hop, 1),
                                              <object>PyTuple_GET_ITEM(hop, 2)))
            if hop_rows_of is None:
                return at
            hop_latency = <list>PyTuple_GET_ITEM(hop_rows_of, 0)
            hop_exemplars = <list>PyTuple_GET_ITEM(hop_rows_of, 2)
        if (len(latency) != ns + 2 or len(errors) < 1 or len(exemplars) != ns + 1
                or (hop is not None and (len(hop_latency) != nh + 2 or len(hop_exemplars) != nh + 1))):
            return at
        _count(latency, exemplars, sb, ns, <object>PyTuple_GET_ITEM(sample, 3), in_server, sample)
        errors[0] = errors[0] + failed
        if hop is not None:
            _count(hop_latency, hop_exemplars, hb, nh, <object>PyTuple_GET_ITEM(hop, 3), hop_ns, sample)
    return end
