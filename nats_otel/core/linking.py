"""Which upstream egress forwarded *this* message to a downstream server (DESIGN §4).

A server that forwards a traced message over a route, gateway or leafnode reports an egress
with a hop id; the server that receives it reports an ingress with that hop id in its
`Nats-Trace-Hop` header. When one trace context (traceparent, or ad-hoc destination) is
used by many messages - a producer span publishing a batch is ordinary OpenTelemetry use -
many egresses share that hop id, so the hop id alone cannot say which one a downstream
report belongs to. The servers report two more things, and we use exactly those:

* time: the egress left at most `max_hop_latency` before the ingress (and at most
  `max_clock_skew` after it: servers' clocks differ);
* size: the forwarded message is the upstream's message plus the `Nats-Trace-Hop` header
  (`body_size` takes that header out on both sides). Service imports add headers on the
  way, so size only breaks ties between several candidates in time, never vetoes one.

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
from typing import NamedTuple

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
    "body_size",
]

MATCHED = "matched"
UNMATCHED = "unmatched"
AMBIGUOUS = "ambiguous"

# Context id fields (trace id + parent span id, or the ad-hoc group), hop id, upstream server
# name, downstream server name. Names, not ids: the downstream only knows its upstream by name.
LinkKey = tuple[bytes, str, str, str]

# More candidates in time than this: ambiguous without looking at each (bounded work).
_MAX_CANDIDATES = 64
_HOP_HEADER = "nats-trace-hop"


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
    """The decision for one downstream report: `egress` is set only when `MATCHED`."""

    result: str
    egress: Egress | None = None
    candidates: int = 0


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


def body_size(msg_size: int, headers: dict[str, list[str]]) -> int:
    """The traced message's size without its `Nats-Trace-Hop` header line(s).

    Servers add `Nats-Trace-Hop: <hop>\\r\\n` when they forward; taking it out makes the
    upstream's and the downstream's sizes of one message equal (seen on every corpus hop).
    """
    for name, values in headers.items():
        if name.lower() == _HOP_HEADER:
            return msg_size - sum(len(name) + 2 + len(value) + 2 for value in values)
    return msg_size


def _window(entries: list, lo_ns: int, hi_ns: int) -> list:
    """Entries (sorted by time) with lo_ns <= ts_ns <= hi_ns."""
    return entries[bisect_left(entries, (lo_ns,)) : bisect_left(entries, (hi_ns + 1,))]


def _narrow(candidates: list, size: int) -> list:
    """Several candidates in time: keep those of the same size, if any is."""
    if len(candidates) <= 1:
        return candidates
    same = [c for c in candidates if c.size == size]
    return same or candidates


class LinkIndex:
    """Both sides of every hop observed, by link key, time-sorted; bounded when `expire`d."""

    __slots__ = ("_arrivals", "_egresses", "_fifo", "evicted", "settings")

    def __init__(self, settings: LinkSettings = LinkSettings()) -> None:
        self.settings = settings
        self._egresses: dict[LinkKey, list[Egress]] = {}
        self._arrivals: dict[LinkKey, list[Arrival]] = {}
        # (observed at, is egress, key, entry) in observation order: what `expire` drops first.
        self._fifo: deque[tuple[float, bool, LinkKey, tuple]] = deque()
        self.evicted = 0  # entries dropped for the capacity bound before their time was up

    def __len__(self) -> int:
        return len(self._fifo)

    def add_egress(self, key: LinkKey, egress: Egress, now: float = 0.0) -> None:
        """Record a forwarding egress (a redelivered trace message is recorded once)."""
        if self._add(self._egresses, key, egress):
            self._fifo.append((now, True, key, egress))

    def add_arrival(self, key: LinkKey, arrival: Arrival, now: float = 0.0) -> None:
        """Record a downstream ingress (a redelivered trace message is recorded once)."""
        if self._add(self._arrivals, key, arrival):
            self._fifo.append((now, False, key, arrival))

    @staticmethod
    def _add(table: dict, key: LinkKey, entry: tuple) -> bool:
        entries = table.get(key)
        if entries is None:
            table[key] = [entry]
            return True
        at = bisect_left(entries, entry)
        if at < len(entries) and entries[at] == entry:
            return False
        entries.insert(at, entry)
        return True

    def resolve(self, key: LinkKey, arrival: Arrival) -> Link:
        """The egress that forwarded the message of `arrival`, if the evidence says so."""
        s = self.settings
        egresses = self._egresses.get(key, [])
        candidates = _window(egresses, arrival.ts_ns - s.latency_ns, arrival.ts_ns + s.skew_ns)
        if len(candidates) > _MAX_CANDIDATES:
            return Link(AMBIGUOUS, None, len(candidates))
        candidates = _narrow(candidates, arrival.size)
        if not candidates:
            return Link(UNMATCHED)
        if len(candidates) > 1:
            return Link(AMBIGUOUS, None, len(candidates))
        egress = candidates[0]
        # The other way round: this arrival must be the egress's only candidate too, else a
        # lost report could make two arrivals claim one egress.
        back = _window(self._arrivals.get(key, []), egress.ts_ns - s.skew_ns, egress.ts_ns + s.latency_ns)
        if len(back) > _MAX_CANDIDATES:
            return Link(AMBIGUOUS, None, len(back))
        back = _narrow(back, egress.size)
        if len(back) != 1 or back[0].ident != arrival.ident:
            return Link(AMBIGUOUS, None, max(len(back), 2))
        return Link(MATCHED, egress, 1)

    def expire(self, now: float) -> None:
        """Drop entries observed more than `retention_s` before `now`, and the oldest past
        `capacity` (counted in `evicted`). O(1) amortised per entry."""
        horizon = now - self.settings.retention_s
        fifo = self._fifo
        while fifo and (fifo[0][0] < horizon or len(fifo) > self.settings.capacity):
            observed, is_egress, key, entry = fifo.popleft()
            if observed >= horizon:
                self.evicted += 1
            table = self._egresses if is_egress else self._arrivals
            entries = table[key]
            at = bisect_left(entries, entry)
            del entries[at]
            if not entries:
                del table[key]
