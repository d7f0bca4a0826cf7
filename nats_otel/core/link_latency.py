"""The latency of each link (upstream server, downstream server: wire time plus the two
servers' clock offset), learned from the hops matched on it or from what a crowded key's own
times agree on (`sequences` matches by time with it where reports were lost)."""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from statistics import median
from typing import Any

__all__ = ["LATENCY_SAMPLES", "LinkLatency", "estimate_latency", "in_window", "latency_from_numbers",
           "latency_from_times"]

# The learned tolerance around the link's latency: at least this (ns), at most the cap.
_TOLERANCE_FLOOR_NS = 50_000
_TOLERANCE_CAP_NS = 5_000_000
# How many recent latencies of one link are kept to learn from, and how many are needed.
LATENCY_SAMPLES = 64
_LATENCY_MIN_SAMPLES = 3


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
            samples = self._samples[link] = deque(maxlen=LATENCY_SAMPLES)
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
        if samples is None:
            return None  # not cached: links asked about but never learned must not pile up
        found = estimate_latency(samples) if len(samples) >= _LATENCY_MIN_SAMPLES else None
        self._estimates[link] = found
        return found


def estimate_latency(samples: Iterable[int]) -> tuple[int, int]:
    """(latency, tolerance) of some latencies: their median, and 4 standard deviations
    (1.4826 times the median absolute deviation, robust to outliers), bounded."""
    samples = list(samples)
    center = int(median(samples))
    spread = median(abs(sample - center) for sample in samples)
    return center, int(min(max(4 * 1.4826 * spread, _TOLERANCE_FLOOR_NS), _TOLERANCE_CAP_NS))


def in_window(entries: Sequence[Any], lo_ns: int, hi_ns: int) -> tuple[int, int]:
    """(start, end) of the time-sorted entries with lo_ns <= ts_ns <= hi_ns."""
    return bisect_left(entries, (lo_ns,)), bisect_left(entries, (hi_ns + 1,))


# The latency seen in a crowded key's own times (`latency_from_times`): residuals (arrival
# minus egress) binned this finely, each arrival against at most this many egresses.
_BINS_NS = (20_000, 50_000, 100_000, 200_000, 500_000)
_NEAREST = 16
# At least this many pairs must agree: a few arrivals can agree on anything by chance.
_PEAK_MIN = 8


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
        lo, hi = in_window(egresses, arrival[0] - latency_ns, arrival[0] + skew_ns)
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


# `latency_from_numbers`: the smoothest distance must be this many times smoother than any
# rival, over at least this many steps between adjacent messages kept on both sides (about
# two thirds of a batch of 100 with a tenth of the reports lost). Measured on generated
# batches of 100 (tests/core/test_sequences.py's `batch`: strictly periodic to jittery
# publishers and wires, 10% and 30% lost, 12,000 in all): with 40 steps none picked a wrong
# distance; with 8, eight in 4,000 did, all with 30% lost (a far shift smoother by chance).
# On real batches the true distance stood out by 1.78x and more.
_SMOOTHER = 1.75
_STEPS_MIN = 40


def latency_from_numbers(egresses: Sequence[Any], arrivals: Sequence[Any], number: Callable[[bytes], int | None],
                         latency_ns: int, skew_ns: int) -> list[int] | None:
    """The latencies of the pairs one distance between report numbers gives, when that
    distance is clearly the one of the true pairs; else None.

    Each server numbers what it publishes, one report per message, so while neither
    publishes anything else the two reports of one message lie a fixed distance apart
    (`number(arrival) - number(egress)`), and a pairing shifted by k messages is the
    distance plus k. Along the true distance, the latencies of adjacent messages differ
    by the wire's jitter; along a shifted one, also by the publisher's uneven gaps between
    messages. The distance whose adjacent latencies step least wins, when it does so
    `_SMOOTHER` times less than any rival: a strictly periodic publisher (every shift
    alike) or one sending faster than the jitter gives None, and time does not decide.
    """
    # distance -> {arrival number: latency}: each arrival against its nearest egresses.
    pairs: dict[int, dict[int, int]] = {}
    for arrival in arrivals:
        arrival_number = number(arrival[2])
        if arrival_number is None:
            continue
        lo, hi = in_window(egresses, arrival[0] - latency_ns, arrival[0] + skew_ns)
        now_at = bisect_left(egresses, (arrival[0] + 1,))
        for egress in egresses[max(lo, now_at - _NEAREST * 3 // 4):min(hi, now_at + _NEAREST // 4)]:
            egress_number = number(egress[2])
            if egress_number is not None:
                pairs.setdefault(arrival_number - egress_number, {})[arrival_number] = arrival[0] - egress[0]
    scores: list[tuple[int, int, int]] = []
    for distance, latencies in pairs.items():
        steps = [abs(latency - latencies[at - 1]) for at, latency in latencies.items() if at - 1 in latencies]
        if len(steps) >= _PEAK_MIN:
            scores.append((int(median(steps)), distance, len(steps)))
    if not scores:
        return None
    scores.sort()
    best, distance, steps_seen = scores[0]
    if steps_seen < _STEPS_MIN:
        return None  # too few adjacent messages kept on both sides for the medians to say
    support = len(pairs[distance])
    # Rivals are the other alignments of the key: distances pairing at least half as many
    # arrivals (a fragment of a few pairs at the window's edge explains nothing).
    rival = next((score for score, other, _ in scores[1:] if 2 * len(pairs[other]) >= support), None)
    if rival is None or rival < _SMOOTHER * max(best, 1) or support < max(_PEAK_MIN, len(arrivals) / 2):
        return None
    return sorted(pairs[distance].values())
