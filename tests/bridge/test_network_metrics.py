"""The network metrics' bounds: label sets capped per metric, the rest counted under `_other`
and said once in the log; extra labels only when asked."""

from __future__ import annotations

import logging

from prometheus_client import CollectorRegistry, generate_latest

from nats_otel.bridge.network_metrics import NetworkMetrics
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


def test_subject_label_only_when_asked():
    plain, by_subject = CollectorRegistry(), CollectorRegistry()
    NetworkMetrics(plain).record([sample("n1", "orders.new")])
    NetworkMetrics(by_subject, extra_labels=["subject"]).record([sample("n1", "orders.new")])
    assert b"orders.new" not in generate_latest(plain)
    assert by_subject.get_sample_value("nats_otel_server_latency_seconds_count",
                                       {"server": "n1", "subject": "orders.new"}) == 1
