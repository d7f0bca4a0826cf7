"""Scale-out: two bridge processes share the work - one queue group (core: every span
exactly once) or one durable consumer (JetStream: every span at least once)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nats_otel.archive import read_archive
from nats_otel.core.pipeline import Converted, convert_batch
from nats_otel.devkit.processes import start_topology
from nats_otel.devkit.receivers import OTLPGrpcReceiver
from nats_otel.devkit.server_config import free_ports
from nats_otel.devkit.topology import single_server
from tests.bridge.bridge_helpers import archive_lines, metric, scrape, wait_until
from tests.bridge.test_bridge_workers import publish_raws

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def topo() -> Iterator:
    with start_topology(single_server(jetstream=True)) as running:
        yield running


class BridgeProcess:
    """`nats-otel bridge` as its own process, with its own archive and metrics port."""

    def __init__(self, tmp_path: Path, name: str, args: list[str], port: int | None = None) -> None:
        self.archive = tmp_path / f"{name}.jsonl"
        self.port = port or free_ports(1)[0]
        self.log = open(tmp_path / f"{name}.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "nats_otel.cli", "bridge", *args, "--archive", str(self.archive),
             "--metrics-port", str(self.port), "--log-level", "WARNING"], stderr=self.log)

    def wait_ready(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, (self.log.name, Path(self.log.name).read_text()[-2000:])
            try:
                if scrape(self.port, "/readyz")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"bridge not ready: {Path(self.log.name).read_text()[-2000:]}")

    def metric(self, name: str, **labels: str) -> float:
        return metric(scrape(self.port)[1], name, **labels)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


def span_total(archives: list[Path]) -> int:
    results = convert_batch(read_archive([str(a) for a in archives if a.exists()]))
    return sum(len(r.spans) for r in results if isinstance(r, Converted))


async def run_pair(topo, tmp_path: Path, extra: list[str], subject: str, seed: str, count: int
                   ) -> tuple[OTLPGrpcReceiver, list[BridgeProcess], int]:
    rx = OTLPGrpcReceiver().start()
    common = ["--nats-url", topo.client_url("n1", "a"), "--subject", subject, "--otlp-endpoint", rx.endpoint, *extra]
    # Both ports at once: taken one at a time, the two may be the same (one bridge then exits
    # on EADDRINUSE while the other answers /readyz for both).
    ports = free_ports(2)
    bridges = [BridgeProcess(tmp_path, f"bridge{i}", common, port) for i, port in zip((1, 2), ports, strict=True)]
    try:
        for b in bridges:
            b.wait_ready()
        sent = await publish_raws(topo.client_url("n1", "a"), subject, count, seed)
        await wait_until(lambda: sum(archive_lines(b.archive) for b in bridges) >= sent, 60, "all received")
        await wait_until(lambda: rx.span_count >= span_total([b.archive for b in bridges]), 60, "spans exported",
                         interval=0.5)
        # Per-bridge counts while they still run (and so still serve /metrics).
        for b in bridges:
            b.received = b.metric("nats_otel_messages_received_total", source="default")  # type: ignore[attr-defined]
            b.forwarded = b.metric("nats_otel_routed_total", result="forwarded")  # type: ignore[attr-defined]
    finally:
        codes = [b.stop() for b in bridges]
        rx.stop()
    assert codes == [0, 0]
    return rx, bridges, sent


def traceparent_trace_ids(rx: OTLPGrpcReceiver) -> set[bytes]:
    """Trace ids of the spans traced for a traceparent (ad-hoc ones depend on their links)."""
    spans = [span for _, span in rx.spans()]
    adhoc = {span.trace_id for span in spans
             if any(kv.key == "messaging.nats.trace.adhoc_subject" for kv in span.attributes)}
    return {span.trace_id for span in spans} - adhoc


def archived_span_ids(bridges: list[BridgeProcess]) -> set[bytes]:
    results = convert_batch(read_archive([str(b.archive) for b in bridges if b.archive.exists()]))
    return {s.span_id for r in results if isinstance(r, Converted) for s in r.spans}


def archived_trace_ids(bridges: list[BridgeProcess]) -> set[bytes]:
    results = convert_batch(read_archive([str(b.archive) for b in bridges if b.archive.exists()]))
    return {s.trace_id for r in results if isinstance(r, Converted) for s in r.spans}


async def test_core_queue_group_exactly_once(topo, tmp_path: Path) -> None:
    rx, bridges, sent = await run_pair(topo, tmp_path, ["--queue", "otel"], "scale.core", "scale-core", 1000)
    lines = [archive_lines(b.archive) for b in bridges]
    received = [b.received for b in bridges]  # type: ignore[attr-defined]
    # The queue group split the messages: both bridges received some, none got one twice; each
    # trace's owner archived and mapped its messages (the other forwarded them), each once.
    assert sum(received) == sent and min(received) > 0, received
    assert sum(lines) == sent and min(lines) > 0, lines
    forwarded = [b.forwarded for b in bridges]  # type: ignore[attr-defined]
    assert sum(forwarded) > 0, forwarded
    # Every span exactly once: as many spans arrived as convert makes of the union, no more,
    # with the same ids (ids hash each report's identity, whichever bridge mapped it). Only
    # links may differ: a hop whose two reports went to different bridges is `unmatched`
    # there, and an ad-hoc report without its upstream starts a trace of its own.
    assert rx.span_count == span_total([b.archive for b in bridges])
    assert {span.span_id for _, span in rx.spans()} == archived_span_ids(bridges)
    assert traceparent_trace_ids(rx) <= archived_trace_ids(bridges)


async def test_jetstream_durable_at_least_once(topo, tmp_path: Path) -> None:
    import nats
    from nats.js.api import StreamConfig

    nc = await nats.connect(topo.client_url("n1", "a"))
    await nc.jetstream().add_stream(StreamConfig(name="SCALE", subjects=["scale.js"]))
    await nc.close()
    rx, bridges, sent = await run_pair(topo, tmp_path, ["--mode", "jetstream", "--stream", "SCALE",
                                                        "--durable", "shared"], "scale.js", "scale-js", 1000)
    lines = [archive_lines(b.archive) for b in bridges]
    # One durable consumer: both bridges fetched, together everything (redeliveries may add).
    assert sum(lines) >= sent and min(lines) > 0, lines
    assert rx.span_count >= span_total([b.archive for b in bridges]) >= sent  # nothing lost
    assert {span.span_id for _, span in rx.spans()} == archived_span_ids(bridges)
    assert traceparent_trace_ids(rx) <= archived_trace_ids(bridges)
