"""The bridge in core and JetStream mode against a real topology (routes, gateway, leafnode, accounts
with msg_trace) and real OTLP receivers: spans match the topology and equal what `convert`
makes of the same raw messages."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest

from nats_otel.bridge.loop import Bridge
from nats_otel.bridge.settings import load_settings
from nats_otel.core.records import SpanKind, StatusCode
from nats_otel.devkit.processes import start_topology, wait_for_interest
from nats_otel.devkit.receivers import OTLPGrpcReceiver, OTLPHttpReceiver
from nats_otel.devkit.topology import full_topology
from tests.bridge.bridge_helpers import (
    archive_lines,
    archived,
    attrs,
    expected_from_archive,
    metric,
    scrape,
    span_values,
    spans_by_trace,
    start_bridge,
    stop_bridge,
    traceparent,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def topo() -> Iterator:
    with start_topology(full_topology()) as running:
        yield running


def bridge_settings(topo, tmp_path: Path, endpoint: str, protocol: str = "grpc", **extra):
    config = {
        "mode": "core",
        "sources": [
            {"name": "a", "urls": [topo.client_url("east-1", "a")], "subjects": ["trace.a"]},
            {"name": "b", "urls": [topo.client_url("east-2", "b")], "subjects": ["trace.b"]},
        ],
        "otlp": {"endpoint": endpoint, "protocol": protocol, "retry_max_elapsed": 2.0, "timeout": 2.0},
        "archive": str(tmp_path / "archive.jsonl"),
        "telemetry": {"metrics_port": 0, "metrics_host": "127.0.0.1"},
        "batch": {"max_delay": 0.05},
        **extra,
    }
    return load_settings(overrides=config, env={})



async def publish_scenarios(topo, bridge: Bridge) -> dict[str, tuple[str, str, int]]:
    """Traced publishes across a route, a gateway and a leafnode, plus a denied publish.

    Returns scenario -> (trace id, parent span id, servers that must report it). A gateway
    may forward to any server of the other cluster, which then routes it on.
    """
    pub = await nats.connect(topo.client_url("east-1", "a"))
    denied = await nats.connect(topo.client_url("east-1", "a_deny"), error_cb=_ignore)
    subs = {name: await nats.connect(topo.client_url(name, "a")) for name in ("east-2", "west-1", "leaf-1")}
    try:
        # The bridge's subscriptions must be known on every server before anything is traced.
        for name in ("east-2", "west-1", "leaf-1"):
            await wait_for_interest(subs[name], bridge.sources[0].nc)
        out = {}
        for scenario, server in (("route", "east-2"), ("gateway", "west-1"), ("leaf", "leaf-1")):
            subject = f"bridge.{scenario}"
            await subs[server].subscribe(subject)
            await wait_for_interest(pub, subs[server])
            tp, trace_id, parent = traceparent()
            await pub.publish(subject, b"hello", headers={"traceparent": tp})
            out[scenario] = (trace_id, parent, {"east-1", server})
        tp, trace_id, parent = traceparent()
        await denied.publish("secret.x", b"no", headers={"traceparent": tp})
        await denied.flush()
        out["denied"] = (trace_id, parent, {"east-1"})
        await pub.flush()
        return out
    finally:
        for nc in (pub, denied, *subs.values()):
            await nc.close()


async def _ignore(exc: Exception) -> None:
    pass


def all_archived(archive: Path, scenarios: dict[str, tuple[str, str, set[str]]], junk: int = 0) -> bool:
    seen = archived(archive)
    want = {(trace_id, server) for trace_id, _, servers in scenarios.values() for server in servers}
    return want <= set(seen) and seen.count((None, None)) >= junk


def check_topology(by_trace: dict, scenarios: dict[str, tuple[str, str, set[str]]]) -> None:
    """Server span per hop; origin parent = traceparent parent; downstream parent = the
    upstream egress span with the same hop id; the denied publish is an ERROR."""
    for scenario, (trace_id, parent, must) in scenarios.items():
        spans = by_trace[trace_id]
        servers = [(res, s) for res, s in spans if s.kind == SpanKind.CONSUMER]
        names = [res["messaging.nats.server.name"] for res, _ in servers]
        assert len(names) == len(set(names)) and must <= set(names), (scenario, names)
        origin = [s for res, s in servers if "messaging.nats.trace.hop" not in attrs(s)]
        assert len(origin) == 1 and origin[0].parent_span_id.hex() == parent, scenario
        assert origin[0].name == ("receive secret.x" if scenario == "denied" else f"receive bridge.{scenario}")
        egress = {attrs(s).get("messaging.nats.trace.hop"): s for _, s in spans if s.kind == SpanKind.PRODUCER}
        for _, down in servers:
            hop = attrs(down).get("messaging.nats.trace.hop")
            if hop is not None:
                assert down.parent_span_id == egress[hop].span_id, (scenario, hop)
                # ... and that egress hangs under the upstream server's span.
                upstream = [s for _, s in servers if s.span_id == egress[hop].parent_span_id]
                assert len(upstream) == 1 and upstream[0].span_id != down.span_id
        if scenario == "denied":
            assert origin[0].status.code == StatusCode.ERROR and origin[0].status.message
        else:
            assert all(s.status.code != StatusCode.ERROR for _, s in spans), scenario
            assert len(names) >= 2


async def test_core_mode_grpc_spans_match_topology_and_convert(topo, tmp_path: Path) -> None:
    with OTLPGrpcReceiver() as rx:
        bridge, task = await start_bridge(bridge_settings(topo, tmp_path, rx.endpoint))
        try:
            scenarios = await publish_scenarios(topo, bridge)
            archive = tmp_path / "archive.jsonl"
            # Garbage on a trace subject: counted as rejected, nothing exported for it.
            junk = await nats.connect(topo.client_url("east-1", "a"))
            await junk.publish("trace.a", b"this is not a trace event")
            await junk.close()
            await wait_until(lambda: all_archived(archive, scenarios, junk=1), 15, "every hop archived")
            expected, rejected = expected_from_archive(archive)
            assert rejected == 1
            await wait_until(lambda: rx.span_count >= len(expected), 15, "all spans exported")
            assert span_values(rx.requests) == expected
            check_topology(spans_by_trace(rx.requests), scenarios)
            # Counters are updated right after the export returns: wait for the last one.
            await wait_until(lambda: metric(scrape(bridge.metrics_port)[1], "nats_otel_spans_exported_total",
                                            exporter="otlp-grpc") >= len(expected), 5, "export counted")
            status, text = scrape(bridge.metrics_port)
            assert status == 200
            assert metric(text, "nats_otel_messages_rejected_total", reason="bad_json") == 1
            messages = archive_lines(archive)
            assert messages >= 8
            assert metric(text, "nats_otel_messages_decoded_total") == messages - 1
            assert metric(text, "nats_otel_spans_exported_total", exporter="otlp-grpc") == len(expected)
            assert metric(text, "nats_otel_messages_received_total", source="a") == messages
            assert scrape(bridge.metrics_port, "/readyz")[0] == 200
            assert scrape(bridge.metrics_port, "/healthz")[0] == 200
            assert metric(scrape(bridge.metrics_port)[1], "nats_otel_ready") == 1
        finally:
            assert await stop_bridge(bridge, task) == 0


async def test_core_mode_http_gzip_and_second_account(topo, tmp_path: Path) -> None:
    with OTLPHttpReceiver() as rx:
        settings = bridge_settings(topo, tmp_path, f"http://127.0.0.1:{rx.port}", "http/protobuf")
        settings = settings.model_copy(update={"otlp": settings.otlp.model_copy(update={"compression": "gzip"})})
        bridge, task = await start_bridge(settings)
        try:
            # Account B on east-2: its own trace dest, reached over the bridge's second source.
            pub = await nats.connect(topo.client_url("east-2", "b"))
            sub = await pub.subscribe("b.local")
            await pub.flush()
            tp, trace_id, parent = traceparent()
            await pub.publish("b.local", b"x", headers={"traceparent": tp})
            await sub.next_msg(timeout=5)
            await pub.close()
            archive = tmp_path / "archive.jsonl"
            await wait_until(lambda: archive_lines(archive) >= 1, 10, "B's trace message archived")
            expected, _ = expected_from_archive(archive)
            await wait_until(lambda: rx.span_count >= len(expected), 10, "spans over OTLP/HTTP")
            assert span_values(rx.requests) == expected
            headers = rx.received[0].headers
            assert headers.get("Content-Encoding", headers.get("content-encoding")) == "gzip"
            (spans,) = spans_by_trace(rx.requests).values()
            server = next(s for _, s in spans if s.kind == SpanKind.CONSUMER)
            assert server.trace_id.hex() == trace_id and server.parent_span_id.hex() == parent
            assert attrs(server)["messaging.nats.account"] == "B"
            await wait_until(lambda: metric(scrape(bridge.metrics_port)[1], "nats_otel_spans_exported_total",
                                            exporter="otlp-http") == len(expected), 5, "export counted")
            _, text = scrape(bridge.metrics_port)
            assert metric(text, "nats_otel_messages_received_total", source="b") == 1
        finally:
            assert await stop_bridge(bridge, task) == 0


async def test_readyz_reports_export_failure(topo, tmp_path: Path) -> None:
    rx = OTLPGrpcReceiver().start()
    try:
        settings = bridge_settings(topo, tmp_path, rx.endpoint)
        settings = settings.model_copy(update={"otlp": settings.otlp.model_copy(update={"retry_max_elapsed": 0.3})})
        bridge, task = await start_bridge(settings)
        rx.unavailable = True  # after start-up: the empty probe request had shown it reachable
        try:
            pub = await nats.connect(topo.client_url("east-1", "a"))
            sub = await pub.subscribe("ready.x")
            await pub.flush()
            await pub.publish("ready.x", b"x", headers={"traceparent": traceparent()[0]})
            await sub.next_msg(timeout=5)
            await pub.close()
            await wait_until(lambda: not bridge.ready()[0], 10, "readiness to drop")
            status, body = scrape(bridge.metrics_port, "/readyz")
            assert status == 503 and f"OTLP endpoint {rx.endpoint}: answers, but is unavailable" in body
            _, text = scrape(bridge.metrics_port)
            assert metric(text, "nats_otel_ready") == 0  # what the alert NatsOtelBridgeNotReady reads
            assert metric(text, "nats_otel_messages_dropped_total", reason="export_failed") == 1
            assert metric(text, "nats_otel_export_failures_total", exporter="otlp-grpc") == 1
        finally:
            assert await stop_bridge(bridge, task) == 0
    finally:
        rx.stop()


async def test_jetstream_mode_spans_match_and_garbage_is_terminated(topo, tmp_path: Path) -> None:
    """Runs last in this module: its stream keeps recording trace.a."""
    with OTLPGrpcReceiver() as rx:
        settings = bridge_settings(topo, tmp_path, rx.endpoint, mode="jetstream",
                                   jetstream={"stream": "BRIDGE_LIVE", "durable": "live", "create_stream": True,
                                              "ack_wait": 10.0})
        settings = settings.model_copy(update={"sources": settings.sources[:1]})
        bridge, task = await start_bridge(settings)
        try:
            scenarios = await publish_scenarios(topo, bridge)
            junk = await nats.connect(topo.client_url("east-1", "a"))
            await junk.publish("trace.a", b"\x00garbage")
            await junk.flush()
            archive = tmp_path / "archive.jsonl"
            await wait_until(lambda: all_archived(archive, scenarios, junk=1), 20, "every hop archived")
            expected, rejected = expected_from_archive(archive)
            assert rejected >= 1
            await wait_until(lambda: span_values(rx.requests) >= expected, 15, "all spans exported")
            assert span_values(rx.requests) == expected
            check_topology(spans_by_trace(rx.requests), scenarios)
            js = junk.jetstream()
            stream = await js.stream_info("BRIDGE_LIVE")
            assert stream.state.messages == len(archived(archive))  # nothing archived twice: no redelivery

            async def settled() -> bool:
                info = await js.consumer_info("BRIDGE_LIVE", "live")
                return info.num_ack_pending == 0 and info.num_pending == 0 and info.num_redelivered == 0

            for _ in range(50):
                if await settled():
                    break
                await asyncio.sleep(0.1)
            assert await settled()
            _, text = scrape(bridge.metrics_port)
            assert metric(text, "nats_otel_jetstream_acks_total", kind="term") == 1
            assert metric(text, "nats_otel_jetstream_acks_total", kind="ack") == stream.state.messages - 1
            assert metric(text, "nats_otel_messages_rejected_total", reason="bad_json") == 1
            await js.delete_stream("BRIDGE_LIVE")
            await junk.close()
        finally:
            assert await stop_bridge(bridge, task) == 0
