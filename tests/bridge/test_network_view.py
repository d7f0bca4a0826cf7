"""The live network view on real servers: a cluster of three (routes) and a leafnode, traced
traffic crossing each link a known number of times, an independent record of every trace
message (a plain subscriber, plain `json`). The bridge's hop histogram must count exactly
those crossings per edge, with the same times; a real Prometheus (exemplar storage on)
scrapes two real bridges (core and JetStream mode), every query of the Grafana dashboard
returns data, and the exemplars of both latency histograms, on /metrics and in Prometheus,
name for every edge traces that crossed it, with the crossing's latency, and exported spans."""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import nats
import pytest
import yaml

from nats_otel.bridge.settings import load_settings
from nats_otel.devkit.processes import start_topology, wait_for_interest
from nats_otel.devkit.prometheus import PrometheusNotFound, PrometheusServer, find_prometheus
from nats_otel.devkit.receivers import OTLPGrpcReceiver
from nats_otel.devkit.topology import demo_topology
from tests.bridge.bridge_helpers import (
    exemplars,
    exported_spans,
    metric,
    scrape,
    scrape_openmetrics,
    start_bridge,
    stop_bridge,
    traceparent,
    wait_jetstream_answers,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

DASHBOARD = Path(__file__).resolve().parents[2] / "config" / "grafana" / "dashboards" / "nats-otel.json"
ALERTS = Path(__file__).resolve().parents[2] / "config" / "prometheus" / "alerts.yml"
# Two rounds of traffic, Prometheus scraping in between: rates need an increase it has seen.
ROUNDS = 2
N_DOWN = 15 * ROUNDS  # east-2 -> east-3 (route); east-2 -> east-1 (route) -> leaf-1 (leafnode)
N_UP = 6 * ROUNDS  # leaf-1 -> east-1 (leafnode) -> east-2 (route)
CROSSINGS = {
    ("east-2", "east-3", "router"): N_DOWN,
    ("east-2", "east-1", "router"): N_DOWN,
    ("east-1", "leaf-1", "leaf"): N_DOWN,
    ("leaf-1", "east-1", "leaf"): N_UP,
    ("east-1", "east-2", "router"): N_UP,
}
REPORTS = 4 * N_DOWN + 3 * N_UP  # east-2, east-3, east-1, leaf-1 for each down; leaf-1, east-1, east-2 up
FORWARDING_KINDS = {1: "router", 2: "gateway", 4: "leaf"}


@pytest.fixture(scope="module")
def topo() -> Iterator:
    with start_topology(demo_topology()) as running:
        yield running


def ts_ns(text: str) -> int:
    """RFC 3339 with nanoseconds -> ns since the epoch, exactly (no float on the way)."""
    head, _, frac = text.rstrip("Z").partition(".")
    seconds = int(datetime.fromisoformat(head).replace(tzinfo=UTC).timestamp())
    return seconds * 1_000_000_000 + int((frac + "000000000")[:9])


def crossings_from_record(payloads: list[bytes]) -> dict[tuple[str, str, str], list[int]]:
    """Edge -> hop latencies (ns), from the raw trace messages alone (`crossings_by_trace`)."""
    latencies: dict[tuple[str, str, str], list[int]] = defaultdict(list)
    for (edge, _), latency in crossings_by_trace(payloads).items():
        latencies[edge].append(latency)
    return latencies


def crossings_by_trace(payloads: list[bytes]) -> dict[tuple[tuple[str, str, str], str], int]:
    """(edge, trace id in hex) -> hop latency (ns): each downstream ingress joined to the
    upstream egress of the same traceparent, hop id and server names. Here a message crosses
    each edge at most once."""
    docs = [json.loads(p) for p in payloads]
    egress_at: dict[tuple, int] = {}
    for doc in docs:
        tp = doc["request"]["header"]["traceparent"][0]
        for event in doc["events"]:
            if event["type"] == "eg" and event.get("hop") and event["kind"] in FORWARDING_KINDS:
                egress_at[(tp, event["hop"], doc["server"]["name"], event["name"])] = ts_ns(event["ts"])
    crossings = {}
    for doc in docs:
        ingress = doc["events"][0]
        if ingress["kind"] not in FORWARDING_KINDS:
            continue
        header = doc["request"]["header"]
        tp = header["traceparent"][0]
        key = (tp, header["Nats-Trace-Hop"][0], ingress["name"], doc["server"]["name"])
        edge = (ingress["name"], doc["server"]["name"], FORWARDING_KINDS[ingress["kind"]])
        assert (edge, tp[3:35]) not in crossings
        crossings[edge, tp[3:35]] = ts_ns(ingress["ts"]) - egress_at[key]
    return crossings


def in_server_by_trace(payloads: list[bytes]) -> dict[tuple[str, str], int]:
    """(server, trace id in hex) -> time in that server (ns): its last event minus its ingress."""
    out = {}
    for doc in map(json.loads, payloads):
        times = [ts_ns(event["ts"]) for event in doc["events"]]
        out[doc["server"]["name"], doc["request"]["header"]["traceparent"][0][3:35]] = max(times) - times[0]
    return out


Exemplar = tuple[dict[str, str], dict[str, str], float]  # series labels, exemplar labels, value


def check_exemplars(hop: list[Exemplar], in_server: list[Exemplar], record: list[bytes],
                    exported: set[tuple[str, str]]) -> None:
    """Every edge crossed has exemplars; each names a trace that crossed that edge (or, for
    time in server, went through that server), with that crossing's latency (within 1 us),
    and a span the bridge exported in that trace."""
    crossings, held = crossings_by_trace(record), in_server_by_trace(record)
    edges = set()
    for series, names, value in hop:
        edge = (series["from_server"], series["to_server"], series["kind"])
        assert (edge, names["trace_id"]) in crossings, (edge, names)
        assert abs(value - crossings[edge, names["trace_id"]] / 1e9) <= 1e-6, (edge, names, value)
        assert (names["trace_id"], names["span_id"]) in exported, names
        edges.add(edge)
    assert edges == set(CROSSINGS)
    servers = set()
    for series, names, value in in_server:
        key = (series["server"], names["trace_id"])
        assert key in held and abs(value - held[key] / 1e9) <= 1e-6, (key, value)
        assert (names["trace_id"], names["span_id"]) in exported, names
        servers.add(series["server"])
    assert servers == {server for server, _ in held}


def prometheus_exemplars(prom: PrometheusServer, name: str, instance: str, since: float) -> list[Exemplar]:
    """The exemplars Prometheus stored for histogram `name` of one scrape target."""
    out = []
    for series in prom.query_exemplars(f'{name}_bucket{{instance="{instance}"}}', since, time.time() + 60):
        for exemplar in series["exemplars"]:
            out.append((series["seriesLabels"], exemplar["labels"], float(exemplar["value"])))
    return out


def histogram_series(text: str, name: str, labels: tuple[str, ...]) -> dict[tuple[str, ...], float]:
    """`<name>_count` samples of one histogram in Prometheus text, by the values of `labels`."""
    out = {}
    for line in text.splitlines():
        if line.startswith(name + "_count{"):
            found = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0]))
            out[tuple(found[label] for label in labels)] = float(line.rsplit(" ", 1)[1])
    return out


EDGE = ("from_server", "to_server", "kind")


async def traffic(topo) -> None:
    """One round: N_DOWN / ROUNDS traced messages from east-2 and N_UP / ROUNDS from leaf-1,
    one traceparent each."""
    down_subs = [await nats.connect(topo.client_url(name, "a")) for name in ("east-3", "leaf-1")]
    up_sub = await nats.connect(topo.client_url("east-2", "a"))
    east2 = await nats.connect(topo.client_url("east-2", "a"))
    leaf = await nats.connect(topo.client_url("leaf-1", "a"))
    try:
        for nc in down_subs:
            await nc.subscribe("net.down")
            await wait_for_interest(east2, nc)
        await up_sub.subscribe("net.up")
        await wait_for_interest(leaf, up_sub)
        for i in range(max(N_DOWN, N_UP) // ROUNDS):
            if i < N_DOWN // ROUNDS:
                await east2.publish("net.down", b"d" * (10 + i), headers={"traceparent": traceparent()[0]})
            if i < N_UP // ROUNDS:
                await leaf.publish("net.up", b"u" * (10 + i), headers={"traceparent": traceparent()[0]})
            await asyncio.sleep(0.06)
        await east2.publish("trace.a", b"\x00 not a trace message")  # a rejected one, by reason
        for nc in (east2, leaf):
            await nc.flush()
    finally:
        for nc in (*down_subs, up_sub, east2, leaf):
            await nc.close()


def bridge_config(topo, endpoint: str, **extra) -> dict:
    return {
        "sources": [{"name": "a", "urls": [topo.client_url("east-1", "a")], "subjects": ["trace.a"]}],
        "otlp": {"endpoint": endpoint},
        "telemetry": {"metrics_port": 0, "metrics_host": "127.0.0.1"},
        "batch": {"max_delay": 0.05},
        **extra,
    }


async def test_hop_histogram_counts_every_crossing_and_the_dashboard_has_data(topo) -> None:
    try:
        find_prometheus()
    except PrometheusNotFound as exc:
        pytest.skip(f"{exc} (.ci/run installs it)")
    record: list[bytes] = []
    recorder = await nats.connect(topo.client_url("east-1", "a"))

    async def keep(msg) -> None:
        if msg.data.startswith(b"{"):
            record.append(msg.data)

    await recorder.subscribe("trace.a", cb=keep)
    started = time.time()
    with OTLPGrpcReceiver() as rx:
        core_settings = load_settings(overrides=bridge_config(topo, rx.endpoint), env={})
        js_settings = load_settings(overrides=bridge_config(
            topo, rx.endpoint, mode="jetstream",
            jetstream={"stream": "NETVIEW", "durable": "netview", "create_stream": True}), env={})
        core, core_task = await start_bridge(core_settings)
        await wait_jetstream_answers(recorder)  # east-1 has no JetStream: the API is reached through east-2/3
        js, js_task = await start_bridge(js_settings)
        try:
            await wait_for_interest(recorder, core.sources[0].nc)
            targets = [f"127.0.0.1:{core.metrics_port}", f"127.0.0.1:{js.metrics_port}"]
            with PrometheusServer(targets, rule_files=[ALERTS]) as prom:
                # Both bridges see every trace message: the core one's series, by its instance.
                of_core = f'instance="{targets[0]}"'

                def hops_in_prometheus() -> int:
                    result = prom.query(f"sum(nats_otel_hop_latency_seconds_count{{{of_core}}})")
                    return int(result[0]["value"][1]) if result else 0

                await traffic(topo)
                first = sum(CROSSINGS.values()) // ROUNDS
                await wait_until(lambda: hops_in_prometheus() == first, 30, "round 1 scraped")
                await traffic(topo)
                await wait_until(lambda: len(record) >= REPORTS, 30, f"{REPORTS} trace messages recorded")

                def hops_counted() -> float:
                    text = scrape(core.metrics_port)[1]
                    return sum(histogram_series(text, "nats_otel_hop_latency_seconds", EDGE).values())

                await wait_until(lambda: hops_counted() >= sum(CROSSINGS.values()), 30, "every hop counted")
                # Nothing more may come (a late or extra one would show in the counts below):
                # what the bridge still held waits link.wait at most, then a batch.
                await asyncio.sleep(core_settings.link.wait + core_settings.batch.max_delay)
                expected = crossings_from_record(record)
                text = scrape(core.metrics_port)[1]

                # Exactly the crossings made, per edge, with the record's times.
                assert len(record) == REPORTS
                assert {edge: len(times) for edge, times in expected.items()} == CROSSINGS
                counted = histogram_series(text, "nats_otel_hop_latency_seconds", EDGE)
                assert counted == {edge: float(n) for edge, n in CROSSINGS.items()}
                for (src, dst, kind), times in expected.items():
                    labels = {"from_server": src, "to_server": dst, "kind": kind}
                    total = metric(text, "nats_otel_hop_latency_seconds_sum", **labels)
                    assert math.isclose(total, sum(times) / 1e9, rel_tol=0, abs_tol=1e-9 * len(times))
                    within_1ms = metric(text, "nats_otel_hop_latency_seconds_bucket", le="0.001", **labels)
                    assert within_1ms == sum(1 for t in times if t <= 1_000_000)
                # Time in each server: one sample per trace message that server sent.
                per_server = Counter(json.loads(p)["server"]["name"] for p in record)
                assert histogram_series(text, "nats_otel_server_latency_seconds", ("server",)) == {
                    (name,): float(n) for name, n in per_server.items()}
                assert metric(text, "nats_otel_hop_links_total", result="matched") == sum(CROSSINGS.values())
                assert metric(text, "nats_otel_server_errors_total", server="east-2") == 0
                # The alerts name only metrics this bridge exports (with series, after this traffic).
                sample_names = {line.split("{")[0].split(" ")[0] for line in text.splitlines()
                                if line and not line.startswith("#")}
                alert_names = set(re.findall(r"\bnats_otel_[a-z_]+", ALERTS.read_text()))
                assert len(alert_names) == 8 and alert_names <= sample_names, alert_names - sample_names

                # Prometheus scraped both bridges; every dashboard query returns data.
                await wait_until(lambda: prom.targets_up() == 2, 20, "both bridges scraped")
                await wait_until(lambda: hops_in_prometheus() == sum(CROSSINGS.values()), 20,
                                 "Prometheus has the final counts")
                await asyncio.sleep(2.5)  # a few more scrapes: rates over the window need two points
                empty = []
                for expr in dashboard_queries():
                    result = prom.query(expr.replace("$__rate_interval", "1m"))
                    if not result:
                        empty.append(expr)
                    elif "hop_latency" in expr:
                        assert any(math.isfinite(float(r["value"][1])) for r in result), expr
                assert not empty, f"dashboard queries without data: {empty}"
                # The alerts evaluate on the bridges' real series, without error.
                await wait_until(lambda: all(r["health"] == "ok" for r in prom.rules()), 20, "every rule evaluated")
                assert len(prom.rules()) == 15
                assert prom.query("nats_otel:setting:hop_latency_p99_seconds")[0]["value"][1] == "0.1"
                per_edge = prom.query(
                    f"sum by (from_server, to_server, kind) (nats_otel_hop_latency_seconds_count{{{of_core}}})")
                assert {(r["metric"]["from_server"], r["metric"]["to_server"], r["metric"]["kind"]):
                        int(r["value"][1]) for r in per_edge} == CROSSINGS

                # Exemplars, from both bridges: on /metrics (OpenMetrics), then as Prometheus stored them.
                exported = exported_spans(rx.requests)
                for bridge in (core, js):
                    text = scrape_openmetrics(bridge.metrics_port)
                    check_exemplars(exemplars(text, "nats_otel_hop_latency_seconds"),
                                    exemplars(text, "nats_otel_server_latency_seconds"), record, exported)
                for target in targets:
                    def stored(name: str, target: str = target) -> list[Exemplar]:
                        return prometheus_exemplars(prom, name, target, started - 60)

                    await wait_until(lambda: {(s["from_server"], s["to_server"], s["kind"]) for s, _, _ in
                                              stored("nats_otel_hop_latency_seconds")} == set(CROSSINGS), 20,
                                     f"exemplars of every edge stored for {target}")
                    check_exemplars(stored("nats_otel_hop_latency_seconds"),
                                    stored("nats_otel_server_latency_seconds"), record, exported)
        finally:
            await recorder.close()
            assert await stop_bridge(js, js_task) == 0
            assert await stop_bridge(core, core_task) == 0


def dashboard_queries() -> list[str]:
    doc = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in doc["panels"] for t in p.get("targets", [])]


def test_dashboard_is_provisionable_and_uses_only_bridge_metrics() -> None:
    doc = json.loads(DASHBOARD.read_text())
    assert doc["uid"] == "nats-otel" and doc["templating"]["list"][0]["type"] == "datasource"
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids))
    names = {n for expr in dashboard_queries() for n in re.findall(r"\bnats_otel_[a-z_]+", expr)}
    for needed in ("nats_otel_hop_latency_seconds_bucket", "nats_otel_server_latency_seconds_bucket",
                   "nats_otel_messages_dropped_total", "nats_otel_export_duration_seconds_bucket",
                   "nats_otel_queue_depth", "nats_otel_jetstream_pending"):
        assert needed in names
    provider = (DASHBOARD.parents[1] / "provisioning" / "dashboards" / "nats-otel.yaml").read_text()
    assert "/var/lib/grafana/dashboards/nats-otel" in provider


def test_grafana_shows_exemplars_and_links_their_trace_ids_to_the_trace_backends() -> None:
    doc = json.loads(DASHBOARD.read_text())
    latency_targets = [t for p in doc["panels"] for t in p.get("targets", [])
                       if re.search(r"histogram_quantile\(.*nats_otel_(hop|server)_latency_seconds_bucket", t["expr"])]
    assert len(latency_targets) == 3 and all(t.get("exemplar") is True for t in latency_targets)
    folder = DASHBOARD.parents[1] / "provisioning" / "datasources"
    sources = {s["uid"]: s for f in sorted(folder.glob("*.yaml")) for s in yaml.safe_load(f.read_text())["datasources"]}
    destinations = sources["prometheus"]["jsonData"]["exemplarTraceIdDestinations"]
    assert {(d["name"], d["datasourceUid"]) for d in destinations} == {("trace_id", "tempo"), ("trace_id", "jaeger")}
    assert (sources["tempo"]["type"], sources["jaeger"]["type"]) == ("tempo", "jaeger")
    # The docker-compose example runs them: Prometheus keeping exemplars, Grafana provisioned.
    compose = yaml.safe_load((DASHBOARD.parents[3] / "examples" / "docker-compose" / "docker-compose.yaml").read_text())
    services = compose["services"]
    assert "--enable-feature=exemplar-storage" in services["prometheus"]["command"]
    assert any(v.startswith("../../config/grafana/provisioning:") for v in services["grafana"]["volumes"])
    assert "nats-otel-bridge" in services["bridge"]["networks"]["default"]["aliases"]
