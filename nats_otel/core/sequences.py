"""Which egress forwarded a message when one trace context crowds a hop: order, then latency.

`linking` decides a hop on its own when its upstream egress and its downstream arrival are
each other's only candidate in the time window. A producer span that publishes a batch
(ordinary OpenTelemetry) puts many same-size messages under one context, hop id and pair
of servers; there the window holds many candidates, and the servers' own evidence decides:

* **order**: per connection NATS delivers in order, so the k-th egress of a context to a
  peer is the k-th arrival there. Counting is only safe over a stretch where no report of
  either server can be missing: every server numbers the events it publishes (`server.seq`),
  so a `ReportLedger` of the numbers seen, as runs of consecutive numbers, says where a
  report was lost. An arrival is matched by order from an *anchor* (the nearest earlier
  arrival of the key already matched, or the start of the key's cluster) when both
  servers' reports are complete from the anchor to it.
* **report numbers** (whole input): a lost report keeps its number out of the sequence, so
  while neither server publishes anything else the two reports of one message lie a fixed
  distance apart; where the decided pairs beside an arrival keep one distance, its egress
  is the one at that distance (`_by_numbers`).
* **latency**: where a report was lost, time decides if it can. The link's latency (wire
  time plus the two servers' clock offset) drifts slowly; `LinkLatency` learns it per pair of
  servers from the matches themselves. An arrival is matched by time when exactly one egress
  lies within the learned jitter of its expected departure, and it is the only arrival
  expected from that egress.

Everything else stays `ambiguous`: reports were lost inside a run of messages closer
together than the link's jitter, and no evidence can say which is which. A wrong parent is
worse than none.

Pure: no clock (the caller's `now`), no I/O. Work per decision is bounded (`MAX_WALK`), and
`convert` (everything observed first) aligns each crowded key once, in time order, so its
result does not depend on the input order.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from nats_otel.core.link_latency import (
    LATENCY_SAMPLES,
    LinkLatency,
    estimate_latency,
    in_window,
    latency_from_numbers,
    latency_from_times,
)
from nats_otel.core.report_ledger import ReportLedger
from nats_otel.core.shapes import shapes_agree

__all__ = ["MAX_WALK", "HopSequences"]

# An arrival is matched by order from an anchor at most this many arrivals back; further
# (a key resolved far out of order) time decides. Bounds the work of one decision.
MAX_WALK = 64

MATCHED, AMBIGUOUS = "matched", "ambiguous"


# A cluster vouches for its own start (`HopSequences._closed`) up to this many arrivals:
# a batch's worth; each check walks the cluster once.
_CLUSTER_MAX = 1024
# Matched pairs kept per link to vouch for a cluster's start (`HopSequences._preceded`).
_LINK_PAIRS = 32
# Nothing learned on a link yet: the arrivals this far on either side of one show what its
# key's own times agree on.
_RECENT = 16
# A moved distance is confirmed by a neighbour's egress at most this many egresses away.
_CONFIRM = 4
# A key's latency near an arrival: from at most this many decided pairs on either side of
# it, and only from at least this many in all.
_LOCAL_SAMPLES = 16
_LOCAL_MIN = 6


def _arrival_time(pair: tuple[Any, Any, bytes]) -> int:
    return pair[1][0]


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
        self._link_pairs: dict[tuple[str, str], list[tuple[Any, Any, bytes]]] = {}
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
            self.latency.learn((key[2], key[3]), arrival[0] - egress[0])
            self._mark(key, egress, arrival)

    def _mark(self, key: Any, egress: Any, arrival: Any) -> None:
        pairs = self._link_pairs.get((key[2], key[3]))
        if pairs is None:
            if len(self._link_pairs) >= 4096:  # links are pairs of servers: a hostile input's bound
                return
            pairs = self._link_pairs[(key[2], key[3])] = []
        insort(pairs, (egress, arrival, key[0]), key=_arrival_time)  # by arrival: found by bisect
        if self._bounded and len(pairs) > _LINK_PAIRS:
            del pairs[0]  # the live bridge keeps the latest few

    def _preceded(self, key: Any, egress: Any, arrival: Any) -> bool:
        """A matched pair of the same link and account, earlier on both sides, lies in the same
        run of reports as `egress` (upstream) and `arrival` (downstream): per connection the
        order holds, so any report of this cluster's first message lies in those runs too,
        and a lost one would show."""
        pairs = self._link_pairs.get((key[2], key[3]))
        if not pairs:
            return False
        ledger = self.ledger
        accounts = ledger.account(egress[2]), ledger.account(arrival[2])
        before = bisect_left(pairs, arrival[0], key=_arrival_time)
        for earlier_egress, earlier_arrival, context in reversed(pairs[max(0, before - _LINK_PAIRS):before]):
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
        """Whole input: learn every link's latency from everything, then decide every crowded
        key's arrivals in time order (each anchoring the next): the same result whatever
        order the reports were read in."""
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
                self._mark(key, egresses[0], arrivals[0])
        for key, egresses, arrivals in held:
            found = (latency_from_times(egresses, arrivals, self.latency_ns, self.skew_ns)
                     or latency_from_numbers(egresses, arrivals, self.ledger.number, self.latency_ns, self.skew_ns))
            self._key_latency[key] = None if found is None else estimate_latency(found)
        # Order first, everywhere it holds; then report numbers and time where reports were
        # lost, between the order's decisions (never crossing them), and order again from
        # those; a second such pass finds decided pairs on both sides of what is left.
        for by_time in (False, True, True):
            for key, egresses, arrivals in held:
                for position in range(len(arrivals)):
                    self._decide(key, egresses, arrivals, position, by_time)

    def _estimate(self, key: Any) -> tuple[int, int] | None:
        """(latency, tolerance) of the key's link: learned on the link as it goes (live), or
        from the key's own times (whole input)."""
        if self._bounded:
            return self.latency.estimate((key[2], key[3]))
        return self._key_latency.get(key)

    def _decide(self, key: Any, egresses: Sequence[Any], arrivals: Sequence[Any], position: int,
                by_time: bool = True) -> Any:
        """The egress of `arrivals[position]` by order, else (`by_time`) by time, else None;
        recorded."""
        arrival = arrivals[position]
        decided = self._decided.get(key)
        if decided is not None and arrival in decided:
            return decided[arrival]
        rule = "order"
        egress = self._by_order(key, egresses, arrivals, position)
        if egress is not None and not shapes_agree(arrival[1], egress[1]):
            egress = None  # the messages' own headers say otherwise: exact evidence wins
        if egress is not None:
            if self._bounded:
                self.latency.learn((key[2], key[3]), arrival[0] - egress[0])
        elif by_time:
            if not self._bounded:
                rule = "numbers"
                egress = self._by_numbers(key, egresses, arrivals, position)
            if egress is None:
                rule = "latency"
                egress = self._by_time(key, egresses, arrivals, position)
            if egress is not None and not shapes_agree(arrival[1], egress[1]):
                egress = None
        if egress is not None:
            self._decided.setdefault(key, {})[arrival] = egress
            self._mark(key, egress, arrival)
            self.decided_by[rule] += 1
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

    def _by_time(self, key: Any, egresses: Sequence[Any], arrivals: Sequence[Any], position: int) -> Any:
        arrival = arrivals[position]
        link = (key[2], key[3])
        estimate = self._estimate(key)
        if estimate is None and self._bounded:
            # Nothing learned on this link yet: what the key's recent times agree on, if any.
            recent = arrivals[max(0, position - _RECENT):position + _RECENT]
            lo, hi = in_window(egresses, recent[0][0] - self.latency_ns, recent[-1][0] + self.skew_ns)
            found = latency_from_times(egresses[lo:hi], recent, self.latency_ns, self.skew_ns)
            if found:
                self.latency.learn_many(link, found[-LATENCY_SAMPLES:])
                estimate = self.latency.estimate(link)
        if estimate is None:
            return None
        latency_ns, tolerance_ns = estimate
        # One egress where expected, and none other within three times as far: the wire's
        # delays have long tails, and a true egress far out must not leave a neighbour taken.
        expected = arrival[0] - latency_ns
        lo, hi = in_window(egresses, expected - 3 * tolerance_ns, expected + 3 * tolerance_ns)
        if hi - lo != 1 or abs(egresses[lo][0] - expected) > tolerance_ns:
            return None
        egress = egresses[lo]
        back_lo, back_hi = in_window(arrivals, egress[0] + latency_ns - 3 * tolerance_ns,
                                      egress[0] + latency_ns + 3 * tolerance_ns)
        if back_hi - back_lo != 1 or arrivals[back_lo] != arrival:
            return None
        # Never crossing what was decided: per connection, the order holds.
        if not self._between_decided(key, egresses, arrivals, position, lo):
            return None
        # Nor moving the distance between report numbers the decided pairs beside it keep
        # (`_by_numbers`) unless a neighbour confirms the move: a lost egress's neighbour,
        # taken by a latency spike, would move it alone.
        if not self._distance_holds(key, egresses, arrivals, position, lo, latency_ns, tolerance_ns):
            return None
        # Inside the wide window too: a learned latency never widens what `linking` allows.
        if not egress[0] - self.skew_ns <= arrival[0] <= egress[0] + self.latency_ns:
            return None
        # The arrival's own egress may have been lost, with this one (whose own arrival was
        # lost too) just beside it: safe only when no report was lost around one of the two,
        # or when the messages around are far apart compared with the tolerance.
        if not (self._nothing_lost_around(egresses, lo) or self._nothing_lost_around(arrivals, back_lo)
                or (_far_apart(egresses, lo, 8 * tolerance_ns) and _far_apart(arrivals, back_lo, 8 * tolerance_ns))):
            return None
        return egress

    def _by_numbers(self, key: Any, egresses: Sequence[Any], arrivals: Sequence[Any], position: int) -> Any:
        """Whole input: the egress whose report number is as far from the arrival's as at
        the decided arrivals beside it: on both sides, or on one side when the pair's
        latency also agrees with the key's decided pairs near it (`_local_estimate`).

        Each server numbers what it publishes (`server.seq`), one report per message it
        handles, so along a stretch where neither server published anything else (its own
        advisories, other traffic) the two reports of one message lie a fixed distance
        apart, whatever was lost between: lost reports keep their numbers. When the
        decided pairs before and after the arrival lie the same distance apart, nothing
        else was published on either side between them (or as much on both); the arrival's
        egress is then the one at that distance, found by its number, not by time.
        Time only checks it: within the window, and near the link's latency."""
        decided = self._decided.get(key)
        if not decided:
            return None
        number = self.ledger.number
        arrival_number = number(arrivals[position][2])
        if arrival_number is None:
            return None
        distances: set[int] = set()
        bounds = [-1, len(egresses)]
        for side, anchor_at in enumerate(_decided_beside(decided, arrivals, position)):
            if anchor_at is None:
                continue
            anchor_egress = decided[arrivals[anchor_at]]
            distance = self._distance(arrivals[anchor_at], anchor_egress)
            if distance is None:
                return None
            distances.add(distance)
            bounds[side] = bisect_left(egresses, anchor_egress)
        if len(distances) != 1:
            return None  # none decided near, or something else was published between
        wanted = arrival_number - distances.pop()
        # Between the decided pairs' egresses (never crossing them): at most MAX_WALK.
        first = max(bounds[0] + 1, bounds[1] - MAX_WALK) if bounds[0] < 0 else bounds[0] + 1
        for at in range(first, min(bounds[1], first + MAX_WALK)):
            egress = egresses[at]
            if number(egress[2]) == wanted:
                arrival = arrivals[position]
                if not egress[0] - self.skew_ns <= arrival[0] <= egress[0] + self.latency_ns:
                    return None
                if bounds[0] < 0 or bounds[1] >= len(egresses):
                    # One side only: something published after the decided pair would move
                    # the distance by one message unseen; then the egress found is a
                    # neighbour's, a message's spacing off the link's latency.
                    estimate = self._local_estimate(key, arrivals, position)
                    if estimate is None or abs(arrival[0] - egress[0] - estimate[0]) > estimate[1]:
                        return None
                return egress
        return None

    def _local_estimate(self, key: Any, arrivals: Sequence[Any], position: int) -> tuple[int, int] | None:
        """(latency, tolerance) from the key's own decided pairs nearest to
        `arrivals[position]` (a link's latency drifts: the near ones say most)."""
        decided = self._decided.get(key) or {}
        found: list[int] = []
        for step, limit in ((-1, max(position - MAX_WALK, -1)), (1, min(position + MAX_WALK, len(arrivals)))):
            taken = 0
            for other in range(position + step, limit, step):
                egress = decided.get(arrivals[other])
                if egress is not None:
                    found.append(arrivals[other][0] - egress[0])
                    taken += 1
                    if taken == _LOCAL_SAMPLES:
                        break
        return estimate_latency(found) if len(found) >= _LOCAL_MIN else None

    def _distance_holds(self, key: Any, egresses: Sequence[Any], arrivals: Sequence[Any], position: int,
                        at: int, latency_ns: int, tolerance_ns: int) -> bool:
        """`egresses[at]` as the egress of `arrivals[position]` keeps the distance between
        report numbers of the nearest decided pair on each side (within `MAX_WALK`), or an
        adjacent arrival confirms the new distance: its egress at that distance is seen and
        within the tolerance of the latency too. (Something published between two messages
        moves the distance for every message after it; a spike taking a neighbour's egress
        moves it for one.)"""
        decided = self._decided.get(key)
        if not decided:
            return True
        distance = self._distance(arrivals[position], egresses[at])
        if distance is None:
            return True  # not numbered (a report not kept): time alone
        if all(anchor_at is None or self._distance(arrivals[anchor_at], decided[arrivals[anchor_at]]) == distance
               for anchor_at in _decided_beside(decided, arrivals, position)):
            return True
        number = self.ledger.number
        for neighbour in (position - 1, position + 1):
            if not 0 <= neighbour < len(arrivals):
                continue
            neighbour_number = number(arrivals[neighbour][2])
            if neighbour_number is None:
                continue
            wanted = neighbour_number - distance
            for other in range(max(0, at - _CONFIRM), min(len(egresses), at + _CONFIRM + 1)):
                if other != at and number(egresses[other][2]) == wanted:
                    if abs(arrivals[neighbour][0] - egresses[other][0] - latency_ns) <= tolerance_ns:
                        return True
                    break
        return False

    def _between_decided(self, key: Any, egresses: Sequence[Any], arrivals: Sequence[Any], position: int,
                         at: int) -> bool:
        """`egresses[at]` lies after the egress of the nearest decided arrival before
        `arrivals[position]` and before that of the nearest decided one after it."""
        decided = self._decided.get(key)
        if not decided:
            return True
        for step, anchor_at in zip((-1, 1), _decided_beside(decided, arrivals, position), strict=True):
            if anchor_at is not None and (bisect_left(egresses, decided[arrivals[anchor_at]]) - at) * step <= 0:
                return False
        return True

    def _distance(self, arrival: Any, egress: Any) -> int | None:
        """How far apart the two reports' numbers lie (`_by_numbers`), if both are numbered."""
        arrival_number, egress_number = self.ledger.number(arrival[2]), self.ledger.number(egress[2])
        return None if arrival_number is None or egress_number is None else arrival_number - egress_number

    def _nothing_lost_around(self, entries: Sequence[Any], at: int) -> bool:
        return 0 < at < len(entries) - 1 and self.ledger.complete(entries[at - 1][2], entries[at + 1][2])


def _decided_beside(decided: dict[Any, Any], arrivals: Sequence[Any], position: int) -> tuple[int | None, int | None]:
    """The positions of the nearest decided arrivals before and after `arrivals[position]`
    (each None when there is none within `MAX_WALK`)."""
    before = next((other for other in range(position - 1, max(position - MAX_WALK, -1), -1)
                   if arrivals[other] in decided), None)
    after = next((other for other in range(position + 1, min(position + MAX_WALK, len(arrivals)))
                  if arrivals[other] in decided), None)
    return before, after


def _far_apart(entries: Sequence[Any], at: int, gap_ns: int) -> bool:
    """The entries before and after `entries[at]` (if any) are at least `gap_ns` from it."""
    ts = entries[at][0]
    return ((at == 0 or ts - entries[at - 1][0] >= gap_ns)
            and (at == len(entries) - 1 or entries[at + 1][0] - ts >= gap_ns))
