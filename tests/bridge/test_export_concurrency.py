"""`batch.exports_in_flight`: the bridge sends that many export requests at once, never more,
so a slow or distant backend costs a round trip per `exports_in_flight` batches, not per
batch; and everything still arrives once, counted."""

from __future__ import annotations

from pathlib import Path

import pytest

from nats_otel.bridge.settings import load_settings
from nats_otel.devkit.processes import start_topology
from nats_otel.devkit.receivers import OTLPGrpcReceiver
from nats_otel.devkit.topology import single_server
from tests.bridge.bridge_helpers import bridge_counts, publish_traced, start_bridge, stop_bridge, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


@pytest.mark.parametrize("in_flight", [1, 3])
async def test_exports_in_flight_bounds_concurrent_requests(tmp_path: Path, in_flight: int) -> None:
    # More receiver threads than the bridge may use: the bridge's bound is what is seen.
    with start_topology(single_server(), tmp_path / "nats") as topo, OTLPGrpcReceiver(max_workers=8) as rx:
        url = topo.client_url("n1", "a")
        settings = load_settings(env={}, overrides={
            "sources": [{"urls": [url], "subjects": ["trace.a"]}],
            "otlp": {"endpoint": rx.endpoint, "timeout": 5.0},
            "batch": {"max_messages": 10, "max_delay": 0.01, "exports_in_flight": in_flight},
            "link": {"wait": 0.2},
        })
        rx.response_delay = 0.3  # a distant backend: requests overlap only if sent at once
        bridge, task = await start_bridge(settings)
        try:
            published = await publish_traced(url, 120)  # 12 batches or more, ready together
            await wait_until(lambda: {s.trace_id.hex() for _, s in rx.spans()} >= set(published), 30,
                             "every trace", detail=lambda: bridge_counts(bridge))
        finally:
            assert await stop_bridge(bridge, task) == 0
        assert rx.max_concurrent == in_flight
        m = bridge.metrics
        assert m.value("nats_otel_messages_decoded_total") == len(published)
        assert m.value("nats_otel_spans_exported_total", {"exporter": "otlp-grpc"}) == rx.span_count
