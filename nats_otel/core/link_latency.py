"""The latency of each link (upstream server, downstream server: wire time plus the two
servers' clock offset), learned from the hops matched on it; bridges share it with their
evidence (`evidence`). No link is decided by it any more (issue 36: the latency rule went)."""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from collections.abc import Iterable, Sequence
from statistics import median
from typing import Any

__all__ = ["LATENCY_SAMPLES", "LinkLatency", "estimate_latency", "in_window"]

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
