"""At least once means every link (issue 29, part 3): JetStream mode over a routed cluster and
a leafnode, batches of traced messages under one traceparent, an 8 s backend outage, and the
bridge SIGKILLed and restarted during the traffic. Every downstream server span must hang
under its true upstream egress (the truth from the stream's own copy of every trace message,
by order per connection: `devkit.hop_truth`), however the reports were redelivered: the
killed bridge's evidence is kept in the link-evidence stream and replayed at the restart.

`LINK_TEST_RUNS` repeats the scenario (the issue asks for 10 runs in a row; CI runs 2); not a
NATS_OTEL_* variable: the bridge started here would read it as a setting.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import nats
import nats.js.errors
import pytest
import yaml

from nats_otel.archive import archive_record
from nats_otel.bridge.settings import load_settings
from nats_otel.core.decode import RawTraceMessage
from nats_otel.devkit.hop_score import SpanView, score
from nats_otel.devkit.hop_traffic import TrafficOptions, run_traffic
from nats_otel.devkit.hop_truth import compute_truth
from nats_otel.devkit.processes import start_topology
from nats_otel.devkit.receivers import OTLPGrpcReceiver
from nats_otel.devkit.server_config import free_ports
from nats_otel.devkit.topology import demo_topology
from tests.bridge.bridge_helpers import scrape, terminate, wait_until

RUNS = int(os.environ.get("LINK_TEST_RUNS", "2"))
pytestmark = [pytest.mark.integration, pytest.mark.timeout(120 * RUNS + 60)]


def _bridge(config: Path, port: int, log: Path, endpoint: str) -> subprocess.Popen:
    env = {**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint}
    return subprocess.Popen([sys.executable, "-m", "nats_otel.cli", "bridge", "--config", str(config),
                             "--metrics-port", str(port), "--log-level", "INFO"],
                            stdout=open(log, "ab"), stderr=subprocess.STDOUT, env=env)


def _setup(tmp_path: Path, url: str, settings: dict) -> tuple[Path, int, Path]:
    """A JetStream-mode bridge's config file (one source on `url` for trace.a, `settings`
    beside), a free metrics port and its log file."""
    config = tmp_path / "bridge.yaml"
    config.write_text(yaml.safe_dump({"mode": "jetstream", "sources": [{"name": "a", "urls": [url],
                                                                         "subjects": ["trace.a"]}],
                                      "telemetry": {"metrics_host": "127.0.0.1"}, **settings}))
    (port,) = free_ports(1)
    return config, port, tmp_path / "bridge.log"


def _ready(port: int) -> bool:
    try:
        return scrape(port, "/readyz")[0] == 200
    except OSError:
        return False


async def _stream_raws(url: str, stream: str) -> list[RawTraceMessage]:
    """Every trace message the stream holds: the truth's input (at least once: all of them)."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        for attempt in range(20):  # JetStream may answer 503 a moment (its meta leader, after the traffic)
            try:
                sub = await js.pull_subscribe("trace.a", stream=stream)
                break
            except nats.js.errors.ServiceUnavailableError:
                if attempt == 19:
                    raise
                await asyncio.sleep(0.5)
        raws: list[RawTraceMessage] = []
        unavailable = 0
        while True:
            try:
                msgs = await sub.fetch(500, timeout=1.0)
            except nats.errors.TimeoutError:
                break
            except nats.js.errors.ServiceUnavailableError:  # a 503 on the pull too (2 of 30 runs)
                unavailable += 1
                if unavailable == 20:
                    raise
                await asyncio.sleep(0.5)
                continue
            for msg in msgs:
                raws.append(RawTraceMessage(msg.subject, {k: [v] for k, v in (msg.headers or {}).items()}, msg.data))
            if msgs[-1].metadata.num_pending == 0:
                break
        return raws
    finally:
        await nc.close()


def _server_spans(rx: OTLPGrpcReceiver) -> list[SpanView]:
    views = []
    for _, span in rx.spans():
        if span.kind == _CONSUMER:
            link = next((a.value.string_value for a in span.attributes if a.key == "messaging.nats.trace.link"), "")
            views.append(SpanView(span.span_id, span.parent_span_id, span.kind, link))
    return views


_CONSUMER = 5  # OTLP's SPAN_KIND_CONSUMER: a server span
# The bridge's link window as this test's bridges run it (their config leaves it default).
LINK_WAIT = load_settings(env={}, overrides={"sources": [{"subjects": ["trace.a"]}]}).link.wait


@pytest.mark.parametrize(("mode", "workers"), [("per_message", 1), ("batch", 1), ("batch", 2)])
@pytest.mark.parametrize("run", range(RUNS))
async def test_a_sigkill_and_an_outage_lose_no_link(tmp_path: Path, run: int, mode: str, workers: int) -> None:
    """With `workers` 2, the evidence goes through worker processes (each holds its traces'
    link window) and the hold, too: the same links."""
    with start_topology(demo_topology(), tmp_path / "nats") as topo, OTLPGrpcReceiver() as rx:
        url = topo.client_url("east-1", "a")
        config, port, log = _setup(tmp_path, url, {
            "jetstream": {"stream": "TRACES", "durable": "links", "create_stream": True, "ack_wait": 5.0,
                          "nak_delay_initial": 0.2, "nak_delay_max": 1.0, "max_ack_pending": 200, "fetch_batch": 20},
            "otlp": {"timeout": 1.0, "retry_max_elapsed": 0.5, "retry_initial_backoff": 0.05,
                     "retry_max_backoff": 0.2},
            "batch": {"workers": workers},
        })
        proc = _bridge(config, port, log, rx.endpoint)
        try:
            await wait_until(lambda: _ready(port), 60, "bridge ready")
            urls = {name: topo.client_url(name, "a") for name in topo.names}
            options = TrafficOptions(mode=mode, messages=120, batch_size=10, gap_ms=20.0, seed=29 + run)
            traffic = asyncio.create_task(run_traffic(urls["east-2"], urls, options, settle_s=20))
            await asyncio.sleep(0.8)
            rx.unavailable = True  # the backend goes away for 8 s
            outage_ends = time.monotonic() + 8.0
            await asyncio.sleep(0.7)
            proc.send_signal(signal.SIGKILL)  # with batches fetched, exported or not, acked or not
            proc.wait(10)
            await asyncio.sleep(0.5)
            proc = _bridge(config, port, log, rx.endpoint)
            report = await traffic
            assert report.complete, report.received
            await asyncio.sleep(max(0.0, outage_ends - time.monotonic()))
            rx.unavailable = False
            raws = await _stream_raws(url, "TRACES")
            assert len(raws) == 4 * 120  # a report per server per message: east-2, east-1, east-3, leaf-1
            (tmp_path / "stream.jsonl").write_bytes(b"".join(archive_record(raw) for raw in raws))  # to look into
            truth = compute_truth(raws)
            assert not truth.problems

            def result():  # what the backend accepted
                return score(truth, _server_spans(rx))

            await wait_until(lambda: result().counts["missing"] == 0, 60, "every server span exported")
            counts = result().counts
            assert result().hops == 3 * 120 and counts["wrong"] == 0, counts
            if mode == "per_message":  # the regression: every link, whatever was redelivered when
                assert counts["right"] == 3 * 120, counts
            else:  # batches: what the servers' own numbering leaves undecided stays unlinked, never wrong
                assert counts["right"] >= 0.95 * 3 * 120, counts
            assert result().conflicting_duplicates == 0
        finally:
            terminate(proc)


@pytest.mark.parametrize("run", range(RUNS))
async def test_a_sigkill_before_the_link_wait_ran_out_loses_no_link(tmp_path: Path, run: int) -> None:
    """Issue 36's scenario, to the letter: the bridge on east-1 with default settings but for
    the stream and durable; four bursts of 30 messages sent back to back, each message with
    its own traceparent: on east-1; the backend starts refusing; on leaf-1; 8 s later the
    backend is back; on east-2, and 0.3 s after it (before its `link.wait` of 1 s ran out)
    the bridge is SIGKILLed and restarted at once; on east-1. Every hop is linked."""
    with start_topology(demo_topology(), tmp_path / "nats") as topo, OTLPGrpcReceiver() as rx:
        url = topo.client_url("east-1", "a")
        config, port, log = _setup(tmp_path, url, {"jetstream": {"stream": "TRACES", "durable": "steer-bridge",
                                                                 "create_stream": True}})
        proc = _bridge(config, port, log, rx.endpoint)
        try:
            await wait_until(lambda: _ready(port), 60, "bridge ready")
            urls = {name: topo.client_url(name, "a") for name in topo.names}

            async def burst(server: str, number: int) -> None:
                options = TrafficOptions(mode="per_message", messages=30, gap_ms=0.0, seed=1000 * run + number,
                                         subject="app.orders")
                report = await run_traffic(urls[server], urls, options, settle_s=10)
                assert report.complete, report.received

            await burst("east-1", 1)
            rx.unavailable = True
            await burst("leaf-1", 2)
            await asyncio.sleep(8.0)
            rx.unavailable = False
            await burst("east-2", 3)
            await asyncio.sleep(0.3 * LINK_WAIT)  # before east-2's reports left the link window
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            proc = _bridge(config, port, log, rx.endpoint)
            await burst("east-1", 4)
            raws = await _stream_raws(url, "TRACES")
            assert len(raws) == 4 * 120  # a report per server per message
            (tmp_path / "stream.jsonl").write_bytes(b"".join(archive_record(raw) for raw in raws))
            truth = compute_truth(raws)
            assert not truth.problems

            def result():
                return score(truth, _server_spans(rx))

            await wait_until(lambda: result().counts["missing"] == 0, 90, "every server span exported")
            counts = result().counts
            by_span = {hop.downstream_span_id: hop for hop in truth.hops.values()}
            unlinked = Counter((by_span[v.span_id].link.upstream_server, by_span[v.span_id].link.downstream_server)
                               for v in _server_spans(rx) if v.span_id in by_span and v.link)
            # What the restarted bridge says of its links, to look into (as the stream's copy).
            (tmp_path / "metrics.txt").write_text("\n".join(
                line for line in scrape(port)[1].splitlines() if line.startswith(("nats_otel_link", "nats_otel_hop"))))
            assert result().hops == 3 * 120 and counts["right"] == 3 * 120, (counts, unlinked)
        finally:
            terminate(proc)
