"""Which upstream egress forwarded *this* message to a downstream server (DESIGN §4).

A server that forwards a traced message over a route, gateway or leafnode reports an egress
with a hop id; the server that receives it reports an ingress with that hop id in its
`Nats-Trace-Hop` header. When one trace context (traceparent, or ad-hoc destination) is
used by many messages - a producer span publishing a batch is ordinary OpenTelemetry use -
many egresses share that hop id, so the hop id alone cannot say which one a downstream
report belongs to. The servers report two more things, and we use exactly those:

* time: the egress left at most `max_hop_latency` before the ingress (and at most
  `max_clock_skew` after it: servers' clocks differ);
* the message itself (`shapes.message_shape`): its size without the headers servers add or
  rewrite on the way (`Nats-Trace-Hop` on every forward; `Nats-Request-Info` and
  `Nats-Trace-Dest` across a service import), and, when it carries any header beyond those
  and the trace context (`Nats-Msg-Id`, an application's id or sequence), a digest of those
  headers. A size alone only breaks ties between several candidates in time. A digest is
  exact evidence: an arrival and an egress whose shapes differ while either carries a
  digest are different messages and are never linked, whatever the time, the order or the
  losses say; one whose digest no other message of the window shares is linked by it.

A downstream report is linked to an egress only when each is the other's one candidate
(mutually unique): a lost trace message or another message of the same context can then
never be taken for the right one. Otherwise the link is `ambiguous` (several candidates)
or `unmatched` (none seen), the caller says so on the span and in a metric, and the span
hangs under the producer's span instead (a true ancestor, never another message).

The index is the only state; the caller owns it. `convert` and the backfill fill it with the
whole input first, so the result ignores the input order; the live bridge observes each
trace message on arrival and decides `link_wait` later, with time- and entry-bounded memory
(`expire`): the same result as `convert` for every pair whose two trace messages reach the
bridge within `link_wait` of each other.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from dataclasses import dataclass
from typing import Any, NamedTuple

from nats_otel.core.sequences import HopSequences
from nats_otel.core.shapes import SHAPE_DIGEST, shapes_agree

__all__ = [
    "AMBIGUOUS",
    "MATCHED",
    "UNMATCHED",
    "Arrival",
    "Egress",
    "Link",
    "LinkIndex",
    "LinkKey",
    "LinkSettings",
    "PythonLinkIndex",
]

MATCHED = "matched"
UNMATCHED = "unmatched"
AMBIGUOUS = "ambiguous"

# Context id fields (trace id + parent span id, or the ad-hoc group), hop id, upstream server
# name, downstream server name. Names, not ids: the downstream only knows its upstream by name.
LinkKey = tuple[bytes, str, str, str]


class Egress(NamedTuple):
    """One forwarding egress reported upstream. Sorted by time within its key."""

    ts_ns: int
    size: int
    ident: bytes  # the upstream trace message's identity (see `pipeline.identity`)
    span_id: bytes


class Arrival(NamedTuple):
    """One downstream server's ingress of a forwarded message."""

    ts_ns: int
    size: int
    ident: bytes


class Link(NamedTuple):
    """The decision for one downstream report: `egress` is set only when `MATCHED`; `first`
    is False when this arrival was matched before (a redelivered report: count it once)."""

    result: str
    egress: Egress | None = None
    candidates: int = 0
    first: bool = True


@dataclass(frozen=True, slots=True)
class LinkSettings:
    """The matching window and the live bridge's memory bound. Defaults: see docs/span-model.md."""

    max_hop_latency_s: float = 0.5
    max_clock_skew_s: float = 0.1
    #: Live only: entries (egresses + arrivals) kept; the oldest go first past it (counted).
    capacity: int = 1_000_000
    #: Live only: how long an entry stays after it was observed (seconds of the caller's clock).
    retention_s: float = 30.0

    @property
    def latency_ns(self) -> int:
        return int(self.max_hop_latency_s * 1e9)

    @property
    def skew_ns(self) -> int:
        return int(self.max_clock_skew_s * 1e9)


def _window(entries: list, lo_ns: int, hi_ns: int) -> tuple[int, int]:
    """(start, end) of the entries (sorted by time) with lo_ns <= ts_ns <= hi_ns."""
    return bisect_left(entries, (lo_ns,)), bisect_left(entries, (hi_ns + 1,))


class PythonLinkIndex:
    """Both sides of every hop observed, by link key and by (link key, size), time-sorted;
    bounded when `expire`d. The reference of the kernel's `LinkIndex` (`_stage_link.pxi`)."""

    __slots__ = ("_bounded", "_claimed", "_fifo", "_latency_ns", "_refreshed", "_skew_ns", "_tables", "evicted",
                 "expired_unmatched", "sequences", "settings")

    def __init__(self, settings: LinkSettings = LinkSettings(), bounded: bool = True) -> None:
        self.settings = settings
        # The window in nanoseconds, worked out once (two properties per `resolve` otherwise).
        self._latency_ns, self._skew_ns = settings.latency_ns, settings.skew_ns
        # Unbounded (a whole input, `convert`): nothing expires, no observation order kept.
        self._bounded = bounded
        # Egresses (True) and arrivals (False), each by key and by (key, size): the second
        # finds the same-size candidates among many without looking at each.
        self._tables: dict[bool, tuple[dict[Any, list[Any]], dict[Any, list[Any]]]] = {
            True: ({}, {}), False: ({}, {})}
        # (observed at, is egress, key, entry) in observation order: what `expire` drops first.
        self._fifo: deque[tuple[float, bool, LinkKey, Egress | Arrival]] = deque()
        # Entries observed again (redelivered reports, replayed evidence) -> how many later
        # records of theirs the fifo holds: each stays `retention_s` from its last
        # observation, since its partner may be redelivered later still.
        self._refreshed: dict[tuple[bool, LinkKey, Egress | Arrival], int] = {}
        self.evicted = 0  # entries dropped for the capacity bound before their time was up
        # (is egress, key, entry) of both sides of every matched hop, until they expire:
        # what was never matched is counted when it goes, by side.
        self._claimed: set[tuple[bool, LinkKey, Egress | Arrival]] = set()
        self.expired_unmatched = {"upstream": 0, "downstream": 0}
        # Where a key's window holds several candidates: order and latency (`sequences`).
        self.sequences = HopSequences(self._latency_ns, self._skew_ns, settings.capacity, settings.retention_s,
                                      bounded, self.held)

    def __len__(self) -> int:
        """Entries held (egresses and arrivals)."""
        return sum(len(entries) for table in self._tables.values() for entries in table[0].values())

    def held(self) -> list[tuple[LinkKey, list[Egress], list[Arrival]]]:
        """Every key held, with its time-sorted egresses and arrivals."""
        egresses, arrivals = self._tables[True][0], self._tables[False][0]
        return [(key, egresses.get(key, []), arrivals.get(key, [])) for key in {**egresses, **arrivals}]

    def observe_report(self, ident: bytes, server_id: str, seq: int, ts_ns: int, now: float = 0.0,
                       account: str = "") -> None:
        """Any report seen, with or without hop evidence: its server's event number says,
        later, whether a stretch of that server's reports is complete (`sequences`)."""
        self.sequences.ledger.observe(ident, server_id, seq, ts_ns, now, account)

    def add_egress(self, key: LinkKey, egress: Egress, now: float = 0.0) -> None:
        """Record a forwarding egress (a redelivered trace message is recorded once)."""
        self._add(True, key, egress, now)

    def add_arrival(self, key: LinkKey, arrival: Arrival, now: float = 0.0) -> None:
        """Record a downstream ingress (a redelivered trace message is recorded once)."""
        self._add(False, key, arrival, now)

    def _add(self, is_egress: bool, key: LinkKey, entry: Egress | Arrival, now: float) -> None:
        by_key, by_size = self._tables[is_egress]
        entries = by_key.get(key)
        sized_key = (key, entry.size)
        if entries is None:  # the common case: the first entry of its key, nothing to sort
            by_key[key] = [entry]
            by_size[sized_key] = [entry]
        else:
            at = bisect_left(entries, entry)
            if at < len(entries) and entries[at] == entry:
                if self._bounded:  # observed again (a redelivery): kept `retention_s` from now
                    self._refreshed[(is_egress, key, entry)] = self._refreshed.get((is_egress, key, entry), 0) + 1
                    self._fifo.append((now, is_egress, key, entry))
                return
            entries.insert(at, entry)
            sized = by_size.get(sized_key)
            if sized is None:
                by_size[sized_key] = [entry]
            else:
                sized.insert(bisect_left(sized, entry), entry)
        if self._bounded:
            self._fifo.append((now, is_egress, key, entry))

    def _candidates(self, is_egress: bool, key: LinkKey, lo_ns: int, hi_ns: int, shape: int) -> tuple[list, int]:
        """The one candidate in [lo_ns, hi_ns] (or of the same shape, when several fit in
        time) as a list of one, else [] and how many fit. A digest (`message_shape`) admits
        only entries of its own shape; an entry with a digest admits only its own shape."""
        by_key, by_size = self._tables[is_egress]
        entries = by_key.get(key)
        if entries is None:
            return [], 0
        if len(entries) == 1:  # the common case: one entry for the key, no search
            entry = entries[0]
            if lo_ns <= entry.ts_ns <= hi_ns and shapes_agree(shape, entry.size):
                return entries, 1
            return [], 0
        if shape >= SHAPE_DIGEST:  # exact evidence: only the same message counts
            sized = by_size.get((key, shape), [])
            s_start, s_end = _window(sized, lo_ns, hi_ns)
            return sized[s_start:s_end] if s_end - s_start == 1 else [], s_end - s_start
        start, end = _window(entries, lo_ns, hi_ns)
        if end - start <= 1:
            if end > start and entries[start].size >= SHAPE_DIGEST:
                return [], 0  # another message's, by its digest
            return entries[start:end], end - start
        sized = by_size.get((key, shape), [])
        s_start, s_end = _window(sized, lo_ns, hi_ns)
        if s_end - s_start == 1:
            return sized[s_start:s_end], 1
        return [], end - start

    def _alone(self, is_egress: bool, key: LinkKey, size: int) -> bool:
        """No other entry of the key on that side has this size: a pair alone in its window
        is one message's unless two alike messages lost a report each."""
        by_key, by_size = self._tables[is_egress]
        return len(by_key.get(key, ())) <= 1 or len(by_size.get((key, size), ())) <= 1

    def resolve(self, key: LinkKey, arrival: Arrival) -> Link:
        """The egress that forwarded the message of `arrival`, if the evidence says so."""
        latency_ns, skew_ns = self._latency_ns, self._skew_ns
        found, count = self._candidates(True, key, arrival.ts_ns - latency_ns, arrival.ts_ns + skew_ns,
                                        arrival.size)
        if not found and not count:
            return Link(UNMATCHED)
        egress = found[0] if found else None
        if egress is not None:
            # The other way round: this arrival must be the egress's only candidate too, else a
            # lost report could make two arrivals claim one egress.
            back, count = self._candidates(False, key, egress.ts_ns - skew_ns, egress.ts_ns + latency_ns,
                                           egress.size)
            if not back or back[0].ident != arrival.ident:
                egress = None
            elif arrival.size < SHAPE_DIGEST and not (self._alone(True, key, egress.size)
                                                      and self._alone(False, key, arrival.size)):
                # The key carries several alike messages: two reports lost, an egress of one
                # and an arrival of another, would leave a pair alone in the window that is
                # not one message's. Only order, where completeness is proven, decides.
                egress = None
        if egress is None:  # several candidates: order and latency decide, if they can
            result, egress, count = self.sequences.resolve(key, self._tables[True][0][key],
                                                           self._tables[False][0].get(key, ()), arrival)
            if egress is None:
                return Link(result, None, count)
            if not shapes_agree(arrival.size, egress.size):  # never against exact evidence
                return Link(AMBIGUOUS, None, max(count, 2))
        elif (False, key, arrival) not in self._claimed:
            self.sequences.learn(key, arrival, egress)
        claimed = self._claimed
        first = (False, key, arrival) not in claimed
        if first:
            claimed.add((False, key, arrival))
            claimed.add((True, key, egress))
        return Link(MATCHED, egress, 1, first)

    def expire(self, now: float) -> None:
        """Drop entries observed more than `retention_s` before `now`, and the oldest past
        `capacity` (counted in `evicted`). O(1) amortised per entry."""
        horizon = now - self.settings.retention_s
        fifo = self._fifo
        while fifo and (fifo[0][0] < horizon or len(fifo) > self.settings.capacity):
            observed, is_egress, key, entry = fifo.popleft()
            if self._refreshed:
                later = self._refreshed.pop((is_egress, key, entry), 0)
                if later:  # observed again since: its last record expires it
                    if later > 1:
                        self._refreshed[(is_egress, key, entry)] = later - 1
                    continue
            if not is_egress:
                self.sequences.forget(key, entry)
            if observed >= horizon:
                self.evicted += 1
            side = (is_egress, key, entry)
            if side in self._claimed:
                self._claimed.discard(side)
            else:
                self.expired_unmatched["upstream" if is_egress else "downstream"] += 1
            by_key, by_size = self._tables[is_egress]
            for table, index in ((by_key, key), (by_size, (key, entry.size))):
                entries = table[index]
                del entries[bisect_left(entries, entry)]
                if not entries:
                    del table[index]
        self.sequences.expire(now)


# The reference; the kernel's `LinkIndex` (`_stage_link.pxi`: the same decisions with another
# layout) is its compiled counterpart, which `engine` chooses.
LinkIndex = PythonLinkIndex
