"""Small batches converted and exported together (`batch.coalesce`, bridge/ripening.py): a
trickle of trace messages into one bridge makes a batch every `batch.max_delay`, a few each;
with coalescing those that ripen within `batch.coalesce` of the first are exported in one
request. Real nats-server, real OTLP/gRPC receiver; the same trickle with coalescing off is
the comparison, and every span arrives either way."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import nats
import pytest

from nats_otel.bridge.settings import load_settings
from nats_otel.devkit.processes import start_topology, wait_for_interest
from nats_otel.devkit.receivers import OTLPGrpcReceiver
from nats_otel.devkit.topology import single_server
from tests.bridge.bridge_helpers import start_bridge, stop_bridge, traceparent, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

MESSAGES = 60


@pytest.fixture(scope="module")
def topo() -> Iterator:
    with start_topology(single_server()) as running:
        yield running


async def _trickle(topo, coalesce: float) -> tuple[float, int, int]:
    """(export requests, spans received, trace ids received of the trickle's) for one bridge
    fed `MESSAGES` traced messages 30 ms apart (a batch of ~6 every 0.2 s)."""
    receiver = OTLPGrpcReceiver().start()
    settings = load_settings(overrides={
        "sources": [{"name": "a", "urls": [topo.client_url("n1", "a")], "subjects": ["trace.a"]}],
        "otlp": {"endpoint": receiver.endpoint, "protocol": "grpc"},
        "batch": {"coalesce": coalesce},
    }, env={})
    bridge, task = await start_bridge(settings)
    try:
        publisher = await nats.connect(topo.client_url("n1", "a"))
        subscriber = await publisher.subscribe("app.trickle")
        await wait_for_interest(publisher, bridge.sources[0].nc)
        trace_ids = set()
        for _ in range(MESSAGES):
            tp, trace_id, _ = traceparent()
            trace_ids.add(trace_id)
            await publisher.publish("app.trickle", b"work", headers={"traceparent": tp})
            await publisher.flush()
            await asyncio.sleep(0.03)
        for _ in range(MESSAGES):
            await subscriber.next_msg(timeout=5)
        await publisher.close()
        # One server, one report a message: one server span each (and the message's own).
        def traces() -> set[str]:
            return {span.trace_id.hex() for _, span in receiver.spans()} & trace_ids

        await wait_until(lambda: len(traces()) == MESSAGES, 30, "every trace's spans")
        exports = bridge.metrics.value("nats_otel_export_duration_seconds_count", {"exporter": "otlp-grpc"})
        return exports, receiver.span_count, len(traces())
    finally:
        assert await stop_bridge(bridge, task) == 0
        receiver.stop()


async def test_a_trickle_is_exported_in_fewer_larger_requests(topo) -> None:
    off_exports, off_spans, off_traces = await _trickle(topo, 0.0)
    on_exports, on_spans, on_traces = await _trickle(topo, 0.8)  # the default
    assert off_traces == on_traces == MESSAGES
    assert on_spans == off_spans  # the same spans, in fewer requests
    # ~2 s of trickle: off, a request every 0.2 s or so (a batch closes 0.2 s after its first
    # message); on, one for every second or so (its own 0.2 s and the 0.8 s after).
    assert off_exports >= 6, off_exports
    assert on_exports <= 0.6 * off_exports, (on_exports, off_exports)
