"""Which egress forwarded a message when one trace context crowds a hop: order, where the
evidence proves it.

`linking` decides a hop on its own when its upstream egress and its downstream arrival are
each other's only candidate in the time window (or the only one of the arrival's own shape,
`shapes`). A producer span that publishes a batch (ordinary OpenTelemetry) puts many
alike messages under one context, hop id and pair of servers; there the window holds many
candidates, and the servers' own evidence decides, by **order**: per connection NATS
delivers in order, so the k-th egress of a context to a peer is the k-th arrival there.
Counting is only safe over a stretch where no report of either server can be missing:
every server numbers the events it publishes (`server.seq`), so a `ReportLedger` of the
numbers seen, as runs of consecutive numbers, says where a report was lost (and a bridge
that lost nothing vouches for the gaps its servers' other events leave: `ReportLedger.vouch`).
An arrival is matched by order from an *anchor* (the nearest earlier arrival of the key
already matched, or the start of the key's cluster) when both servers' reports are complete
from the anchor to it.

Everything else stays `ambiguous`: where reports were lost, nothing proves which is which.
Two rules that decided there by what is likely (the distance between report numbers, the
link's learned latency) went in issue 36: on real archives from sidecars they linked spans
under a neighbour's egress, and order counted on from those. A wrong parent is worse than none.

Pure: no clock (the caller's `now`), no I/O. Work per decision is bounded (`MAX_WALK`), and
`convert` (everything observed first) aligns each crowded key once, in time order, so its
result does not depend on the input order."""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from nats_otel.core.link_latency import LinkLatency, in_window
from nats_otel.core.report_ledger import ReportLedger
from nats_otel.core.shapes import shapes_agree

__all__ = ["MAX_WALK", "HopSequences"]

# An arrival is matched by order from an anchor at most this many arrivals back; further
# (a key resolved far out of order) it stays ambiguous. Bounds the work of one decision.
MAX_WALK = 64

MATCHED, AMBIGUOUS = "matched", "ambiguous"


# A cluster vouches for its own start (`HopSequences._closed`) up to this many arrivals:
# a batch's worth; each check walks the cluster once.
_CLUSTER_MAX = 1024
# Matched pairs kept per link to vouch for a cluster's start (`HopSequences._preceded`).
_LINK_PAIRS = 32


class _LinkPairs:
    """The matched (egress, arrival, context) pairs kept on one link, sorted by arrival time,
    and those times in a list of their own, in step: bisected in C with no key function
    (a key's Python calls were most of what `HopSequences.learn` cost, issue 39). A pair
    goes after those of an equal time, as `insort` places it."""

    __slots__ = ("pairs", "times")

    def __init__(self) -> None:
        self.pairs: list[tuple[Any, Any, bytes]] = []
        self.times: list[int] = []

    def add(self, egress: Any, arrival: Any, context: bytes, keep: int | None) -> None:
        """Keep a pair; with `keep`, only that many of the latest."""
        at = bisect_right(self.times, arrival[0])
        self.times.insert(at, arrival[0])
        self.pairs.insert(at, (egress, arrival, context))
        if keep is not None and len(self.times) > keep:
            del self.times[0], self.pairs[0]


class HopSequences:
    """Decides the crowded hops (see the module's docstring); `linking`'s index calls it with
    a key's time-sorted egresses and arrivals when its window holds several candidates.

    `keys` lists every key held with its egresses and arrivals: the whole-input mode
    (`bounded` False) learns from all of them before its first decision."""

    __slots__ = ("_aligned", "_bounded", "_decided", "_key_latency", "_keys", "_link_pairs", "decided_by", "latency",
                 "latency_ns", "ledger", "skew_ns")

    def __init__(self, latency_ns: int, skew_ns: int, capacity: int, retention_s: float,
                 bounded: bool = True, keys: Callable[[], Iterable[tuple[Any, Sequence[Any], Sequence[Any]]]]
                 | None = None) -> None:
        self.latency_ns, self.skew_ns, self._bounded, self._keys = latency_ns, skew_ns, bounded, keys
        self.ledger = ReportLedger(capacity, retention_s, bounded)
        self.latency = LinkLatency()
        # key -> {arrival: egress} decided here (the anchors of later decisions).
        self._decided: dict[Any, dict[Any, Any]] = {}
        # Whole-input mode: True once every crowded key was aligned; each crowded key's
        # latency from its own times (a key is all one context: the backfill, which converts
        # one context at a time, learns the same).
        self._aligned = False
        self._key_latency: dict[Any, tuple[int, int] | None] = {}
        # (upstream, downstream) -> recent matched (egress, arrival) pairs of any context: a
        # cluster's start is trusted when one of them precedes it in both servers' runs.
        # Whole input: only pairs of the same context (the backfill converts one at a time).
        self._link_pairs: dict[tuple[str, str], _LinkPairs] = {}
        # Crowded hops decided here, by the rule that decided them ("order", "numbers",
        # "latency"): what each rule's share is (tests, bench/hop_links.py). The others
        # linked were each other's only candidate, or the only one of their shape.
        self.decided_by: Counter[str] = Counter()

    def forget(self, key: Any, arrival: Any) -> None:
        """An arrival expired from the index: its decision goes with it."""
        decided = self._decided.get(key)
        if decided is not None:
            decided.pop(arrival, None)
            if not decided:
                del self._decided[key]

    def expire(self, now: float) -> None:
        self.ledger.expire(now)

    def learn(self, key: Any, arrival: Any, egress: Any) -> None:
        """A hop matched on its own (one candidate each way): its latency, for its link, and the
        pair as a mark on the link. Only the live bridge learns as it goes; the whole-input
        mode learns everything first."""
        if self._bounded:
            link = (key[2], key[3])
            self.latency.learn(link, arrival[0] - egress[0])
            self._mark(link, key[0], egress, arrival)

    def _mark(self, link: tuple[str, str], context: Any, egress: Any, arrival: Any) -> None:
        """Keep the matched pair (`egress`, `arrival`) of `context` on `link`, by arrival time
        (found by bisect); the live bridge keeps the latest few."""
        pairs = self._link_pairs.get(link)
        if pairs is None:
            if len(self._link_pairs) >= 4096:  # links are pairs of servers: a hostile input's bound
                return
            pairs = self._link_pairs[link] = _LinkPairs()
        pairs.add(egress, arrival, context, _LINK_PAIRS if self._bounded else None)

    def _preceded(self, key: Any, egress: Any, arrival: Any) -> bool:
        """A matched pair of the same link and account, earlier on both sides, lies in the same
        run of reports as `egress` (upstream) and `arrival` (downstream): per connection the
        order holds, so any report of this cluster's first message lies in those runs too,
        and a lost one would show."""
        marks = self._link_pairs.get((key[2], key[3]))
        if marks is None or not marks.pairs:
            return False
        ledger = self.ledger
        accounts = ledger.account(egress[2]), ledger.account(arrival[2])
        before = bisect_left(marks.times, arrival[0])
        for earlier_egress, earlier_arrival, context in reversed(marks.pairs[max(0, before - _LINK_PAIRS):before]):
            if ((self._bounded or context == key[0])
                    and earlier_egress[0] < egress[0] and earlier_arrival[0] < arrival[0]
                    and (ledger.account(earlier_egress[2]), ledger.account(earlier_arrival[2])) == accounts
                    and ledger.complete(earlier_egress[2], egress[2])
                    and ledger.complete(earlier_arrival[2], arrival[2])):
                return True
        return False

    def resolve(self, key: Any, egresses: Sequence[Any], arrivals: Sequence[Any],
                arrival: Any) -> tuple[str, Any, int]:
        """(result, egress or None, candidates) for `arrival` among a key's entries."""
        decided = self._decided.get(key)
        if decided is not None and arrival in decided:
            return MATCHED, decided[arrival], 1
        if not self._bounded:
            if not self._aligned:
                self._align_all()
            decided = self._decided.get(key)
            if decided is not None and arrival in decided:
                return MATCHED, decided[arrival], 1
        else:
            position = bisect_left(arrivals, arrival)
            if position < len(arrivals) and arrivals[position] == arrival:
                egress = self._decide(key, egresses, arrivals, position)
                if egress is not None:
                    return MATCHED, egress, 1
        lo, hi = in_window(egresses, arrival[0] - self.latency_ns, arrival[0] + self.skew_ns)
        return AMBIGUOUS, None, max(hi - lo, 2)

    def _align_all(self) -> None:
        """Whole input: decide every crowded key's arrivals in time order (each anchoring the
        next): the same result whatever order the reports were read in."""
        self._aligned = True
        if self._keys is None:
            return
        everything = sorted(((key, list(egresses), list(arrivals)) for key, egresses, arrivals in self._keys()
                             if egresses and arrivals), key=lambda item: (item[2][0], item[0]))
        held = [item for item in everything if len(item[1]) > 1 or len(item[2]) > 1]
        # The single pairs (a context per message) mark their links, in time order.
        for key, egresses, arrivals in everything:
            if len(egresses) == 1 and len(arrivals) == 1 and (
                    egresses[0][0] - self.skew_ns <= arrivals[0][0] <= egresses[0][0] + self.latency_ns):
                self._mark((key[2], key[3]), key[0], egresses[0], arrivals[0])
        for key, egresses, arrivals in held:
            for position in range(len(arrivals)):
                self._decide(key, egresses, arrivals, position)

    def _decide(self, key: Any, egresses: Sequence[Any], arrivals: Sequence[Any], position: int) -> Any:
        """The egress of `arrivals[position]` by order, else None; recorded."""
        arrival = arrivals[position]
        decided = self._decided.get(key)
        if decided is not None and arrival in decided:
            return decided[arrival]
        egress = self._by_order(key, egresses, arrivals, position)
        if egress is not None and not shapes_agree(arrival[1], egress[1]):
            egress = None  # the messages' own headers say otherwise: exact evidence wins
        if egress is not None:
            link = (key[2], key[3])
            if self._bounded:
                self.latency.learn(link, arrival[0] - egress[0])
            self._decided.setdefault(key, {})[arrival] = egress
            self._mark(link, key[0], egress, arrival)
            self.decided_by["order"] += 1
        return egress

    def _by_order(self, key: Any, egresses: Sequence[Any], arrivals: Sequence[Any], position: int) -> Any:
        arrival = arrivals[position]
        decided = self._decided.get(key) or {}
        wide = self.latency_ns + self.skew_ns
        # The anchor: the nearest earlier arrival matched already, or the key's cluster start
        # (an arrival with none other within the window before it).
        anchor_at = -1
        for back in range(position, max(position - MAX_WALK, -1), -1):
            if back < position and arrivals[back] in decided:
                anchor_at = back
                break
            if back == 0 or arrivals[back][0] - arrivals[back - 1][0] > wide:
                anchor_at = back
                break
        if anchor_at < 0:
            return None
        anchor = arrivals[anchor_at]
        anchor_egress = decided.get(anchor)
        since_up: int | None = None
        since_down: int | None = None
        if anchor_egress is not None:  # count on from a matched arrival's egress
            at = bisect_left(egresses, anchor_egress)
            if at >= len(egresses) or egresses[at] != anchor_egress:
                return None
            target = at + position - anchor_at
        else:
            # From the cluster's start: its first egress is the first in the anchor's window,
            # none may lie just before that window, and no report of either server may be
            # missing from before the cluster on (a lost one could be its true first).
            lo, _ = in_window(egresses, anchor[0] - self.latency_ns, anchor[0] + self.skew_ns)
            if lo >= len(egresses) or (lo > 0 and egresses[lo - 1][0] >= anchor[0] - wide):
                return None
            target = lo + position - anchor_at
            anchor_egress = egresses[lo]
            # A lost egress whose arrival is here left at most the window's latency before the
            # first arrival; a lost arrival of an egress here came at most the skew before it.
            # The wide window, not a learned latency: a latency learned wrong must not make a
            # whole cluster count from the wrong start.
            since_up, since_down = anchor[0] - self.latency_ns, anchor_egress[0] - self.skew_ns
        if target >= len(egresses):
            return None
        egress = egresses[target]
        if not egress[0] - self.skew_ns <= arrival[0] <= egress[0] + self.latency_ns:
            return None
        ledger = self.ledger
        if since_up is not None and (self._preceded(key, anchor_egress, anchor)
                                     or self._closed(egresses, arrivals, anchor_at, lo)):
            since_up = since_down = None  # an earlier pair on the link, or the cluster itself, vouches
        if not (ledger.complete(anchor[2], arrival[2], since_down)
                and ledger.complete(anchor_egress[2], egress[2], since_up)):
            return None
        return egress

    def _closed(self, egresses: Sequence[Any], arrivals: Sequence[Any], start: int, lo: int) -> bool:
        """The cluster starting at `arrivals[start]` (its first egress `egresses[lo]`) vouches
        for its own start: as many egresses as arrivals, every report of both servers seen
        from its first entry to a whole window past its last. Then no report of it was lost
        inside or after it; one lost before the bridge first saw either server would leave
        one side longer, and two such losses cannot cancel: per connection the order holds,
        so a lost first egress with a seen arrival and a seen egress with a lost arrival
        would each have to come before the other. (What makes the first cluster a bridge
        sees, and batches sent back to back, countable.) Bounded: `_CLUSTER_MAX` arrivals."""
        wide = self.latency_ns + self.skew_ns
        end = start + 1
        while end < len(arrivals) and arrivals[end][0] - arrivals[end - 1][0] <= wide:
            end += 1
            if end - start > _CLUSTER_MAX:
                return False
        last_arrival = arrivals[end - 1]
        _, hi = in_window(egresses, egresses[lo][0], last_arrival[0] + self.skew_ns)
        if hi - lo != end - start:
            return False
        last_egress = egresses[hi - 1]
        # An egress's arrival comes at most the window's latency after it; an arrival's
        # egress left at most the skew after it.
        return (self.ledger.complete(arrivals[start][2], last_arrival[2], None, last_egress[0] + self.latency_ns)
                and self.ledger.complete(egresses[lo][2], last_egress[2], None, last_arrival[0] + self.skew_ns))
