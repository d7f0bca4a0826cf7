"""A burst with default settings, as a user would see it: `nats-otel bridge` as a process (only
URL, subject, endpoint and metrics port given), one publisher process sending 60,000 traced
messages as fast as it can, a real nats-server and a real OTLP/gRPC receiver.

Asserted: >= 95 % of the trace messages arrive as spans; arrived + every drop the bridge
counted == published, exactly; /metrics shows the intake's depth in messages and bytes and
its bound; the bridge's peak RSS stays within its intake bound plus its own baseline.
And a drain that runs out of time with a full intake counts what it could not export.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from nats_otel.devkit.processes import start_topology
from nats_otel.devkit.receivers import OTLPGrpcReceiver
from nats_otel.devkit.server_config import free_ports
from nats_otel.devkit.topology import single_server
from tests.bridge.bridge_helpers import metric, scrape, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

BURST = 60_000
SPANS_PER_MESSAGE = 2  # ingress + egress: one subscriber on the one server
DROP_REASONS = ("queue_full", "slow_consumer", "export_failed", "export_invalid", "drain_timeout")
ROOT = Path(__file__).resolve().parents[2]


def _peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def _ready(port: int) -> bool:
    try:
        return scrape(port, "/readyz")[0] == 200
    except OSError:
        return False


async def test_burst_of_60k_default_settings_arrives_and_every_drop_is_counted(tmp_path: Path) -> None:
    (port,) = free_ports(1)
    with start_topology(single_server(), tmp_path / "nats") as topo, OTLPGrpcReceiver(keep_requests=False) as rx:
        url = topo.client_url("n1", "a")
        env = {**os.environ, "NATS_OTEL_TELEMETRY__METRICS_HOST": "127.0.0.1"}
        log = open(tmp_path / "bridge.log", "wb")  # noqa: SIM115 - closed below
        bridge = subprocess.Popen(
            [sys.executable, "-m", "nats_otel.cli", "bridge", "--nats-url", url, "--subject", "trace.a",
             "--otlp-endpoint", rx.endpoint, "--metrics-port", str(port), "--log-level", "WARNING"],
            stdout=subprocess.DEVNULL, stderr=log, env=env, start_new_session=True)
        try:
            await wait_until(lambda: _ready(port), 30, "bridge ready")
            _, page = scrape(port)
            assert metric(page, "nats_otel_queue_limit_bytes") == 256 * 1024 * 1024  # the default
            publisher = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "tests.bridge.burst_publisher", url, str(BURST),
                stdout=asyncio.subprocess.PIPE, cwd=ROOT, env=env)
            peak_depth = peak_bytes = 0.0

            def settled() -> bool:
                nonlocal peak_depth, peak_bytes
                _, text = scrape(port)
                peak_depth = max(peak_depth, metric(text, "nats_otel_queue_depth"))
                peak_bytes = max(peak_bytes, metric(text, "nats_otel_queue_bytes"))
                dropped = sum(metric(text, "nats_otel_messages_dropped_total", reason=r) for r in DROP_REASONS)
                return rx.span_count // SPANS_PER_MESSAGE + dropped >= BURST

            out, _ = await publisher.communicate()
            assert publisher.returncode == 0
            published = json.loads(out)
            await wait_until(settled, 180, "every trace message arrived or counted", interval=0.25)
            await asyncio.sleep(1.0)  # nothing more may come: no double counting
            _, text = scrape(port)
            rss = _peak_rss(bridge.pid)
        finally:
            if bridge.poll() is None:
                bridge.send_signal(signal.SIGTERM)
            code = bridge.wait(30)
            log.close()
        assert code == 0
    arrived = rx.span_count // SPANS_PER_MESSAGE
    drops = {r: metric(text, "nats_otel_messages_dropped_total", reason=r) for r in DROP_REASONS}
    received = metric(text, "nats_otel_messages_received_total", source="default")
    summary = (f"published {BURST:,} in {published['seconds']:.2f}s; received {received:,.0f}, arrived "
               f"{arrived:,}, drops {drops}; intake peak {peak_depth:,.0f} msgs / {peak_bytes / 2**20:.1f} MiB; "
               f"bridge peak RSS {rss / 2**20:.0f} MiB")
    print(summary)
    assert rx.span_count % SPANS_PER_MESSAGE == 0, summary
    assert arrived + sum(drops.values()) == BURST, summary  # nothing lost uncounted
    assert received == BURST, summary  # the server delivered every trace message to the bridge
    assert arrived >= 0.95 * BURST, summary
    assert rss < 256 * 2**20 + 200 * 2**20, summary  # the intake's bound plus the bridge's own ~150 MB


async def test_drain_out_of_time_counts_what_still_waits(tmp_path: Path) -> None:
    """SIGTERM (here: request_stop) with more waiting than a slow backend takes within
    `drain_timeout`: exit code 1, and every received message is exported or counted lost
    (`drain_timeout` for what still waited, `export_failed` for a batch cut off by the deadline)."""
    from nats_otel.bridge.settings import load_settings
    from tests.bridge.bridge_helpers import publish_traced, start_bridge, stop_bridge

    with start_topology(single_server(), tmp_path / "nats") as topo, OTLPGrpcReceiver() as rx:
        url = topo.client_url("n1", "a")
        settings = load_settings(env={}, overrides={
            "sources": [{"urls": [url], "subjects": ["trace.a"]}], "drain_timeout": 0.5,
            "otlp": {"endpoint": rx.endpoint, "timeout": 2.0, "retry_max_elapsed": 0.5},
            "batch": {"max_messages": 10, "max_delay": 0.01},
        })
        bridge, task = await start_bridge(settings)
        rx.response_delay = 0.3  # ~33 messages/s: 300 take ~9 s
        published = await publish_traced(url, 300)
        m = bridge.metrics
        await wait_until(lambda: m.value("nats_otel_messages_received_total", {"source": "default"}) >= 300,
                         15, "every trace message received")
        assert await stop_bridge(bridge, task) == 1
        exported = m.value("nats_otel_spans_exported_total", {"exporter": "otlp-grpc"}) / SPANS_PER_MESSAGE
        drops = {r: m.value("nats_otel_messages_dropped_total", {"reason": r}) for r in DROP_REASONS}
        assert drops["drain_timeout"] > 200, drops
        assert exported + sum(drops.values()) == len(published), (exported, drops)
        # A batch cut off by the deadline may still have reached the backend: never fewer arrive.
        arrived = {s.trace_id.hex() for _, s in rx.spans()}
        assert arrived <= set(published) and len(arrived) >= exported
