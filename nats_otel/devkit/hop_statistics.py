"""What a matcher has to work with on each paired connection of a `hop_truth.Truth`: its
latency, jitter and spacing as quantiles (bench/hop_links.py prints them; docs/hop-links.md)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from nats_otel.devkit.hop_truth import LinkId, Truth

__all__ = ["QUANTILES", "LinkStatistics", "link_statistics"]


@dataclass(frozen=True, slots=True)
class LinkStatistics:
    """One connection's latency and spacing, in nanoseconds, as quantiles (`QUANTILES`)."""

    link: LinkId
    messages: int
    latency: tuple[int, ...]
    #: |latency(k+1) - latency(k)|: how fast the latency moves from one message to the next.
    latency_step: tuple[int, ...]
    #: egress(k+1) - egress(k): how close together the messages left.
    spacing: tuple[int, ...]
    #: The same, only between consecutive messages of one trace context (a batch): the
    #: spacing that order alone must resolve. Empty when no two consecutive ones share one.
    same_context_spacing: tuple[int, ...]
    #: arrival(k+1) - arrival(k): how the downstream server took them in (when it takes
    #: longer per message than they left apart, the latency ramps up through a run).
    arrival_spacing: tuple[int, ...]
    #: How many later egresses had left before the k-th message arrived (messages in flight).
    in_flight: tuple[int, ...]


#: p0, p1, p10, p50, p90, p99, p100.
QUANTILES = (0.0, 0.01, 0.1, 0.5, 0.9, 0.99, 1.0)


def _quantiles(values: list[int]) -> tuple[int, ...]:
    if not values:
        return ()
    ordered = sorted(values)
    return tuple(ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] for q in QUANTILES)


def link_statistics(truth: Truth) -> list[LinkStatistics]:
    """Per paired connection: what an order-based matcher has to tune to (latency, jitter, spacing)."""
    out = []
    for link, hops in sorted(truth.links().items()):
        latencies = [h.latency_ns for h in hops]
        egresses = [h.egress_ts_ns for h in hops]
        steps = [abs(b - a) for a, b in itertools.pairwise(latencies)]
        spacing = [b - a for a, b in itertools.pairwise(egresses)]
        arrival_spacing = [b.arrival_ts_ns - a.arrival_ts_ns for a, b in itertools.pairwise(hops)]
        same_context = [b.egress_ts_ns - a.egress_ts_ns for a, b in itertools.pairwise(hops) if a.context == b.context]
        in_flight = []
        ahead = 0
        for k, hop in enumerate(hops):
            ahead = max(ahead, k)
            while ahead + 1 < len(hops) and egresses[ahead + 1] <= hop.arrival_ts_ns:
                ahead += 1
            in_flight.append(ahead - k)
        out.append(LinkStatistics(link, len(hops), _quantiles(latencies), _quantiles(steps), _quantiles(spacing),
                                  _quantiles(same_context), _quantiles(arrival_spacing), _quantiles(in_flight)))
    return out
