"""JetStream mode under faults: a backend outage, and a bridge killed with SIGKILL.

At least once: every trace message the server published becomes spans at the receiver,
checked against `convert` of the raw messages the bridge archived."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest
import yaml

from nats_otel.bridge.loop import Bridge
from nats_otel.bridge.settings import load_settings
from nats_otel.devkit.processes import start_topology
from nats_otel.devkit.receivers import OTLPGrpcReceiver, OTLPHttpReceiver
from nats_otel.devkit.server_config import free_ports
from nats_otel.devkit.topology import single_server
from tests.bridge.bridge_helpers import (
    archived,
    delete_stream,
    expected_from_archive,
    metric,
    publish_traced,
    scrape,
    span_values,
    start_bridge,
    stop_bridge,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]

FAST_RETRY = {"timeout": 1.0, "retry_max_elapsed": 0.5, "retry_initial_backoff": 0.05, "retry_max_backoff": 0.2}
FAST_JS = {"create_stream": True, "ack_wait": 5.0, "nak_delay_initial": 0.1, "nak_delay_max": 0.5,
           "max_ack_pending": 50, "fetch_batch": 20}


@pytest.fixture(scope="module")
def server() -> Iterator:
    with start_topology(single_server(jetstream=True)) as running:
        yield running


async def stream_messages(url: str, stream: str) -> int:
    nc = await nats.connect(url)
    try:
        return (await nc.jetstream().stream_info(stream)).state.messages
    finally:
        await nc.close()


async def test_backend_outage_then_back_loses_nothing(server, tmp_path: Path) -> None:
    url = server.client_url("n1", "a")
    archive = tmp_path / "archive.jsonl"
    with OTLPHttpReceiver() as rx:
        settings = load_settings(env={}, overrides={
            "mode": "jetstream", "archive": str(archive),
            "sources": [{"urls": [url], "subjects": ["trace.a"]}],
            "jetstream": {**FAST_JS, "stream": "OUTAGE", "durable": "outage"},
            "otlp": {**FAST_RETRY, "endpoint": rx.endpoint, "protocol": "http/protobuf"},
            "telemetry": {"metrics_port": 0, "metrics_host": "127.0.0.1"},
        })
        bridge = Bridge(settings)
        task = asyncio.create_task(bridge.run())
        await wait_until(lambda: bridge.ready()[0], 15, "bridge ready")
        try:
            # Phase 1: the backend answers 503 while messages flow.
            rx.unavailable = True
            traces = await publish_traced(url, 60)
            await wait_until(lambda: bridge.metrics.value("nats_otel_jetstream_acks_total", {"kind": "nak"}) >= 1,
                             10, "naks during the outage")
            assert rx.span_count == 0 and rx.rejected_count >= 1
            assert not bridge.ready()[0]
            rx.unavailable = False
            # Phase 2: the backend is gone altogether (connection refused), then back.
            await wait_until(lambda: rx.span_count >= 120, 20, "spans after the 503 outage")
            rx.stop()
            traces += await publish_traced(url, 40)
            await wait_until(lambda: bridge.metrics.value("nats_otel_export_failures_total",
                                                          {"exporter": "otlp-http"}) >= 2, 10, "failures while down")
            await asyncio.sleep(0.5)
            rx.start()
            assert await stream_messages(url, "OUTAGE") == 100
            await wait_until(lambda: {tid for tid, _ in archived(archive)} >= set(traces), 20, "all archived")
            expected, rejected = expected_from_archive(archive)
            assert rejected == 0
            await wait_until(lambda: span_values(rx.requests) >= expected, 30, "every span after the outage")
            assert span_values(rx.requests) == expected
            assert {s.trace_id.hex() for _, s in rx.spans()} == set(traces)
            await wait_until(lambda: metric(scrape(bridge.metrics_port)[1], "nats_otel_jetstream_acks_total",
                                            kind="ack") >= 100, 10, "every message acked")
            _, text = scrape(bridge.metrics_port)
            assert metric(text, "nats_otel_messages_dropped_total", reason="export_failed") == 0
        finally:
            bridge.request_stop()
            assert await asyncio.wait_for(task, 15) == 0
            await delete_stream(url, "OUTAGE")


def start_bridge_process(config: Path, port: int, log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "nats_otel.cli", "bridge", "--config", str(config), "--metrics-port", str(port),
         "--mode", "jetstream", "--create-stream"],
        stdout=subprocess.DEVNULL, stderr=open(log, "ab"), start_new_session=True,
    )


async def test_sigkill_mid_stream_then_restart_loses_nothing_and_sigterm_drains(server, tmp_path: Path) -> None:
    url = server.client_url("n1", "a")
    archive = tmp_path / "archive.jsonl"
    config = tmp_path / "bridge.yaml"
    config.write_text(yaml.safe_dump({
        "sources": [{"name": "a", "urls": [url], "subjects": ["trace.a"]}],
        "jetstream": {**FAST_JS, "stream": "KILL", "durable": "kill"},
        "otlp": {**FAST_RETRY},
        "archive": str(archive),
        "telemetry": {"metrics_host": "127.0.0.1"},
    }))
    (port,) = free_ports(1)
    log = tmp_path / "bridge.log"
    with OTLPGrpcReceiver() as rx:
        env_endpoint = rx.endpoint
        os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = env_endpoint  # the standard variable picks the backend
        try:
            proc = start_bridge_process(config, port, log)
        finally:
            del os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"]
        try:
            await wait_until(lambda: scrape_ok(port, "/readyz"), 20, "bridge process ready")
            rx.response_delay = 0.05  # slow backend: the kill lands with work in flight
            first = asyncio.create_task(publish_traced(url, 150))
            await wait_until(lambda: rx.span_count >= 20, 20, "first spans")
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            traces = await first
            traces += await publish_traced(url, 50)
            exported_before = rx.span_count
            assert exported_before < 400  # the kill did interrupt the stream
            rx.response_delay = 0.0
            os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = env_endpoint
            try:
                proc = start_bridge_process(config, port, log)
            finally:
                del os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"]
            assert await stream_messages(url, "KILL") == 200
            await wait_until(lambda: {tid for tid, _ in archived(archive)} >= set(traces), 30, "all archived")
            expected, _ = expected_from_archive(archive)
            await wait_until(lambda: span_values(rx.requests) >= expected, 30, "every span after the restart")
            assert span_values(rx.requests) == expected
            assert {s.trace_id.hex() for _, s in rx.spans()} == set(traces)
            # The batch in flight at the kill was exported but never acked: redelivered after
            # ack_wait, exported again (identical spans), acked.
            await wait_until_async(lambda: consumer_settled(url, "KILL", "kill"), 15, "redelivery acked")
            assert span_values(rx.requests) == expected
            # Graceful stop: SIGTERM mid-export drains: exit 0, everything fetched acked.
            rx.response_delay = 0.2
            requests_before = rx.request_count
            late = asyncio.create_task(publish_traced(url, 30))
            await wait_until(lambda: rx.request_count > requests_before, 10, "export under way")
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(15) == 0
            traces += await late
            nc = await nats.connect(url)
            info = await nc.jetstream().consumer_info("KILL", "kill")
            await nc.close()
            assert info.num_ack_pending == 0
            expected, _ = expected_from_archive(archive)
            assert span_values(rx.requests) == expected
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
            await delete_stream(url, "KILL")
    assert '"level": "info"' in log.read_text()  # structured (JSON) logs


async def consumer_settled(url: str, stream: str, durable: str) -> bool:
    nc = await nats.connect(url)
    try:
        info = await nc.jetstream().consumer_info(stream, durable)
        return info.num_pending == 0 and info.num_ack_pending == 0
    finally:
        await nc.close()


async def wait_until_async(predicate, timeout: float, what: str) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not await predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.2)


def scrape_ok(port: int, path: str) -> bool:
    try:
        return scrape(port, path)[0] == 200
    except OSError:
        return False


def refuse_poison(request) -> str | None:
    """A backend that finds spans on `app.poison` invalid (as a schema check might)."""
    for rs in request.resource_spans:
        for ss in rs.scope_spans:
            for span in ss.spans:
                for kv in span.attributes:
                    if kv.key == "messaging.destination.name" and kv.value.string_value == "app.poison":
                        return "span refused: app.poison is not allowed here"
    return None


@pytest.mark.parametrize(("mode", "protocol", "workers"),
                         [("jetstream", "grpc", 1), ("core", "http/protobuf", 1), ("jetstream", "http/protobuf", 2)])
async def test_spans_refused_as_invalid_cost_only_their_message(server, tmp_path: Path, mode: str,
                                                                 protocol: str, workers: int) -> None:
    """A 400 / INVALID_ARGUMENT must not be retried (OTLP), nor take its batch down with it:
    the batch is sent again message by message, the refused message is dropped and counted
    (JetStream: terminated, not redelivered forever), every other span arrives."""
    url = server.client_url("n1", "a")
    stream = f"POISON_{mode.upper()}_{workers}"
    receiver = OTLPGrpcReceiver() if protocol == "grpc" else OTLPHttpReceiver()
    with receiver as rx:
        rx.refuse = refuse_poison
        settings = load_settings(env={}, overrides={
            "mode": mode,
            "sources": [{"urls": [url], "subjects": ["trace.a"]}],
            "jetstream": {**FAST_JS, "stream": stream, "durable": stream.lower()},
            "batch": {"max_messages": 100, "max_delay": 0.5, "workers": workers},
            "otlp": {**FAST_RETRY, "endpoint": rx.endpoint, "protocol": protocol},
            "telemetry": {"metrics_port": 0, "metrics_host": "127.0.0.1"},
        })
        bridge, task = await start_bridge(settings)
        try:
            good = await publish_traced(url, 20)
            poison = await publish_traced(url, 1, subject="app.poison")
            good += await publish_traced(url, 20)
            await wait_until(lambda: {s.trace_id.hex() for _, s in rx.spans()} >= set(good), 20,
                             "every good trace")
            await wait_until(lambda: bridge.metrics.value("nats_otel_messages_dropped_total",
                                                          {"reason": "export_invalid"}) >= 1, 10, "the drop counted")
            assert poison[0] not in {s.trace_id.hex() for _, s in rx.spans()}
            assert rx.span_count == 2 * len(good)  # ingress + egress per trace, nothing twice
            refused = rx.rejected_count
            # No retry of the refused message: one would come within the retry policy's bound.
            await asyncio.sleep(settings.otlp.retry_max_elapsed + settings.otlp.timeout)
            assert rx.rejected_count == refused
            m = bridge.metrics
            assert m.value("nats_otel_messages_dropped_total", {"reason": "export_invalid"}) == 1
            assert m.value("nats_otel_messages_dropped_total", {"reason": "export_failed"}) == 0
            assert m.value("nats_otel_spans_rejected_by_backend_total", {"exporter": bridge_exporter(protocol)}) == 2
            if mode == "jetstream":
                assert m.value("nats_otel_jetstream_acks_total", {"kind": "term"}) == 1
                assert m.value("nats_otel_jetstream_acks_total", {"kind": "ack"}) == len(good)
                nc = await nats.connect(url)
                info = await nc.jetstream().consumer_info(stream, stream.lower())
                await nc.close()
                assert info.num_ack_pending == 0 and info.num_pending == 0
        finally:
            assert await stop_bridge(bridge, task) == 0
            if mode == "jetstream":
                await delete_stream(url, stream)


def bridge_exporter(protocol: str) -> str:
    return "otlp-grpc" if protocol == "grpc" else "otlp-http"
