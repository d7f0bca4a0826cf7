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

from bisect import bisect_left, bisect_right, insort
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from statistics import median
from typing import Any

__all__ = ["MAX_WALK", "HopSequences", "LinkLatency", "ReportLedger", "latency_from_times", "report_runs"]

# An arrival is matched by order from an anchor at most this many arrivals back; further
# (a key resolved far out of order) time decides. Bounds the work of one decision.
MAX_WALK = 64
# The learned tolerance around the link's latency: at least this (ns), at most the cap.
_TOLERANCE_FLOOR_NS = 50_000
_TOLERANCE_CAP_NS = 5_000_000
# How many recent latencies of one link are kept to learn from, and how many are needed.
_LATENCY_SAMPLES = 64
_LATENCY_MIN_SAMPLES = 3

MATCHED, AMBIGUOUS = "matched", "ambiguous"


class _ServerRuns:
    """The seqs seen from one server as runs of consecutive numbers, sorted: parallel lists
    of each run's first and last seq, its earliest report time and when it was last
    extended (`now`, for expiry)."""

    __slots__ = ("firsts", "lasts", "since_ns", "touched")

    def __init__(self) -> None:
        self.firsts: list[int] = []
        self.lasts: list[int] = []
        self.since_ns: list[int] = []
        self.touched: list[float] = []

    def add(self, seq: int, ts_ns: int, now: float) -> None:
        firsts, lasts = self.firsts, self.lasts
        at = bisect_right(firsts, seq) - 1  # the run starting at or before seq
        if at >= 0 and seq <= lasts[at]:
            return  # seen (a redelivery)
        joins_left = at >= 0 and lasts[at] == seq - 1
        joins_right = at + 1 < len(firsts) and firsts[at + 1] == seq + 1
        if joins_left and joins_right:
            lasts[at] = lasts[at + 1]
            self.since_ns[at] = min(self.since_ns[at], self.since_ns[at + 1], ts_ns)
            self.touched[at] = now
            for column in (firsts, lasts, self.since_ns, self.touched):
                del column[at + 1]
        elif joins_left:
            lasts[at] = seq
            self.since_ns[at] = min(self.since_ns[at], ts_ns)
            self.touched[at] = now
        elif joins_right:
            firsts[at + 1] = seq
            self.since_ns[at + 1] = min(self.since_ns[at + 1], ts_ns)
            self.touched[at + 1] = now
        else:
            firsts.insert(at + 1, seq)
            lasts.insert(at + 1, seq)
            self.since_ns.insert(at + 1, ts_ns)
            self.touched.insert(at + 1, now)

    def run_of(self, seq: int) -> int:
        """Index of the run holding `seq`, or -1."""
        at = bisect_right(self.firsts, seq) - 1
        return at if at >= 0 and seq <= self.lasts[at] else -1

    def expire(self, horizon: float) -> None:
        keep = [i for i, touched in enumerate(self.touched) if touched >= horizon]
        if len(keep) != len(self.touched):
            for name in self.__slots__:
                column = getattr(self, name)
                setattr(self, name, [column[i] for i in keep])


class ReportLedger:
    """Which reports of each server were observed (`server.seq`), and which report an
    identity is: says whether a stretch of one server's reports is complete."""

    __slots__ = ("_bounded", "_fifo", "_fixed", "_reports", "_servers", "capacity", "retention_s")

    def __init__(self, capacity: int, retention_s: float, bounded: bool = True) -> None:
        self.capacity, self.retention_s, self._bounded = capacity, retention_s, bounded
        self._servers: dict[str, _ServerRuns] = {}
        # identity -> (server id, seq, account): what an Egress's or Arrival's `ident` is.
        self._reports: dict[bytes, tuple[str, int, str]] = {}
        self._fifo: deque[tuple[float, bytes]] = deque()
        self._fixed = False

    def use_runs(self, runs: dict[str, Sequence[tuple[int, int, int]]]) -> None:
        """Take every server's runs as given (`report_runs` of a whole input), for a part of
        that input (the backfill converts one trace context at a time): then only the
        identities of the reports observed here are recorded."""
        self._fixed = True
        self._servers = {}
        for server_id, server_runs in runs.items():
            into = self._servers[server_id] = _ServerRuns()
            for first, last, since_ns in sorted(server_runs):
                into.firsts.append(first)
                into.lasts.append(last)
                into.since_ns.append(since_ns)
                into.touched.append(0.0)

    def runs(self) -> dict[str, tuple[tuple[int, int, int], ...]]:
        """Every server's runs: (first seq, last seq, earliest report time)."""
        return {server_id: tuple(zip(runs.firsts, runs.lasts, runs.since_ns, strict=True))
                for server_id, runs in sorted(self._servers.items())}

    def __len__(self) -> int:
        return len(self._reports)

    def observe(self, ident: bytes, server_id: str, seq: int, ts_ns: int, now: float = 0.0,
                account: str = "") -> None:
        """One report seen (any report: with hop evidence or not). seq 0: not numbered, ignored.
        `account`: the account it came in on (pooled routes carry one account per connection)."""
        if seq <= 0 or ident in self._reports:
            return
        self._reports[ident] = (server_id, seq, account)
        if self._fixed:
            return
        runs = self._servers.get(server_id)
        if runs is None:
            runs = self._servers[server_id] = _ServerRuns()
        runs.add(seq, ts_ns, now)
        if self._bounded:
            self._fifo.append((now, ident))

    def expire(self, now: float) -> None:
        horizon = now - self.retention_s
        fifo, reports = self._fifo, self._reports
        expired = False
        while fifo and (fifo[0][0] < horizon or len(fifo) > self.capacity):
            reports.pop(fifo.popleft()[1], None)
            expired = True
        if expired:
            for server_id in list(self._servers):
                runs = self._servers[server_id]
                runs.expire(horizon)
                if not runs.firsts:
                    del self._servers[server_id]

    def account(self, ident: bytes) -> str | None:
        """The account a report came in on, if it was observed."""
        found = self._reports.get(ident)
        return None if found is None else found[2]

    def complete(self, first: bytes, last: bytes, since_ns: int | None = None) -> bool:
        """True when `first` and `last` are reports of one server with every report between
        them seen, and (with `since_ns`) every report of that server since then too."""
        a, b = self._reports.get(first), self._reports.get(last)
        if a is None or b is None or a[0] != b[0]:
            return False
        runs = self._servers.get(a[0])
        if runs is None:
            return False
        at = runs.run_of(min(a[1], b[1]))
        if at < 0 or runs.lasts[at] < max(a[1], b[1]):
            return False
        return since_ns is None or runs.since_ns[at] <= since_ns


def report_runs(reports: Iterable[tuple[str, int, int]]) -> dict[str, tuple[tuple[int, int, int], ...]]:
    """The runs of a whole input's reports, given as (server id, seq, report time): what
    `ReportLedger.use_runs` takes (the backfill works them out over all contexts at once)."""
    ledger = ReportLedger(capacity=0, retention_s=0.0, bounded=False)
    for number, (server_id, seq, ts_ns) in enumerate(reports):
        ledger.observe(number.to_bytes(8, "big"), server_id, seq, ts_ns)
    return ledger.runs()


class LinkLatency:
    """The latency of each link (upstream server name, downstream server name), learned from
    the hops matched on it: its recent median, and a tolerance from their spread."""

    __slots__ = ("_estimates", "_samples")

    def __init__(self) -> None:
        self._samples: dict[tuple[str, str], deque[int]] = {}
        self._estimates: dict[tuple[str, str], tuple[int, int] | None] = {}

    def learn(self, link: tuple[str, str], latency_ns: int) -> None:
        samples = self._samples.get(link)
        if samples is None:
            if len(self._samples) >= 4096:  # links are pairs of servers: a hostile input's bound
                return
            samples = self._samples[link] = deque(maxlen=_LATENCY_SAMPLES)
        samples.append(latency_ns)
        self._estimates.pop(link, None)

    def learn_many(self, link: tuple[str, str], latencies: Iterable[int]) -> None:
        for latency_ns in latencies:
            self.learn(link, latency_ns)

    def known(self) -> list[tuple[str, str, int, int]]:
        """(upstream, downstream, latency, tolerance) of every link learned here: what a bridge
        shares with the others, so that one that (re)starts need not learn it again."""
        found = []
        for link in list(self._samples):
            estimate = self.estimate(link)
            if estimate is not None:
                found.append((link[0], link[1], *estimate))
        return found

    def adopt(self, link: tuple[str, str], latency_ns: int, tolerance_ns: int) -> None:
        """Another bridge's estimate, for a link this one has not learned yet."""
        if link in self._samples or len(self._estimates) >= 4096:
            return
        tolerance_ns = min(max(tolerance_ns, _TOLERANCE_FLOOR_NS), _TOLERANCE_CAP_NS)
        self._estimates[link] = (latency_ns, tolerance_ns)

    def estimate(self, link: tuple[str, str]) -> tuple[int, int] | None:
        """(latency, tolerance) in ns, or None before enough was learned."""
        if link in self._estimates:
            return self._estimates[link]
        samples = self._samples.get(link)
        found = _estimate(samples) if samples is not None and len(samples) >= _LATENCY_MIN_SAMPLES else None
        self._estimates[link] = found
        return found


def _estimate(samples: Iterable[int]) -> tuple[int, int]:
    """(latency, tolerance) of some latencies: their median, and 4 standard deviations
    (1.4826 times the median absolute deviation, robust to outliers), bounded."""
    samples = list(samples)
    center = int(median(samples))
    spread = median(abs(sample - center) for sample in samples)
    return center, int(min(max(4 * 1.4826 * spread, _TOLERANCE_FLOOR_NS), _TOLERANCE_CAP_NS))


def _arrival_time(pair: tuple[Any, Any, bytes]) -> int:
    return pair[1][0]


def _in_window(entries: Sequence[Any], lo_ns: int, hi_ns: int) -> tuple[int, int]:
    return bisect_left(entries, (lo_ns,)), bisect_left(entries, (hi_ns + 1,))


# The latency seen in a crowded key's own times (`latency_from_times`): residuals (arrival
# minus egress) binned this finely, each arrival against at most this many egresses.
_BINS_NS = (20_000, 50_000, 100_000, 200_000, 500_000)
_NEAREST = 16
# At least this many pairs must agree: a few arrivals can agree on anything by chance.
_PEAK_MIN = 8
# Matched pairs kept per link to vouch for a cluster's start (`HopSequences._preceded`).
_LINK_PAIRS = 32


def latency_from_times(egresses: Sequence[Any], arrivals: Sequence[Any], latency_ns: int,
                       skew_ns: int) -> list[int] | None:
    """The latencies of the pairs that agree on one latency, when one stands out.

    Every arrival against its nearest earlier egresses: the true pairs share one latency
    (give or take the wire's jitter), the others spread by the publisher's uneven gaps. The
    densest latency wins only when it holds at least half the arrivals and twice any other
    peak: a strictly periodic batch (every shift alike) or a run tighter than the jitter
    (one smeared hump) gives None, and then time does not decide.
    """
    residuals: list[int] = []
    for arrival in arrivals:
        # The nearest egresses around it, mostly before (latency is mostly positive).
        lo, hi = _in_window(egresses, arrival[0] - latency_ns, arrival[0] + skew_ns)
        now_at = bisect_left(egresses, (arrival[0] + 1,))
        nearest = egresses[max(lo, now_at - _NEAREST * 3 // 4):min(hi, now_at + _NEAREST // 4)]
        residuals.extend(arrival[0] - egress[0] for egress in nearest)
    if len(arrivals) < _PEAK_MIN or not residuals:
        return None
    # The finest bins first: the wire's jitter decides how wide the true pairs' peak is.
    for bin_ns in _BINS_NS:
        counts: dict[int, int] = {}
        for residual in residuals:
            slot = residual // bin_ns
            counts[slot] = counts.get(slot, 0) + 1

        def score(slot: int, counts: dict[int, int] = counts) -> int:
            return counts.get(slot - 1, 0) + counts.get(slot, 0) + counts.get(slot + 1, 0)

        best = min(counts, key=lambda slot: (-score(slot), slot))
        rival = max((score(slot) for slot in counts if abs(slot - best) > 2), default=0)
        if score(best) >= max(_PEAK_MIN, len(arrivals) / 2) and score(best) >= 2 * rival:
            return sorted(r for r in residuals if abs(r // bin_ns - best) <= 1)
    return None


class HopSequences:
    """Decides the crowded hops (see the module's docstring); `linking`'s index calls it with
    a key's time-sorted egresses and arrivals when its window holds several candidates.

    `keys` lists every key held with its egresses and arrivals: the whole-input mode
    (`bounded` False) learns from all of them before its first decision."""

    __slots__ = ("_aligned", "_bounded", "_decided", "_key_latency", "_keys", "_link_pairs", "latency", "latency_ns",
                 "ledger", "skew_ns")

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
        lo, hi = _in_window(egresses, arrival[0] - self.latency_ns, arrival[0] + self.skew_ns)
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
            found = latency_from_times(egresses, arrivals, self.latency_ns, self.skew_ns)
            self._key_latency[key] = None if found is None else _estimate(found)
        # Order first, everywhere it holds; then time where reports were lost, between the
        # order's decisions (never crossing them); then order again from those.
        for by_time in (False, True):
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
        egress = self._by_order(key, egresses, arrivals, position)
        if egress is not None:
            if self._bounded:
                self.latency.learn((key[2], key[3]), arrival[0] - egress[0])
        elif by_time:
            egress = self._by_time(key, egresses, arrivals, position)
        if egress is not None:
            self._decided.setdefault(key, {})[arrival] = egress
            self._mark(key, egress, arrival)
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
            lo, _ = _in_window(egresses, anchor[0] - self.latency_ns, anchor[0] + self.skew_ns)
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
        if since_up is not None and self._preceded(key, anchor_egress, anchor):
            since_up = since_down = None  # an earlier pair on the link vouches for the start
        if not (ledger.complete(anchor[2], arrival[2], since_down)
                and ledger.complete(anchor_egress[2], egress[2], since_up)):
            return None
        return egress

    def _by_time(self, key: Any, egresses: Sequence[Any], arrivals: Sequence[Any], position: int) -> Any:
        arrival = arrivals[position]
        link = (key[2], key[3])
        estimate = self._estimate(key)
        if estimate is None and self._bounded:
            # Nothing learned on this link yet: what the key's recent times agree on, if any.
            recent = arrivals[max(0, position - _NEAREST):position + _NEAREST]
            lo, hi = _in_window(egresses, recent[0][0] - self.latency_ns, recent[-1][0] + self.skew_ns)
            found = latency_from_times(egresses[lo:hi], recent, self.latency_ns, self.skew_ns)
            if found:
                self.latency.learn_many(link, found[-_LATENCY_SAMPLES:])
                estimate = self.latency.estimate(link)
        if estimate is None:
            return None
        latency_ns, tolerance_ns = estimate
        # One egress where expected, and none other within three times as far: the wire's
        # delays have long tails, and a true egress far out must not leave a neighbour taken.
        expected = arrival[0] - latency_ns
        lo, hi = _in_window(egresses, expected - 3 * tolerance_ns, expected + 3 * tolerance_ns)
        if hi - lo != 1 or abs(egresses[lo][0] - expected) > tolerance_ns:
            return None
        egress = egresses[lo]
        back_lo, back_hi = _in_window(arrivals, egress[0] + latency_ns - 3 * tolerance_ns,
                                      egress[0] + latency_ns + 3 * tolerance_ns)
        if back_hi - back_lo != 1 or arrivals[back_lo] != arrival:
            return None
        # Never crossing what was decided: per connection, the order holds.
        if not self._between_decided(key, egresses, arrivals, position, lo):
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

    def _between_decided(self, key: Any, egresses: Sequence[Any], arrivals: Sequence[Any], position: int,
                         at: int) -> bool:
        """`egresses[at]` lies after the egress of the nearest decided arrival before
        `arrivals[position]` and before that of the nearest decided one after it."""
        decided = self._decided.get(key)
        if not decided:
            return True
        for step, limit in ((-1, max(position - MAX_WALK, -1)), (1, min(position + MAX_WALK, len(arrivals)))):
            for other in range(position + step, limit, step):
                egress = decided.get(arrivals[other])
                if egress is not None:
                    other_at = bisect_left(egresses, egress)
                    if (other_at - at) * step <= 0:
                        return False
                    break
        return True

    def _nothing_lost_around(self, entries: Sequence[Any], at: int) -> bool:
        return 0 < at < len(entries) - 1 and self.ledger.complete(entries[at - 1][2], entries[at + 1][2])


def _far_apart(entries: Sequence[Any], at: int, gap_ns: int) -> bool:
    """The entries before and after `entries[at]` (if any) are at least `gap_ns` from it."""
    ts = entries[at][0]
    return ((at == 0 or ts - entries[at - 1][0] >= gap_ns)
            and (at == len(entries) - 1 or entries[at + 1][0] - ts >= gap_ns))
