# The link window's bookkeeping of every report and every matched hop, in C (issue 48):
# `ReportLedger.observe` (with the `vouch` it makes while a batch's stream is known) and
# `HopSequences.learn` (`LinkLatency.learn`, `_LinkPairs.add`) for the common case, the
# compiled counterparts of those methods (report_ledger.py, sequences.py, link_latency.py:
# the references). In the live bridge they ran four to six Python frames per trace message.
#
# They work on the Python objects' own containers (each slot read at its offset, found by
# `_records.pxi` when the kernel is imported), step by step as the methods do, for what the
# common case is: a server already seen whose report extends its latest run; a stream and
# a cover of that server already followed, with no loss since; a link whose latencies and
# pairs are already kept. Anything else - a new server, a report out of order, a new link
# or stream, a loss, an object of another type - is the method's, called as before.

from bisect import bisect_right
from heapq import heappush as _heappush

from nats_otel.core.report_ledger import _VOUCHED_GAP as _VOUCHED_GAP_
from nats_otel.core.sequences import _LINK_PAIRS as _LINK_PAIRS_

cdef object _VOUCHED_GAP = _VOUCHED_GAP_
cdef object _LINK_PAIRS = _LINK_PAIRS_


cdef object ledger_of(object sequences):
    """`sequences.ledger`"""
    return field(sequences, SEQ.ledger) if type(sequences) is _HopSequences else sequences.ledger


cdef void ledger_observe(object ledger, object ident, object server_id, object seq, object ts_ns, object now,
                         object account) except *:
    """As `ReportLedger.observe`."""
    if type(ledger) is not _ReportLedger or type(seq) is not int:
        ledger.observe(ident, server_id, seq, ts_ns, now, account)
        return
    if seq <= 0:
        return
    cdef dict reports = field(ledger, LEDGER._reports)
    if ident in reports:
        return
    reports[ident] = (server_id, seq, account, ts_ns)
    if field(ledger, LEDGER._fixed):
        return
    cdef dict servers = field(ledger, LEDGER._servers)
    runs = servers.get(server_id)
    if runs is None:
        runs = servers[server_id] = _ServerRuns(field(ledger, LEDGER._bounded))
    if not _runs_extend(runs, seq, ts_ns, now):
        runs.add(seq, ts_ns, now)
    if field(ledger, LEDGER._bounded):
        _append(field(ledger, LEDGER._fifo), (now, ident))
    receiving = field(ledger, LEDGER.receiving)
    if receiving is not None:
        stream, breaks = <tuple>receiving
        if not _vouch_covered(ledger, stream, server_id, seq, breaks, now):
            ledger.vouch(stream, server_id, seq, breaks, now)


cdef bint _runs_extend(object runs, object seq, object ts_ns, object now) except -1:
    """`_ServerRuns.add` when `seq` extends the latest run by one (True); False, having
    changed nothing, for any other case (the method's)."""
    if type(runs) is not _ServerRuns or type(ts_ns) is not int:
        return False
    cdef list lasts = field(runs, RUNS.lasts)
    cdef Py_ssize_t last = len(lasts) - 1  # the latest run (the kernel reads no negative index)
    if last < 0 or seq != lasts[last] + 1:
        return False
    cdef list since_ns = field(runs, RUNS.since_ns)
    cdef list until_ns = field(runs, RUNS.until_ns)
    cdef list touched = field(runs, RUNS.touched)
    lasts[last] = seq
    if ts_ns < since_ns[last]:
        since_ns[last] = ts_ns
    if ts_ns > until_ns[last]:
        until_ns[last] = ts_ns
    if touched[last] != now:
        touched[last] = now
        due = field(runs, RUNS.due)
        if due is not None:
            _heappush(due, (now, seq))
    return True


cdef bint _vouch_covered(object ledger, object stream, object server_id, object seq, object breaks,
                         object now) except -1:
    """`ReportLedger.vouch` for a stream and a (stream, server) cover already followed, with
    the same losses (True); False, having changed nothing, for any other case (the method's)."""
    member = (<dict>field(ledger, LEDGER._members)).get(stream)
    cover = (<dict>field(ledger, LEDGER._covers)).get((stream, server_id))
    if type(member) is not _Member or type(cover) is not list or len(<list>cover) != 3 or breaks != cover[0]:
        return False
    if now > field(member, MEMBER.heard):
        member.heard = now
    if seq > cover[2]:
        if seq - cover[2] > _VOUCHED_GAP:
            cover[1] = seq
        cover[2] = seq
    return True


cdef void sequences_forget(object sequences, object key, object arrival) except *:
    """`HopSequences.forget`: an arrival expired from the index, and its decision with it
    (for every arrival that expires: a Python call each, before). Tables not made as
    `_decide` makes them (dicts) are the method's."""
    if type(sequences) is _HopSequences:
        by_key = field(sequences, SEQ._decided)
        if type(by_key) is dict:
            decided = (<dict>by_key).get(key)
            if decided is None:
                return
            if type(decided) is dict:
                (<dict>decided).pop(arrival, None)
                if PyDict_Size(decided) == 0:
                    del (<dict>by_key)[key]
                return
    sequences.forget(key, arrival)


cdef void sequences_learn(object sequences, object key, object arrival, object egress) except *:
    """As `HopSequences.learn`."""
    if (type(sequences) is not _HopSequences or type(key) is not tuple or len(<tuple>key) != 4
            or not isinstance(arrival, tuple) or not isinstance(egress, tuple)):
        sequences.learn(key, arrival, egress)
        return
    if not field(sequences, SEQ._bounded):
        return
    link = ((<tuple>key)[2], (<tuple>key)[3])
    latency = field(sequences, SEQ.latency)
    # By position, cast: an `Arrival`'s or `Egress`'s `[0]` read as an object goes through
    # the NamedTuple class's `__getitem__` look-up (CPython's slot_sq_item), ~0.3 µs each.
    latency_ns = (<tuple>arrival)[0] - (<tuple>egress)[0]
    if type(latency) is not _LinkLatency or not _latency_learn(latency, link, latency_ns):
        latency.learn(link, latency_ns)
    pairs = (<dict>field(sequences, SEQ._link_pairs)).get(link)
    if type(pairs) is _LinkPairs:
        _pairs_add(pairs, egress, arrival, (<tuple>key)[0])
    else:  # a link not kept yet (or a stand-in): `_mark` decides
        sequences._mark(link, (<tuple>key)[0], egress, arrival)


cdef bint _latency_learn(object latency, object link, object latency_ns) except -1:
    """`LinkLatency.learn` for a link already learned (True); False, having changed nothing."""
    samples = (<dict>field(latency, LATENCY._samples)).get(link)
    if samples is None:
        return False
    _append(samples, latency_ns)
    (<dict>field(latency, LATENCY._estimates)).pop(link, None)
    return True


cdef Py_ssize_t _bisect_right_ints(list times, object value) except -2:
    """`bisect_right(times, value)` where the value and each time compared are ints of 64
    bits (what the servers' nanoseconds are): the comparisons in C, no call through
    `bisect`'s argument parsing (~1k instructions a call on a list of 32). -1 where one is
    not: then `bisect_right` decides."""
    cdef int overflow = 0
    cdef long long x, y
    cdef Py_ssize_t lo = 0, hi = len(times), mid
    if type(value) is not int:
        return -1
    x = PyLong_AsLongLongAndOverflow(value, &overflow)
    if overflow:
        return -1
    while lo < hi:
        mid = (lo + hi) // 2
        item = <object>PyList_GET_ITEM(times, mid)
        if type(item) is not int:
            return -1
        y = PyLong_AsLongLongAndOverflow(item, &overflow)
        if overflow:
            return -1
        if x < y:
            hi = mid
        else:
            lo = mid + 1
    return lo


cdef void _pairs_add(object pairs, object egress, object arrival, object context) except *:
    """`_LinkPairs.add` as the live bridge calls it (the latest `_LINK_PAIRS` kept)."""
    cdef list times = field(pairs, PAIRS.times)
    cdef list kept = field(pairs, PAIRS.pairs)
    cdef Py_ssize_t n = len(times)
    time_ns = (<tuple>arrival)[0]  # a tuple: `sequences_learn` checked
    if n == 0 or times[n - 1] <= time_ns:  # the usual: the latest hop comes last (bisect_right's n)
        times.append(time_ns)
        kept.append((egress, arrival, context))
    else:
        at = _bisect_right_ints(times, time_ns)
        if at < 0:
            at = bisect_right(times, time_ns)
        times.insert(at, time_ns)
        kept.insert(at, (egress, arrival, context))
    if len(times) > _LINK_PAIRS:
        del times[0], kept[0]
