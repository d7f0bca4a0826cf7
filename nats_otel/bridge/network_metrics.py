"""The live network view in `/metrics`: latency of every hop seen from both sides, time in
each server, failures per server and per edge (docs/metrics.md).

Fed once per batch with the `NetworkSample`s the core worked out (`core/network.py`), so the
per-message cost is a dict look-up and a bisect, not a `prometheus_client` call. Exposed by a
custom collector at scrape time. Label sets are bounded: server names (and edge kinds) by
default, accounts and subjects only when asked (`telemetry.network_labels`), and at most
`telemetry.network_max_series` label sets per metric; samples past that go to one series
whose labels are all `_other`, counted in `nats_otel_network_series_overflow_total`.

Exemplars: each bucket of the two latency histograms keeps the last sample counted into it
(a reference, no copy), and a scrape in the OpenMetrics format shows it as the bucket's
exemplar: its trace id and server span id (`trace_id`, `span_id`), its latency. The span id
is hashed and the ids made hex only then, for the few samples still held.
"""

from __future__ import annotations

import logging
import threading
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, Exemplar, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from nats_otel.core import accel
from nats_otel.core.network import NetworkSample

__all__ = ["HOP_LATENCY_BUCKETS", "SERVER_LATENCY_BUCKETS", "NetworkMetrics", "PythonNetworkMetrics"]

# Seconds. Hops: loopback and LAN links (100 us - 5 ms) to WAN gateways (up to the linking
# window, `link.max_hop_latency`, 0.5 s by default: no hop is matched above it).
HOP_LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5)
# Time in a server: microseconds for a plain delivery, more for JetStream stores.
SERVER_LATENCY_BUCKETS = (0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                          0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
OTHER = "_other"

log = logging.getLogger("nats_otel.bridge")


class _Family:
    """Series of one metric by label values, with the bound on how many."""

    __slots__ = ("label_names", "max_series", "overflowed", "series")

    def __init__(self, label_names: Sequence[str], max_series: int) -> None:
        self.label_names = list(label_names)
        self.max_series = max_series
        self.overflowed = 0
        self.series: dict[tuple[str, ...], list[int]] = {}

    def resolve(self, labels: tuple[str, ...]) -> tuple[str, ...]:
        """`labels`, or the `_other` labels (counted) for a new label set past the bound."""
        if labels in self.series or len(self.series) < self.max_series:
            return labels
        self.overflowed += 1
        return (OTHER,) * len(labels)

    def row(self, labels: tuple[str, ...], width: int) -> list[int]:
        labels = self.resolve(labels)
        row = self.series.get(labels)
        if row is None:
            row = self.series[labels] = [0] * width
        return row


def _count(row: list[int], exemplars: list[NetworkSample | None], bounds_ns: list[int], value_ns: int,
           sample: NetworkSample) -> None:
    """One sample into a histogram row (`_Histogram`): its bucket, the first whose `le`
    holds it, and the sum; the sample becomes that bucket's exemplar."""
    at = bisect_left(bounds_ns, value_ns)
    row[at] += 1
    row[-1] += value_ns
    exemplars[at] = sample


class _Histogram(_Family):
    """Bucket counts (not cumulative) then the +Inf bucket, then the sum, in nanoseconds:
    integers, so the sum is exact whatever the order of the samples. Beside each row, the
    last sample of each bucket (None before the first), and `value_of` reads its value."""

    __slots__ = ("bounds_ns", "bounds_s", "exemplars", "value_of")

    def __init__(self, label_names: Sequence[str], bounds_s: Sequence[float], max_series: int,
                 value_of: Callable[[NetworkSample], int]) -> None:
        super().__init__(label_names, max_series)
        self.bounds_s = list(bounds_s)
        self.bounds_ns = [round(b * 1e9) for b in bounds_s]
        self.exemplars: dict[tuple[str, ...], list[NetworkSample | None]] = {}
        self.value_of = value_of

    def histogram_row(self, labels: tuple[str, ...]) -> tuple[list[int], list[NetworkSample | None]]:
        """The row of a label set (as `row`), as wide as this histogram's layout, and its
        buckets' exemplars."""
        labels = self.resolve(labels)
        row = self.series.get(labels)
        if row is None:
            row = self.series[labels] = [0] * (len(self.bounds_ns) + 2)
            self.exemplars[labels] = [None] * (len(self.bounds_ns) + 1)
        return row, self.exemplars[labels]

    def copy(self) -> list[tuple[tuple[str, ...], list[int], list[NetworkSample | None]]]:
        """Each series' labels, counts and exemplars as they are now (for `family`)."""
        return [(labels, row[:], self.exemplars[labels][:]) for labels, row in self.series.items()]

    def family(self, name: str, documentation: str,
               rows: list[tuple[tuple[str, ...], list[int], list[NetworkSample | None]]]) -> HistogramMetricFamily:
        """The histogram of `rows` (a `copy`), each bucket with its exemplar."""
        metric = HistogramMetricFamily(name, documentation, labels=self.label_names)
        bucket_bounds = [*self.bounds_s, float("inf")]
        for labels, row, exemplars in rows:
            cumulative, buckets = 0, []
            for bound, count, sample in zip(bucket_bounds, row[:-1], exemplars, strict=True):
                cumulative += count
                exemplar = self._exemplar(sample)
                buckets.append((_le(bound), cumulative) if exemplar is None else (_le(bound), cumulative, exemplar))
            metric.add_metric(list(labels), buckets, row[-1] / 1e9)
        return metric

    def _exemplar(self, sample: NetworkSample | None) -> Exemplar | None:
        # Only in the OpenMetrics format: prometheus_client leaves them out of the classic one.
        if sample is None or not sample.trace_id:
            return None
        return Exemplar({"trace_id": sample.trace_id.hex(), "span_id": sample.span_id.hex()},
                        self.value_of(sample) / 1e9)


class _Counter(_Family):
    __slots__ = ()

    def inc(self, labels: tuple[str, ...], amount: int = 1) -> None:
        self.row(labels, 1)[0] += amount

    def family(self, name: str, documentation: str) -> CounterMetricFamily:
        metric = CounterMetricFamily(name, documentation, labels=self.label_names)
        for labels, row in list(self.series.items()):
            metric.add_metric(list(labels), row[0])
        return metric


_Rows = tuple[list[int], list[int], list[NetworkSample | None]]


def _in_server_ns(sample: NetworkSample) -> int:
    return sample.in_server_ns


def _hop_latency_ns(sample: NetworkSample) -> int:
    return sample.hop.latency_ns if sample.hop is not None else 0


def _no_compiled(samples: list[NetworkSample], start: int, *rows: object) -> int:
    """No compiled counting: the Python loop counts every sample."""
    return start


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(bound)


def _compiled_record_known() -> Callable[..., int] | None:
    compiled = accel.compiled("nats_otel.bridge._network_metrics")
    return None if compiled is None else compiled.record_known


class NetworkMetrics(Collector):
    """Hop latency, server latency and failures, registered on the bridge's registry.

    `record` counts each batch's samples, in order (each bucket's exemplar is the last
    sample counted into it). The per-sample loop is Python (the reference); when built,
    `_network_metrics.record_known` counts the samples whose rows were found before (the
    common case) in C, up to the first it does not take, which the loop counts before handing
    back. `PythonNetworkMetrics` runs the loop alone.
    """

    #: The compiled counting of known rows (`_network_metrics.record_known`), or None.
    _record_known = staticmethod(_compiled_record_known() or _no_compiled)

    def __init__(self, registry: CollectorRegistry, extra_labels: Sequence[str] = (),
                 max_series: int = 1000) -> None:
        self.extra_labels = tuple(extra_labels)  # of "account", "subject"
        extra = list(self.extra_labels)
        self._warned: set[str] = set()
        self._lock = threading.Lock()  # batches are recorded in the loop, scraped in the HTTP thread
        self.hop_latency = _Histogram(["from_server", "to_server", "kind", *extra], HOP_LATENCY_BUCKETS, max_series,
                                      _hop_latency_ns)
        self.server_latency = _Histogram(["server", *extra], SERVER_LATENCY_BUCKETS, max_series, _in_server_ns)
        self.server_errors = _Counter(["server", *extra], max_series)
        self.hop_errors = _Counter(["from_server", "to_server", "kind"], max_series)
        self.sides_expired = _Counter(["side"], 2)
        for side in ("upstream", "downstream"):
            self.sides_expired.inc((side,), 0)
        # The rows each label set counts into (latency histogram, error counter, the latency
        # buckets' exemplars), found once: per sample one dict look-up, not one per metric.
        # Only label sets with series of their own are kept (at most max_series each); those
        # past the bound go through `_Family.resolve` every time, which counts them as overflow.
        self._server_rows: dict[object, _Rows] = {}  # by server name (or labels)
        self._hop_rows: dict[tuple[str, ...], _Rows] = {}
        registry.register(self)

    def record(self, samples: Iterable[NetworkSample], expired_unmatched: dict[str, int] | None = None) -> None:
        """Account one batch's samples, and the hop sides the link index let go unmatched."""
        server_rows, hop_rows = self._server_rows, self._hop_rows
        server_bounds, hop_bounds = self.server_latency.bounds_ns, self.hop_latency.bounds_ns
        extra_labels = self.extra_labels
        with self._lock:
            known = self._record_known
            if extra_labels or known is _no_compiled:
                self._count_each(samples)
            else:  # rows keyed by server and edge alone: the compiled counting's case
                batch = samples if type(samples) is list else list(samples)
                at, end = 0, len(batch)
                while at < end:
                    at = known(batch, at, server_rows, hop_rows, server_bounds, hop_bounds)
                    if at < end:  # a sample it does not take (a new label set, a failed hop, odd values)
                        self._count_each(batch[at:at + 1])
                        at += 1
            for side, count in (expired_unmatched or {}).items():
                if count:
                    self.sides_expired.inc((side,), count)
            self._warn_overflow()

    def _count_each(self, samples: Iterable[NetworkSample]) -> None:
        """The reference: count each sample into its rows, found (and cached) on first sight."""
        server_rows, hop_rows = self._server_rows, self._hop_rows
        server_bounds, hop_bounds = self.server_latency.bounds_ns, self.hop_latency.bounds_ns
        extra_labels = self.extra_labels
        extra: tuple[str, ...] = ()
        for sample in samples:
            server, _, _, in_server_ns, failed, hop, failed_hops, _, _, _ = sample
            if extra_labels:
                extra = self._extra(sample)
                server_key: object = (server, *extra)
            else:
                server_key = server
            rows = server_rows.get(server_key)
            if rows is None:
                labels = (server, *extra)
                rows = self._rows(server_rows, server_key, labels, self.server_latency, self.server_errors, labels)
            latency, errors, exemplars = rows
            _count(latency, exemplars, server_bounds, in_server_ns, sample)
            # Error series exist (at 0) from the first sample on: rate() and alerts see them.
            errors[0] += failed
            if hop is not None:
                from_server, to_server, kind, hop_ns = hop
                edge = (from_server, to_server, kind)
                hop_key = (*edge, *extra) if extra_labels else edge
                rows = hop_rows.get(hop_key)
                if rows is None:
                    rows = self._rows(hop_rows, hop_key, hop_key, self.hop_latency, self.hop_errors, edge)
                _count(rows[0], rows[2], hop_bounds, hop_ns, sample)
            for to_server, kind in failed_hops:
                self.hop_errors.inc((server, to_server, kind))

    @staticmethod
    def _rows(cache: dict, key: object, labels: tuple[str, ...], latency: _Histogram, errors: _Counter,
              error_labels: tuple[str, ...]) -> _Rows:
        """The rows a label set counts into (`labels` for the histogram, `error_labels` for the
        errors), kept in `cache` under `key` while both are series of their own."""
        row, exemplars = latency.histogram_row(labels)
        rows = (row, errors.row(error_labels, 1), exemplars)
        if labels in latency.series and error_labels in errors.series:
            cache[key] = rows
        return rows

    def _warn_overflow(self) -> None:
        """Say once per metric that its label sets reached the bound (then only counted)."""
        for name, family in self._families():
            if family.overflowed and name not in self._warned:
                self._warned.add(name)
                log.warning("network metric at its label-set bound: further label sets counted as _other",
                            extra={"fields": {"metric": name, "max_series": family.max_series,
                                              "setting": "telemetry.network_max_series"}})

    def _families(self) -> tuple[tuple[str, _Family], ...]:
        return (("hop_latency", self.hop_latency), ("server_latency", self.server_latency),
                ("server_errors", self.server_errors), ("hop_errors", self.hop_errors))

    def _extra(self, sample: NetworkSample) -> tuple[str, ...]:
        return tuple(sample.account if name == "account" else sample.subject for name in self.extra_labels)

    def collect(self) -> Iterator[Metric]:
        # Copied under the lock, built and yielded after it: the exemplars' span ids are
        # hashed then, not while `record` waits in the event loop, and a consumer that stops
        # half-way (a failed scrape) must not leave the lock held.
        with self._lock:
            hops, servers = self.hop_latency.copy(), self.server_latency.copy()
            counters = self._counters()
        yield self.hop_latency.family(
            "nats_otel_hop_latency_seconds",
            "Hop latency: the downstream server's ingress time minus the upstream server's egress time, "
            "for every hop whose two trace messages the bridge matched (negative: clock skew)", hops)
        yield self.server_latency.family(
            "nats_otel_server_latency_seconds",
            "Time a server held a traced message: from its arrival to the server's last action on it", servers)
        yield from counters

    def _counters(self) -> list[Metric]:
        overflow = CounterMetricFamily(
            "nats_otel_network_series_overflow",
            "Samples counted under the _other series because a network metric reached "
            "telemetry.network_max_series label sets", labels=["metric"])
        for name, family in self._families():
            overflow.add_metric([name], family.overflowed)
        return [
            self.server_errors.family(
                "nats_otel_server_errors", "Trace messages on which a server reported a failure (span status ERROR)"),
            self.hop_errors.family(
                "nats_otel_hop_errors", "Forwards to another server (route, gateway, leafnode) that reported an error"),
            self.sides_expired.family(
                "nats_otel_hop_sides_expired_unmatched",
                "Hop sides forgotten without their counterpart: an upstream egress no downstream report "
                "matched, or a downstream arrival whose upstream egress was not seen (link.retention)"),
            overflow,
        ]


class PythonNetworkMetrics(NetworkMetrics):
    """`NetworkMetrics` with its Python loop alone: the reference (tests compare the two)."""

    _record_known = staticmethod(_no_compiled)
