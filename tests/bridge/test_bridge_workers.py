"""The bridge with `batch.workers: 2` (worker processes): the same spans as `convert` makes
of the same raw messages, and in JetStream mode no ack before the export succeeded."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest

from nats_otel.archive import read_archive
from nats_otel.bridge.settings import load_settings
from nats_otel.core.pipeline import Converted, convert_batch
from nats_otel.devkit.processes import start_topology
from nats_otel.devkit.receivers import OTLPGrpcReceiver
from nats_otel.devkit.topology import single_server
from tests.bridge.bridge_helpers import (
    archive_lines,
    exemplars,
    expected_from_archive,
    expected_ids_from_archive,
    exported_spans,
    metric,
    scrape,
    scrape_openmetrics,
    span_ids,
    span_values,
    start_bridge,
    stop_bridge,
    wait_until,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from corpus_replay import replicate

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def topo() -> Iterator:
    with start_topology(single_server(jetstream=True)) as running:
        yield running


async def publish_raws(url: str, subject: str, count: int, seed: str) -> int:
    nc = await nats.connect(url)
    try:
        for raw in replicate(count, seed=seed):
            headers = {k: v[0] for k, v in raw.headers.items()} or None
            await nc.publish(subject, raw.payload, headers=headers)
        await nc.flush()
    finally:
        await nc.close()
    return count


def settings_for(topo, tmp_path: Path, endpoint: str, mode: str, subject: str, **extra):
    return load_settings(overrides={
        "mode": mode,
        "sources": [{"name": "a", "urls": [topo.client_url("n1", "a")], "subjects": [subject]}],
        "otlp": {"endpoint": endpoint, "retry_max_elapsed": 1.0, "timeout": 2.0},
        "archive": str(tmp_path / "archive.jsonl"),
        "telemetry": {"metrics_port": 0, "metrics_host": "127.0.0.1"},
        "batch": {"workers": 2, "max_delay": 0.05, "max_messages": 64},
        **extra,
    }, env={})


async def test_core_workers_equal_convert(topo, tmp_path: Path) -> None:
    with OTLPGrpcReceiver() as rx:
        bridge, task = await start_bridge(settings_for(topo, tmp_path, rx.endpoint, "core", "bench.workers"))
        try:
            assert bridge.workers is not None and len(bridge.workers.pids()) == 2
            sent = await publish_raws(topo.client_url("n1", "a"), "bench.workers", 600, "workers-core")
            await wait_until(lambda: archive_lines(tmp_path / "archive.jsonl") >= sent, 30, "all archived")
            expected, rejected = expected_from_archive(tmp_path / "archive.jsonl")
            await wait_until(lambda: len(span_values(rx.requests)) >= len(expected), 30, "all spans exported")
            # The receiver has the spans a moment before the worker's outcome is counted.
            await wait_until(lambda: bridge.metrics.value("nats_otel_spans_exported_total", {"exporter": "otlp-grpc"})
                             >= rx.span_count, 10, "the last batch counted")
            _, text = scrape(bridge.metrics_port)
            openmetrics = scrape_openmetrics(bridge.metrics_port)
        finally:
            assert await stop_bridge(bridge, task) == 0
        # Byte-identical spans (ids and links included): sharding kept each trace's reports together.
        assert span_values(rx.requests) == expected
        assert metric(text, "nats_otel_messages_decoded_total") == sent - rejected
        # Identical copies (ad-hoc traces replicated byte for byte) give identical spans: count them all.
        converted = convert_batch(read_archive([str(tmp_path / "archive.jsonl")]))
        span_total = sum(len(r.spans) for r in converted if isinstance(r, Converted))
        assert metric(text, "nats_otel_spans_exported_total", exporter="otlp-grpc") == span_total == rx.span_count
        assert metric(text, "nats_otel_hop_links_total", result="matched") > 0  # hops were linked in the workers
        # The workers' network samples reach the parent's /metrics: one per hop (an identical
        # copy's hop is linked again but counted once), one per report.
        hops = [r.network.hop for r in converted if isinstance(r, Converted) and r.network and r.network.hop]
        assert sum_of(text, "nats_otel_hop_latency_seconds_count") == len(hops) > 0
        assert len(hops) <= metric(text, "nats_otel_hop_links_total", result="matched")
        assert sum_of(text, "nats_otel_hop_latency_seconds_sum") == pytest.approx(
            sum(h.latency_ns for h in hops) / 1e9, abs=1e-9 * len(hops))
        assert sum_of(text, "nats_otel_server_latency_seconds_count") == sum(
            isinstance(r, Converted) for r in converted)
        # Exemplars from the workers' samples: on every edge crossed, each naming an exported
        # span (the downstream server's) of a trace that crossed it, with that crossing's latency.
        samples = {(r.network.trace_id.hex(), r.network.span_id.hex()): r.network
                   for r in converted if isinstance(r, Converted) and r.network}
        exported = exported_spans(rx.requests)
        by_edge: dict[tuple[str, ...], int] = {}
        for series, names, value in exemplars(openmetrics, "nats_otel_hop_latency_seconds"):
            key = (names["trace_id"], names["span_id"])
            assert key in exported and key in samples
            hop = samples[key].hop
            assert hop is not None and abs(hop.latency_ns / 1e9 - value) <= 1e-6
            edge = (series["from_server"], series["to_server"], series["kind"])
            assert edge == hop[:3]
            by_edge[edge] = by_edge.get(edge, 0) + 1
        assert set(by_edge) == {h[:3] for h in hops}
        in_server = exemplars(openmetrics, "nats_otel_server_latency_seconds")
        assert in_server and all((n["trace_id"], n["span_id"]) in exported for _, n, _ in in_server)


async def test_jetstream_workers_ack_only_after_export(topo, tmp_path: Path) -> None:
    rx = OTLPGrpcReceiver(keep_requests=True).start()
    settings = settings_for(topo, tmp_path, rx.endpoint, "jetstream", "bench.jsworkers",
                            jetstream={"stream": "WORKERS", "durable": "w", "create_stream": True,
                                       "ack_wait": 20, "nak_delay_initial": 0.2, "nak_delay_max": 0.5})
    bridge, task = await start_bridge(settings)
    rx.unavailable = True  # once ready: readiness needs the backend to have answered
    try:
        sent = await publish_raws(topo.client_url("n1", "a"), "bench.jsworkers", 300, "workers-js")
        await wait_until(lambda: metric(scrape(bridge.metrics_port)[1], "nats_otel_jetstream_acks_total",
                                        kind="nak") > 0, 30, "failed exports nak'ed")
        _, text = scrape(bridge.metrics_port)
        assert rx.rejected_count > 0 and rx.span_count == 0
        assert metric(text, "nats_otel_jetstream_acks_total", kind="ack") == 0
        rx.unavailable = False
        await wait_until(lambda: metric(scrape(bridge.metrics_port)[1], "nats_otel_jetstream_acks_total", kind="ack")
                         + metric(scrape(bridge.metrics_port)[1], "nats_otel_jetstream_acks_total", kind="term")
                         >= sent, 60, "every message settled")
    finally:
        assert await stop_bridge(bridge, task) == 0
        rx.stop()
    # At least once: every span of every archived (possibly redelivered) message arrived.
    expected, _ = expected_from_archive(tmp_path / "archive.jsonl")
    assert expected and span_values(rx.requests) == expected


async def test_jetstream_worker_killed_bridge_exits_2_and_restart_loses_nothing(topo, tmp_path: Path) -> None:
    """A worker process SIGKILLed (an OOM kill, say) stops the whole bridge with exit code 2
    (so a supervisor restarts it), idle or busy; after the restart JetStream redelivers what
    was not acked and every span arrives."""
    with OTLPGrpcReceiver() as rx:
        settings = settings_for(topo, tmp_path, rx.endpoint, "jetstream", "bench.jskill",
                                jetstream={"stream": "WKILL", "durable": "wkill", "create_stream": True,
                                           "ack_wait": 5, "nak_delay_initial": 0.1, "nak_delay_max": 0.5})
        bridge, task = await start_bridge(settings)
        sent = await publish_raws(topo.client_url("n1", "a"), "bench.jskill", 200, "workers-kill")
        await wait_until(lambda: rx.span_count > 0, 30, "first spans")
        # Hold the second half un-acked (the backend refuses it) so the kill is certain to
        # hit messages in flight: on a fast machine the first half may be all acked already.
        rx.unavailable = True
        sent += await publish_raws(topo.client_url("n1", "a"), "bench.jskill", 200, "workers-kill-2")
        await wait_until(lambda: bridge.metrics.value("nats_otel_jetstream_acks_total", {"kind": "nak"}) > 0,
                         30, "exports of the second half failing")
        victim = bridge.workers.pids()[0]
        os.kill(victim, signal.SIGKILL)
        assert await asyncio.wait_for(task, 30) == 2
        assert not bridge.healthy()[0] and "exited" in bridge.healthy()[1]
        rx.unavailable = False

        bridge, task = await start_bridge(settings)
        try:
            assert victim not in bridge.workers.pids()
            await wait_until(lambda: bridge.metrics.value("nats_otel_jetstream_acks_total", {"kind": "ack"})
                             + bridge.metrics.value("nats_otel_jetstream_acks_total", {"kind": "term"}) > 0,
                             30, "the restarted bridge settles messages")
            nc = await nats.connect(topo.client_url("n1", "a"))
            try:
                async def all_settled() -> bool:
                    info = await nc.jetstream().consumer_info("WKILL", "wkill")
                    return info.num_pending == 0 and info.num_ack_pending == 0
                deadline = asyncio.get_running_loop().time() + 60
                while not await all_settled():
                    assert asyncio.get_running_loop().time() < deadline, "stream not drained after the restart"
                    await asyncio.sleep(0.2)
                assert (await nc.jetstream().stream_info("WKILL")).state.messages == sent
            finally:
                await nc.close()
        finally:
            assert await stop_bridge(bridge, task) == 0
    # At least once across the kill: every span of every archived message arrived, with its
    # id. (A downstream report redelivered without its upstream's - acked before the kill -
    # cannot be linked again: it arrives under the producer span, `messaging.nats.trace.link`.)
    assert span_ids(rx.requests) == expected_ids_from_archive(tmp_path / "archive.jsonl")


def sum_of(text: str, name: str) -> float:
    """The sum of every sample of `name` (all label sets) in Prometheus text."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith((name + "{", name + " ")))
