"""The network metrics' bounds: label sets capped per metric, the rest counted under `_other`
and said once in the log; extra labels only when asked; each bucket's exemplar (the last
sample counted into it) in the OpenMetrics format only; the compiled counting of known rows
against the Python loop, and its refusal to import when the samples' fields change."""

from __future__ import annotations

import logging
import os
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from nats_otel.bridge.network_metrics import NetworkMetrics, PythonNetworkMetrics
from nats_otel.core.ids import server_span_id_of
from nats_otel.core.network import HopSample, NetworkSample


def sample(server: str, subject: str = "s", failed: bool = False) -> NetworkSample:
    return NetworkSample(server, "A", subject, 2_000, failed, HopSample("up", server, "router", 500_000))


def test_label_sets_past_the_bound_go_to_other_counted_and_logged_once(caplog):
    registry = CollectorRegistry()
    network = NetworkMetrics(registry, max_series=3)
    with caplog.at_level(logging.WARNING, logger="nats_otel.bridge"):
        network.record([sample(f"n{i}", failed=i == 9) for i in range(10)])
        network.record([sample("n99")])
    value = registry.get_sample_value
    servers = {s.labels["server"] for m in registry.collect() if m.name == "nats_otel_server_latency_seconds"
               for s in m.samples}
    assert servers == {"n0", "n1", "n2", "_other"}
    assert value("nats_otel_server_latency_seconds_count", {"server": "_other"}) == 8
    assert value("nats_otel_server_errors_total", {"server": "_other"}) == 1  # n9's failure is kept
    assert value("nats_otel_network_series_overflow_total", {"metric": "server_latency"}) == 8
    assert value("nats_otel_hop_latency_seconds_count",
                 {"from_server": "_other", "to_server": "_other", "kind": "_other"}) == 8
    warnings = [r for r in caplog.records if "label-set bound" in r.getMessage()]
    assert sorted(r.fields["metric"] for r in warnings) == ["hop_errors", "hop_latency", "server_errors",
                                                              "server_latency"]


def _exemplars(registry: CollectorRegistry, name: str) -> dict[tuple, tuple[str, str, float]]:
    """(series labels, le) -> (trace_id, span_id, value) of each bucket's exemplar, as a
    scraper reads them from the OpenMetrics format."""
    out = {}
    for family in text_string_to_metric_families(openmetrics.generate_latest(registry).decode()):
        for sample in family.samples:
            if sample.name == name + "_bucket" and sample.exemplar is not None:
                labels = tuple(sorted((k, v) for k, v in sample.labels.items() if k != "le"))
                ex = sample.exemplar
                out[labels, sample.labels["le"]] = (ex.labels["trace_id"], ex.labels["span_id"], ex.value)
    return out


@pytest.mark.parametrize("metrics_class", [NetworkMetrics, PythonNetworkMetrics])
def test_each_bucket_offers_its_last_sample_as_exemplar(metrics_class):
    registry = CollectorRegistry()
    network = metrics_class(registry)

    def traced(n: int, server: str, in_server_ns: int, hop_ns: int | None) -> NetworkSample:
        hop = None if hop_ns is None else HopSample("up", server, "leaf", hop_ns)
        return NetworkSample(server, "A", "s", in_server_ns, False, hop, (), bytes([n]) * 16, b"ctx", bytes([n]) * 9)

    def span(n: int) -> str:  # the server span's id, hashed from its inputs at the scrape
        return server_span_id_of(b"ctx", bytes([n]) * 9).hex()

    # Twice each (the second batch: rows found before, the compiled counting's case when built).
    network.record([traced(1, "n1", 3_000, 200_000), traced(2, "n1", 4_000, 300_000), traced(3, "n1", 900, None)])
    network.record([traced(4, "n1", 40_000, 700_000), traced(5, "n1", 8_000, 2_000_000),
                    NetworkSample("n1", "A", "s", 1_000_000, False, None)])  # no ids: counted, no exemplar
    hop_series = (("from_server", "up"), ("kind", "leaf"), ("to_server", "n1"))
    assert _exemplars(registry, "nats_otel_hop_latency_seconds") == {
        (hop_series, "0.00025"): ("01" * 16, span(1), 0.0002),
        (hop_series, "0.0005"): ("02" * 16, span(2), 0.0003),
        (hop_series, "0.001"): ("04" * 16, span(4), 0.0007),
        (hop_series, "0.0025"): ("05" * 16, span(5), 0.002),
    }
    server_series = (("server", "n1"),)
    assert _exemplars(registry, "nats_otel_server_latency_seconds") == {
        (server_series, "1e-05"): ("05" * 16, span(5), 8e-06),  # 3 us, then 4, 0.9 and 8 us: the last
        (server_series, "5e-05"): ("04" * 16, span(4), 4e-05),
    }
    # The classic text format has no exemplars (Prometheus asks for OpenMetrics to get them).
    assert b"trace_id" not in generate_latest(registry)
    assert registry.get_sample_value("nats_otel_server_latency_seconds_count", {"server": "n1"}) == 6


def test_subject_label_only_when_asked():
    plain, by_subject = CollectorRegistry(), CollectorRegistry()
    NetworkMetrics(plain).record([sample("n1", "orders.new")])
    NetworkMetrics(by_subject, extra_labels=["subject"]).record([sample("n1", "orders.new")])
    assert b"orders.new" not in generate_latest(plain)
    assert by_subject.get_sample_value("nats_otel_server_latency_seconds_count",
                                       {"server": "n1", "subject": "orders.new"}) == 1


def test_repeated_label_sets_count_every_sample_in_every_batch():
    """Each label set's rows are found once, then reused: counts, sums and buckets stay those
    of every sample, across batches, with extra labels, and past the bound."""
    rng = random.Random(7)
    registry = CollectorRegistry()
    network = NetworkMetrics(registry, extra_labels=["account"], max_series=4)
    expected_count: Counter[tuple[str, str]] = Counter()
    expected_sum: Counter[tuple[str, str]] = Counter()
    expected_errors: Counter[tuple[str, str]] = Counter()
    expected_hops: Counter[tuple[str, ...]] = Counter()
    expected_fast: Counter[tuple[str, str]] = Counter()  # at most 10 us in the server
    own: list[tuple[str, str]] = []  # server label sets in order of first sight: the first 4 own a series
    own_hops: list[tuple[str, ...]] = []
    for _ in range(6):
        batch = []
        for _ in range(50):
            server, account = rng.choice(["n1", "n2", "n3"]), rng.choice(["A", "B"])
            in_server_ns, failed = rng.choice([5_000, 20_000, 3_000_000]), rng.random() < 0.2
            hop = HopSample("up", server, "router", 400_000) if rng.random() < 0.5 else None
            batch.append(NetworkSample(server, account, "s", in_server_ns, failed, hop))
            labels = (server, account)
            if labels not in own and len(own) < 4:
                own.append(labels)
            key = labels if labels in own else ("_other", "_other")
            expected_count[key] += 1
            expected_sum[key] += in_server_ns
            expected_errors[key] += failed
            expected_fast[key] += in_server_ns <= 10_000
            if hop is not None:
                edge = ("up", server, "router", account)
                if edge not in own_hops and len(own_hops) < 4:
                    own_hops.append(edge)
                expected_hops[edge if edge in own_hops else ("_other",) * 4] += 1
        network.record(batch)
    value = registry.get_sample_value
    for key, count in expected_count.items():
        labels = {"server": key[0], "account": key[1]}
        assert value("nats_otel_server_latency_seconds_count", labels) == count
        assert value("nats_otel_server_latency_seconds_sum", labels) == pytest.approx(expected_sum[key] / 1e9)
        assert value("nats_otel_server_latency_seconds_bucket", labels | {"le": "1e-05"}) == expected_fast[key]
        assert value("nats_otel_server_errors_total", labels) == expected_errors[key]
    for (from_server, to_server, kind, account), count in expected_hops.items():
        assert value("nats_otel_hop_latency_seconds_count", {
            "from_server": from_server, "to_server": to_server, "kind": kind, "account": account}) == count
    assert value("nats_otel_network_series_overflow_total", {"metric": "server_latency"}) == \
        expected_count["_other", "_other"]


def _random_batches(rng: random.Random, batches: int) -> list[list[NetworkSample]]:
    """Batches of samples as the core makes them, and odd ones: repeated servers and edges
    (rows found before; more in a batch than the compiled counting keeps at once), failures,
    failed hops, clock skew, values and sums past 64 bits, ints that are not plain ints."""
    servers = [f"n{i}" for i in range(8)]
    out = []
    for _ in range(batches):
        batch = []
        for _ in range(rng.randrange(0, 60)):
            server = rng.choice(servers)
            in_server = rng.choice([rng.randrange(0, 2_000_000_000), 0, 10_000, 2**70, -5, 2**62 + 7])
            hop = None
            if rng.random() < 0.7:
                latency = rng.choice([rng.randrange(-1_000_000, 600_000_000), 100_000, 2**64, 2**62 + 3])
                hop = HopSample(rng.choice(servers), server, rng.choice(["router", "gateway", "leaf"]), latency)
            failed = rng.random() < 0.1
            failed_hops = (("n1", "router"),) if rng.random() < 0.05 else ()
            if rng.random() < 0.03:
                failed = 1  # truthy, not a bool
            ids = (rng.randbytes(16), rng.randbytes(56), rng.randbytes(30)) if rng.random() < 0.9 else ()
            batch.append(NetworkSample(server, rng.choice("AB"), rng.choice(["s1", "s2"]), in_server, failed, hop,
                                       failed_hops, *ids))
        out.append(batch)
    return out


@pytest.mark.parametrize(("extra", "max_series"), [((), 1000), ((), 5), (("account",), 6)])
def test_the_compiled_counting_counts_as_the_python_loop(extra, max_series):
    """`NetworkMetrics` (its known rows counted by `_network_metrics` when built) and
    `PythonNetworkMetrics` (the loop alone) expose the same metrics after the same batches,
    with the label-set bound reached or not; their exemplars too (the OpenMetrics format)."""
    compiled_registry, python_registry = CollectorRegistry(), CollectorRegistry()
    compiled = NetworkMetrics(compiled_registry, extra, max_series)
    python = PythonNetworkMetrics(python_registry, extra, max_series)
    for batch in _random_batches(random.Random(11), 80):
        compiled.record(batch, {"upstream": 1})
        python.record(iter(batch), {"upstream": 1})  # any iterable, not only a list
        assert generate_latest(compiled_registry) == generate_latest(python_registry)
        assert openmetrics.generate_latest(compiled_registry) == openmetrics.generate_latest(python_registry)
    assert compiled.server_latency.series and compiled.hop_latency.series
    assert b"trace_id" in openmetrics.generate_latest(compiled_registry)


def test_the_compiled_counting_is_used_when_built():
    from nats_otel.core import accel

    compiled = accel.compiled("nats_otel.bridge._network_metrics")
    assert (compiled is None) == accel.NO_EXTENSIONS, accel.refused()
    assert (NetworkMetrics._record_known is not PythonNetworkMetrics._record_known) == (compiled is not None)
    if compiled is not None:
        assert NetworkMetrics._record_known is compiled.record_known


# In a child process (this one keeps its samples): NetworkSample's fields changed before the
# compiled counting is imported.
_CHANGED_SAMPLE = """
from typing import NamedTuple

from nats_otel.core import network

class NetworkSample(NamedTuple):
    server: str
    subject: str

network.NetworkSample = NetworkSample
from nats_otel.bridge import network_metrics
from nats_otel.core import accel
print(network_metrics.NetworkMetrics._record_known is network_metrics._no_compiled)
print(accel.refused().get("nats_otel.bridge._network_metrics"))
"""


def test_the_compiled_counting_refuses_samples_laid_out_otherwise():
    from nats_otel.core import accel

    if accel.NO_EXTENSIONS:
        pytest.skip("NATS_OTEL_NO_EXTENSIONS is set: the compiled counting is not used in this run")
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", _CHANGED_SAMPLE], env=dict(os.environ), cwd=root,
                          capture_output=True, text=True, check=True)
    python_loop, why = done.stdout.splitlines()
    assert python_loop == "True"  # the Python loop counts every sample
    assert why.startswith("NetworkSample's fields are ('server', 'subject'): the compiled counting reads others")


def test_a_server_named_by_equal_strings_keeps_its_last_sample_as_exemplar():
    """The same server's name as two str objects in one batch (the parse's name cache may
    make either): one row, whose bucket's exemplar is the batch's last sample in it, as the
    Python loop has it."""
    def sample(name: str, seed: int) -> NetworkSample:
        rng = random.Random(seed)
        hop = HopSample("up", name, "router", 100_000)
        return NetworkSample(name, "A", "s", 5_000, False, hop, (), rng.randbytes(16), rng.randbytes(56),
                             rng.randbytes(30))

    names = ["".join(["n", "1"]) for _ in range(2)]
    assert names[0] == names[1] and names[0] is not names[1]
    compiled_registry, python_registry = CollectorRegistry(), CollectorRegistry()
    compiled = NetworkMetrics(compiled_registry)
    python = PythonNetworkMetrics(python_registry)
    for batch in ([sample("n1", 0)], [sample(names[0], 1), sample(names[1], 2), sample(names[0], 3)]):
        compiled.record(batch)
        python.record(batch)
    assert openmetrics.generate_latest(compiled_registry) == openmetrics.generate_latest(python_registry)
