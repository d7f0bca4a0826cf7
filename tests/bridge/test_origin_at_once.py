"""Core mode maps a report at its origin at once and only downstream reports wait out
`link.wait` (their upstream's evidence may still be on its way): against a real
nats-server, the real corpus published raw and a real OTLP receiver, the origin reports'
spans arrive well before the window ends and the downstream reports' only after it,
every span once."""

from __future__ import annotations

import time
from pathlib import Path

import nats
import pytest

from nats_otel.bridge.settings import load_settings
from nats_otel.core import reference
from nats_otel.core.pipeline import Converted, Prepared
from nats_otel.devkit.processes import start_topology
from nats_otel.devkit.receivers import OTLPGrpcReceiver
from nats_otel.devkit.topology import single_server
from tests.bridge.bridge_helpers import bridge_counts, start_bridge, stop_bridge, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

WAIT = 6.0  # link.wait: long, so "before" and "after" cannot be confused on a loaded machine


async def test_origin_reports_are_exported_before_the_link_window_ends(tmp_path: Path, corpus_raws) -> None:
    converter = reference.Converter()
    origin_spans = downstream_spans = 0
    for raw in corpus_raws:
        result = converter.convert(raw)
        assert isinstance(result, Converted)
        if type(prepared := reference.prepare(raw)) is Prepared and prepared.arrival is None:
            origin_spans += len(result.spans)
        else:
            downstream_spans += len(result.spans)
    assert origin_spans and downstream_spans  # the corpus has both
    with start_topology(single_server(), tmp_path / "nats") as topo, OTLPGrpcReceiver() as rx:
        url = topo.client_url("n1", "a")
        settings = load_settings(env={}, overrides={
            "sources": [{"urls": [url], "subjects": ["trace.corpus"]}],
            "otlp": {"endpoint": rx.endpoint, "timeout": 5.0},
            "batch": {"max_messages": 64, "max_delay": 0.05},
            "link": {"wait": WAIT},
        })
        bridge, task = await start_bridge(settings)
        try:
            nc = await nats.connect(url)
            started = time.time()
            for raw in corpus_raws:
                headers = {k: v[0] for k, v in raw.headers.items()} if raw.headers else None
                await nc.publish("trace.corpus", raw.payload, headers=headers)
            await nc.flush()
            await nc.close()
            await wait_until(lambda: rx.span_count >= origin_spans + downstream_spans, 40, "every span",
                             detail=lambda: bridge_counts(bridge))
        finally:
            assert await stop_bridge(bridge, task) == 0
    arrivals = [(r.received_at, sum(len(ss.spans) for rs in r.request.resource_spans for ss in rs.scope_spans))
                for r in rx.received]
    early = sum(n for at, n in arrivals if at < started + WAIT / 2)
    after_window = sum(n for at, n in arrivals if at >= started + WAIT)
    assert early == origin_spans
    assert after_window == downstream_spans
    assert rx.span_count == origin_spans + downstream_spans
