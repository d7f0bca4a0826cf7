"""Small batches converted and exported together (`batch.coalesce`, bridge/ripening.py): a
trickle of trace messages into one bridge makes a batch every `batch.max_delay`, a few each;
with coalescing those that ripen within `batch.coalesce` of the first are exported in one
request. Real nats-server, real OTLP/gRPC receiver; the same trickle with coalescing off is
the comparison, and every span arrives either way. In both modes: JetStream mode's settlers
take their batches the same way, and settle what they exported together (nothing is left
unacked)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import nats
import pytest

from nats_otel.bridge.settings import load_settings
from nats_otel.devkit.processes import start_topology, wait_for_interest
from nats_otel.devkit.receivers import OTLPGrpcReceiver
from nats_otel.devkit.topology import single_server
from tests.bridge.bridge_helpers import delete_stream, start_bridge, stop_bridge, traceparent, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

MESSAGES = 60


@pytest.fixture(scope="module")
def topo() -> Iterator:
    with start_topology(single_server(jetstream=True)) as running:
        yield running


async def _unsettled(url: str, stream: str, durable: str) -> tuple[int, int]:
    """(messages not yet delivered, delivered but not acked) of the bridge's durable."""
    nc = await nats.connect(url)
    try:
        info = await nc.jetstream().consumer_info(stream, durable)
        return info.num_pending, info.num_ack_pending
    finally:
        await nc.close()


async def _trickle(topo, coalesce: float, mode: str) -> tuple[float, int, int]:
    """(export requests, spans received, trace ids received of the trickle's) for one bridge
    fed `MESSAGES` traced messages 30 ms apart (a batch of ~6 every 0.2 s). JetStream mode:
    a stream of its own for the run, and every message acked by the end."""
    receiver = OTLPGrpcReceiver().start()
    url = topo.client_url("n1", "a")
    overrides = {
        "sources": [{"name": "a", "urls": [url], "subjects": ["trace.a"]}],
        "otlp": {"endpoint": receiver.endpoint, "protocol": "grpc"},
        "batch": {"coalesce": coalesce},
    }
    if mode == "jetstream":
        overrides |= {"mode": "jetstream", "jetstream": {"stream": "TRICKLE", "durable": "trickle",
                                                         "create_stream": True}}
    settings = load_settings(overrides=overrides, env={})
    bridge, task = await start_bridge(settings)
    try:
        publisher = await nats.connect(url)
        subscriber = await publisher.subscribe("app.trickle")
        await wait_for_interest(publisher, bridge.sources[0].nc)
        # The bridge is taking trace messages before the trickle (JetStream mode: its durable
        # set up and pulling; else the trickle waits in the stream and comes as one batch):
        # one message first, its spans awaited, its export not counted.
        tp, first_trace, _ = traceparent()
        await publisher.publish("app.trickle", b"work", headers={"traceparent": tp})
        await subscriber.next_msg(timeout=5)
        await wait_until(lambda: first_trace in {span.trace_id.hex() for _, span in receiver.spans()}, 30,
                         "the first message's spans")
        before = bridge.metrics.value("nats_otel_export_duration_seconds_count", {"exporter": "otlp-grpc"})
        spans_before = receiver.span_count
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
        exports = bridge.metrics.value("nats_otel_export_duration_seconds_count", {"exporter": "otlp-grpc"}) - before
        if mode == "jetstream":  # what was exported together was settled together: nothing left
            settled = False
            for _ in range(50):
                if settled := await _unsettled(url, "TRICKLE", "trickle") == (0, 0):
                    break
                await asyncio.sleep(0.1)
            assert settled, await _unsettled(url, "TRICKLE", "trickle")
        return exports, receiver.span_count - spans_before, len(traces())
    finally:
        assert await stop_bridge(bridge, task) == 0
        receiver.stop()
        if mode == "jetstream":
            await delete_stream(url, "TRICKLE")


@pytest.mark.parametrize("mode", ["core", "jetstream"])
async def test_a_trickle_is_exported_in_fewer_larger_requests(topo, mode) -> None:
    off_exports, off_spans, off_traces = await _trickle(topo, 0.0, mode)
    on_exports, on_spans, on_traces = await _trickle(topo, 0.8, mode)  # the default
    assert off_traces == on_traces == MESSAGES
    assert on_spans == off_spans  # the same spans, in fewer requests
    # ~2 s of trickle: off, a request every 0.2 s or so (a batch closes 0.2 s after its first
    # message); on, one for every second or so (its own 0.2 s and the 0.8 s after).
    assert off_exports >= 6, off_exports
    assert on_exports <= 0.6 * off_exports, (on_exports, off_exports)
