"""Trace identity on real servers: many messages under one traceparent and under one fixed
ad-hoc destination, through a route, a gateway and a leafnode, a server restarted in
between, some trace messages dropped on purpose. Unique span ids, one subtree per message
under the producer span, a trace per ad-hoc message, links only to the right message, and
the live bridge equal to `convert`."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest

from nats_otel.archive import read_archive
from nats_otel.bridge.settings import load_settings
from nats_otel.core.decode import parse_archive_line
from nats_otel.core.linking import MATCHED
from nats_otel.core.pipeline import Converted, convert_batch
from nats_otel.core.records import SpanKind, SpanRecord
from nats_otel.devkit.processes import start_topology, wait_for_interest
from nats_otel.devkit.receivers import OTLPGrpcReceiver
from nats_otel.devkit.topology import full_topology
from tests.bridge.bridge_helpers import (
    archive_lines,
    expected_from_archive,
    metric,
    scrape,
    span_values,
    start_bridge,
    stop_bridge,
    traceparent,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

SUBSCRIBERS = ("east-2", "west-1", "leaf-1")  # a route, a gateway, a leafnode away from east-1


@pytest.fixture(scope="module")
def topo() -> Iterator:
    with start_topology(full_topology()) as running:
        yield running


def body_of(server: SpanRecord) -> int:
    """The traced message's size without the hop header: equal on every server of one message."""
    hop = server.attribute("messaging.nats.trace.hop")
    size = server.attribute("messaging.message.envelope.size")
    assert isinstance(size, int)
    return size - (18 + len(hop) if isinstance(hop, str) else 0)


def check_identity(results: list, producer: bytes) -> list[SpanRecord]:
    """Unique ids; every link joins two reports of the same message (sizes are distinct per
    message here, so a link to another message shows); unlinked spans hang under the producer."""
    spans = [s for r in results if isinstance(r, Converted) for s in r.spans]
    by_id = {s.span_id: s for s in spans}
    assert len(by_id) == len(spans), "two spans share an id"
    for result in results:
        if not isinstance(result, Converted) or not result.link:
            continue
        server = result.spans[0]
        if result.link == MATCHED:
            egress = by_id[server.parent_span_id]
            upstream = by_id[egress.parent_span_id]
            assert body_of(upstream) == body_of(server), "linked to another message's egress"
            assert egress.end_ns <= server.start_ns + 100_000_000
        else:  # under the producer's span; an ad-hoc report is a root
            adhoc = server.attribute("messaging.nats.trace.adhoc_subject")
            assert server.parent_span_id == (b"" if adhoc else producer)
    return spans


async def publish_batch(pub, tp: str | None, count: int, first_size: int, adhoc: str | None = None) -> None:
    """`count` messages under one trace context, each of its own size, 20 ms apart."""
    for i in range(count):
        headers = {"traceparent": tp} if tp else {"Nats-Trace-Dest": adhoc}
        await pub.publish("reuse.work", b"x" * (first_size + i), headers=headers)
        await pub.flush()
        await asyncio.sleep(0.02)


async def test_reused_contexts_through_route_gateway_leaf_and_a_restart(topo, tmp_path: Path) -> None:
    archive = tmp_path / "archive.jsonl"
    settings = load_settings(overrides={
        "sources": [{"name": "a", "urls": [topo.client_url("east-1", "a")], "subjects": ["trace.a"]}],
        "archive": str(archive), "telemetry": {"metrics_port": 0, "metrics_host": "127.0.0.1"},
        "batch": {"max_delay": 0.05},
    }, env={})
    with OTLPGrpcReceiver() as rx:
        settings = settings.model_copy(update={"otlp": settings.otlp.model_copy(update={"endpoint": rx.endpoint})})
        bridge, task = await start_bridge(settings)
        try:
            subs = {name: await nats.connect(topo.client_url(name, "a")) for name in SUBSCRIBERS}
            for nc in subs.values():
                await nc.subscribe("reuse.work")
                await wait_for_interest(nc, bridge.sources[0].nc)
            pub = await nats.connect(topo.client_url("east-1", "a"))
            for nc in subs.values():
                await wait_for_interest(pub, nc)
            tp, trace_id, producer = traceparent()
            await publish_batch(pub, tp, 12, 100)
            await pub.publish("reuse.work", b"y" * 50, headers={"Nats-Trace-Dest": "trace.a"})  # ad hoc, one
            await publish_batch(pub, None, 8, 400, adhoc="trace.a")
            # A restart: east-2 comes back with a new server id and the same name.
            old_id = topo.server_id("east-2")
            for nc in subs.values():
                await nc.close()
            await pub.close()
            await asyncio.to_thread(topo.restart, "east-2")
            assert topo.server_id("east-2") != old_id
            subs = {name: await nats.connect(topo.client_url(name, "a")) for name in SUBSCRIBERS}
            for nc in subs.values():
                await nc.subscribe("reuse.work")
            pub = await nats.connect(topo.client_url("east-1", "a"))
            for nc in subs.values():
                await wait_for_interest(pub, nc)
                await wait_for_interest(nc, bridge.sources[0].nc)
            await publish_batch(pub, tp, 12, 200)  # the same traceparent again
            await pub.close()
            for nc in subs.values():
                await nc.close()
            # 25 + 8 + 1 messages, each reported by east-1 and by every server it crossed.
            # Trace messages are at most once: wait until they stop coming, then check what came.
            await wait_until(lambda: archive_lines(archive) >= 30 * 4, 30, "the trace messages archived")
            seen = -1
            while seen != archive_lines(archive):
                seen = archive_lines(archive)
                await asyncio.sleep(1.0)
            expected, _ = expected_from_archive(archive)  # (the wait below covers link.wait and the export)
            await wait_until(lambda: span_values(rx.requests) >= expected, 30, "every span exported")
            _, text = scrape(bridge.metrics_port)
        finally:
            assert await stop_bridge(bridge, task) == 0
    # The live bridge gave exactly `convert`'s spans (links included).
    assert span_values(rx.requests) == expected
    results = convert_batch(read_archive([str(archive)]))
    spans = check_identity(results, bytes.fromhex(producer))
    links = [r.link for r in results if isinstance(r, Converted) and r.link]
    assert links and all(link == MATCHED for link in links), links  # distinct sizes: all decided
    assert metric(text, "nats_otel_hop_links_total", result="matched") == len(links)
    # Fan-out reads right: one origin span per message (24 sent) under the one producer span.
    origins = [r.spans[0] for r in results if isinstance(r, Converted) and r.link == ""]
    under_producer = [s for s in spans if s.parent_span_id == bytes.fromhex(producer)]
    traced_origins = [s for s in origins if not s.attribute("messaging.nats.trace.adhoc_subject")]
    assert 22 <= len(under_producer) == len(traced_origins)
    assert {s.trace_id.hex() for s in under_producer} == {trace_id}
    # Ad hoc: each of the 9 messages is a trace of its own, holding all its servers' reports.
    adhoc = [s for s in spans if s.kind == SpanKind.CONSUMER and s.attribute("messaging.nats.trace.adhoc_subject")]
    traces: dict[bytes, set[int]] = {}
    for server in adhoc:
        traces.setdefault(server.trace_id, set()).add(body_of(server))
    adhoc_origins = [s for s in origins if s.attribute("messaging.nats.trace.adhoc_subject")]
    assert 8 <= len(traces) == len(adhoc_origins) and all(len(sizes) == 1 for sizes in traces.values())
    assert sum(1 for t in traces if sum(1 for s in adhoc if s.trace_id == t) >= 4) >= len(traces) - 1

    # Trace messages lost on purpose: whatever survives, never a link to another message.
    lines = [line for line in archive.read_bytes().splitlines() if line.strip()]
    for seed in range(5):
        rnd = random.Random(seed)
        kept = [parse_archive_line(line) for line in lines if rnd.random() > 0.3]
        rnd.shuffle(kept)
        check_identity(convert_batch(kept), bytes.fromhex(producer))
