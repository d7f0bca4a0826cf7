"""Faults while traced traffic flows, with real nats-server processes and OTLP receivers.

* JetStream mode, the server holding the stream is SIGKILLed and restarted: every trace
  message the stream holds becomes spans at the receiver (at least once), including those
  stored after the restart.
* Core mode, a cluster member is SIGKILLed: the bridge loses nothing it received
  (received = exported + dropped + rejected, dropped = 0), every trace message of the
  surviving servers arrives, and what is missing is exactly the killed server's. Trace
  messages a dead server never published are outside any subscriber's view: nats-server
  publishes them at most once and nothing records that they existed (docs/reliability.md).
* Core mode, a tiny queue and a slow backend: the drops counted with their reason equal
  exactly the trace messages published minus those that arrived.
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import nats
import pytest

from nats_otel.bridge.settings import load_settings
from nats_otel.core.decode import RawTraceMessage
from nats_otel.core.encode import to_protobuf
from nats_otel.core.pipeline import Converted, convert_batch
from nats_otel.core.records import SpanKind
from nats_otel.devkit.processes import start_topology, wait_for_interest
from nats_otel.devkit.receivers import OTLPGrpcReceiver
from nats_otel.devkit.topology import Topology, cluster, single_server
from tests.bridge.bridge_helpers import (
    publish_traced,
    span_values,
    spans_by_trace,
    start_bridge,
    stop_bridge,
    traceparent,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

FAST_RETRY = {"timeout": 2.0, "retry_max_elapsed": 0.5, "retry_initial_backoff": 0.05, "retry_max_backoff": 0.2}



async def traffic(url: str, stop: asyncio.Event, sent: list[str], rate: float = 100.0,
                  subject: str = "app.work") -> None:
    """Traced publishes at `rate`/s until `stop`; keeps publishing through reconnects."""
    nc = await nats.connect(url, reconnect_time_wait=0.2, max_reconnect_attempts=-1)
    await nc.subscribe(subject)
    try:
        while not stop.is_set():
            tp, trace_id, _ = traceparent()
            try:
                await nc.publish(subject, b"work", headers={"traceparent": tp})
                sent.append(trace_id)
            except nats.errors.Error:
                pass  # disconnected and the reconnect buffer is full: not published
            await asyncio.sleep(1 / rate)
        await nc.flush(timeout=5)
    finally:
        await nc.close()


def server_spans(rx: OTLPGrpcReceiver) -> list[tuple[str, str]]:
    """(trace id, server name) of every distinct server span: one per trace message exported."""
    return sorted(
        (trace_id, res.get("messaging.nats.server.name"))
        for trace_id, spans in spans_by_trace(rx.requests).items()
        for res, span in spans if span.kind == SpanKind.CONSUMER
    )


def exported_traces(rx: OTLPGrpcReceiver) -> set[str]:
    """Trace ids of which at least one server span reached the receiver."""
    return {trace_id for trace_id, _ in server_spans(rx)}


async def stream_raws(url: str, stream: str) -> list[RawTraceMessage]:
    """Every message the stream holds, read directly (not through the bridge)."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        state = (await js.stream_info(stream)).state
        raws = []
        for seq in range(state.first_seq, state.last_seq + 1):
            msg = await js.get_msg(stream, seq)
            raws.append(RawTraceMessage(msg.subject, {k: [v] for k, v in (msg.headers or {}).items()}, msg.data or b""))
        return raws
    finally:
        await nc.close()


async def test_jetstream_server_restart_mid_traffic_loses_nothing(tmp_path: Path) -> None:
    with start_topology(single_server(jetstream=True), tmp_path / "nats") as topo, OTLPGrpcReceiver() as rx:
        url = topo.client_url("n1", "a")
        settings = load_settings(env={}, overrides={
            "mode": "jetstream",
            "sources": [{"urls": [url], "subjects": ["trace.a"]}],
            "jetstream": {"stream": "RESTART", "durable": "restart", "create_stream": True, "ack_wait": 5.0,
                          "nak_delay_initial": 0.1, "nak_delay_max": 0.5, "fetch_batch": 50},
            "otlp": {**FAST_RETRY, "endpoint": rx.endpoint},
        })
        bridge, task = await start_bridge(settings)
        stop, sent = asyncio.Event(), []
        publisher = asyncio.create_task(traffic(url, stop, sent))
        try:
            await wait_until(lambda: rx.span_count >= 100, 20, "spans before the restart")
            before = rx.span_count
            await asyncio.to_thread(topo.kill, "n1", signal.SIGKILL)
            await asyncio.sleep(1.0)
            assert not bridge.ready()[0]
            await asyncio.to_thread(topo.restart, "n1")
            published_at_restart = len(sent)
            await wait_until(lambda: len(sent) >= published_at_restart + 150, 20, "traffic after the restart")
            stop.set()
            await publisher
            raws = await stream_raws(url, "RESTART")
            results = convert_batch(raws)
            assert all(isinstance(r, Converted) for r in results)
            expected = span_values([to_protobuf([s for r in results for s in r.spans])])
            stored = {s.trace_id.hex() for r in results for s in r.spans}
            # The stream kept messages from both sides of the restart.
            assert stored & set(sent[:published_at_restart // 2]) and stored & set(sent[-50:])
            await wait_until(lambda: span_values(rx.requests) >= expected, 40, "every stored trace message exported")
            assert span_values(rx.requests) == expected
            assert rx.span_count > before
            assert bridge.metrics.value("nats_otel_messages_dropped_total", {"reason": "export_failed"}) == 0
        finally:
            stop.set()
            await asyncio.gather(publisher, return_exceptions=True)
            assert await stop_bridge(bridge, task) == 0


async def test_jetstream_durable_deleted_by_an_operator_is_recreated(tmp_path: Path) -> None:
    with start_topology(single_server(jetstream=True), tmp_path / "nats") as topo, OTLPGrpcReceiver() as rx:
        url = topo.client_url("n1", "a")
        settings = load_settings(env={}, overrides={
            "mode": "jetstream",
            "sources": [{"urls": [url], "subjects": ["trace.a"]}],
            "jetstream": {"stream": "GONE", "durable": "gone", "create_stream": True},
            "otlp": {**FAST_RETRY, "endpoint": rx.endpoint}, "batch": {"max_delay": 0.05},
        })
        bridge, task = await start_bridge(settings)
        try:
            first = set(await publish_traced(url, 20))
            await wait_until(lambda: exported_traces(rx) >= first, 15, "spans before the delete")
            admin = await nats.connect(url)
            assert await admin.jetstream().delete_consumer("GONE", "gone")
            await admin.close()
            second = set(await publish_traced(url, 20))
            await wait_until(lambda: exported_traces(rx) >= second, 20, "spans after the durable was deleted")
            recreated = bridge.metrics.value("nats_otel_jetstream_consumer_recreated_total", {"source": "default"})
            assert recreated >= 1
        finally:
            assert await stop_bridge(bridge, task) == 0



async def test_jetstream_stream_deleted_setup_failures_counted_until_it_is_back(tmp_path: Path) -> None:
    """The whole stream deleted, and the bridge may not create it: each failed attempt to set
    the durable up again is logged and counted; once an operator restores the stream, the
    bridge sets its durable up again and traces flow."""
    with start_topology(single_server(jetstream=True), tmp_path / "nats") as topo, OTLPGrpcReceiver() as rx:
        url = topo.client_url("n1", "a")
        admin = await nats.connect(url)
        try:
            await admin.jetstream().add_stream(name="LOST", subjects=["trace.a"])
            settings = load_settings(env={}, overrides={
                "mode": "jetstream",
                "sources": [{"urls": [url], "subjects": ["trace.a"]}],
                "jetstream": {"stream": "LOST", "durable": "lost", "create_stream": False},
                "otlp": {**FAST_RETRY, "endpoint": rx.endpoint}, "batch": {"max_delay": 0.05},
            })
            bridge, task = await start_bridge(settings)
            try:
                labels = {"source": "default"}
                first = set(await publish_traced(url, 10))
                await wait_until(lambda: exported_traces(rx) >= first, 15, "spans before the delete")
                assert await admin.jetstream().delete_stream("LOST")
                await wait_until(lambda: bridge.metrics.value(
                    "nats_otel_jetstream_consumer_setup_failed_total", labels) >= 2, 20, "failed set-ups counted")
                assert bridge.metrics.value("nats_otel_jetstream_consumer_recreated_total", labels) == 0
                await admin.jetstream().add_stream(name="LOST", subjects=["trace.a"])
                await wait_until(lambda: bridge.metrics.value(
                    "nats_otel_jetstream_consumer_recreated_total", labels) >= 1, 20, "durable set up again")
                second = set(await publish_traced(url, 10))
                await wait_until(lambda: exported_traces(rx) >= second, 20, "spans after the stream came back")
            finally:
                assert await stop_bridge(bridge, task) == 0
        finally:
            await admin.close()

def three_node_cluster() -> Topology:
    return Topology(servers=cluster("c", 3), wait_jetstream=False)


async def test_cluster_member_killed_core_mode_every_loss_accounted(tmp_path: Path) -> None:
    with start_topology(three_node_cluster(), tmp_path / "nats") as topo, OTLPGrpcReceiver() as rx:
        settings = load_settings(env={}, overrides={
            "mode": "core",
            "sources": [{"urls": [topo.client_url("c-1", "a")], "subjects": ["trace.a"]}],
            "otlp": {**FAST_RETRY, "endpoint": rx.endpoint},
            "batch": {"max_delay": 0.05},
        })
        bridge, task = await start_bridge(settings)
        pub = await nats.connect(topo.client_url("c-1", "a"))
        subs = [await nats.connect(topo.client_url(name, "a")) for name in ("c-2", "c-3")]
        try:
            for nc in subs:
                await nc.subscribe("app.work")
                await wait_for_interest(pub, nc)
            stop, sent = asyncio.Event(), []
            publisher = asyncio.create_task(traffic(topo.client_url("c-1", "a"), stop, sent, rate=150))
            await wait_until(lambda: len(sent) >= 150, 20, "traffic before the kill")
            await asyncio.to_thread(topo.kill, "c-3", signal.SIGKILL)
            killed_at = len(sent)
            await wait_until(lambda: len(sent) >= killed_at + 150, 20, "traffic after the kill")
            stop.set()
            await publisher
            # Every trace message the survivors published arrives: 2 per traced message.
            await wait_until(lambda: sum(1 for _, s in server_spans(rx) if s in ("c-1", "c-2")) >= 2 * len(sent),
                             20, "the survivors' trace messages")
            assert await stop_bridge(bridge, task) == 0
            got = server_spans(rx)
            by_server = {name: {t for t, s in got if s == name} for name in ("c-1", "c-2", "c-3")}
            assert by_server["c-1"] == set(sent) and by_server["c-2"] == set(sent)
            # The dead server's: all before the kill, none after; the few around the kill
            # died inside c-3 (never published), which no subscriber can observe.
            assert by_server["c-3"] <= set(sent[:killed_at + 20])
            assert set(sent[:killed_at - 20]) <= by_server["c-3"]
            assert len(by_server["c-3"]) < len(sent)
            m = bridge.metrics
            received = m.value("nats_otel_messages_received_total", {"source": "default"})
            dropped = sum(m.value("nats_otel_messages_dropped_total", {"reason": r})
                          for r in ("queue_full", "slow_consumer", "export_failed"))
            rejected = sum(m.value("nats_otel_messages_rejected_total", {"reason": r})
                           for r in ("bad_json", "bad_schema", "bad_compression", "too_large"))
            assert dropped == 0 and rejected == 0
            assert received == len(got) == m.value("nats_otel_messages_decoded_total")
        finally:
            for nc in (pub, *subs):
                await nc.close()
            if not task.done():
                await stop_bridge(bridge, task)


@pytest.mark.parametrize("bound", [{"queue_size": 5}, {"queue_bytes": 8 * 1024}], ids=["messages", "bytes"])
async def test_core_tiny_queue_slow_backend_drops_counted_exactly(tmp_path: Path, bound: dict) -> None:
    """Past the intake's bound (5 messages, or 8 KiB: about five trace messages), drops are
    counted exactly: delivered + counted == published. With the byte bound, nats-py's own
    buffer has the same bound, so some drops may be its (`slow_consumer`): counted as well."""
    with start_topology(single_server(), tmp_path / "nats") as topo, OTLPGrpcReceiver() as rx:
        url = topo.client_url("n1", "a")
        settings = load_settings(env={}, overrides={
            "mode": "core",
            "sources": [{"urls": [url], "subjects": ["trace.a"]}],
            "otlp": {**FAST_RETRY, "endpoint": rx.endpoint},
            "batch": {**bound, "max_messages": 5, "max_delay": 0.01},
        })
        rx.response_delay = 0.1
        bridge, task = await start_bridge(settings)
        nc = await nats.connect(url)
        published = []
        try:
            await nc.subscribe("app.work")
            for _ in range(400):
                tp, trace_id, _ = traceparent()
                await nc.publish("app.work", b"work", headers={"traceparent": tp})
                published.append(trace_id)
            await nc.flush()
            m = bridge.metrics
            # nats-py's drops happen before the bridge's callback: not in `received`.
            await wait_until(lambda: m.value("nats_otel_messages_received_total", {"source": "default"})
                             + m.value("nats_otel_messages_dropped_total", {"reason": "slow_consumer"}) >= 400,
                             15, "every trace message received")
            assert await stop_bridge(bridge, task) == 0  # the drain exports what was queued
            arrived = exported_traces(rx)
            assert arrived <= set(published)
            queue_full = m.value("nats_otel_messages_dropped_total", {"reason": "queue_full"})
            slow = m.value("nats_otel_messages_dropped_total", {"reason": "slow_consumer"})
            other = sum(m.value("nats_otel_messages_dropped_total", {"reason": r})
                        for r in ("export_failed", "export_invalid", "drain_timeout"))
            assert queue_full > 0 and other == 0
            assert slow == 0 or "queue_bytes" in bound
            assert queue_full + slow == len(published) - len(arrived)
        finally:
            await nc.close()
            if not task.done():
                await stop_bridge(bridge, task)
