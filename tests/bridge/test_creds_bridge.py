"""JWT/creds authentication (operator mode): the bridge, started as a user would start it
(`nats-otel bridge --creds FILE`), exports spans with a user that may only subscribe to the
trace subject, and never shows the user's seed in its logs or on /metrics."""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import sys
from pathlib import Path

import nats
import pytest

from nats_otel.devkit.processes import find_nats_server
from nats_otel.devkit.receivers import OTLPGrpcReceiver
from nats_otel.devkit.server_config import free_ports
from tests.bridge.bridge_helpers import scrape, spans_by_trace, traceparent, wait_until
from tests.bridge.jwt_creds import operator_setup

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


async def test_bridge_with_creds_least_privilege(tmp_path: Path) -> None:
    setup = operator_setup(tmp_path, bridge_subjects=["trace.a"])
    client, metrics_port = free_ports(2)
    conf = tmp_path / "server.conf"
    conf.write_text(f"listen: 127.0.0.1:{client}\n" + setup.server_config)
    with open(tmp_path / "server.log", "w") as server_log, open(tmp_path / "bridge.log", "w") as bridge_log:
        server = subprocess.Popen([find_nats_server(), "-c", str(conf)], stderr=server_log)
        bridge = None
        url = f"nats://127.0.0.1:{client}"
        try:
            with OTLPGrpcReceiver() as rx:
                # The bridge user really is restricted: publishing is refused.
                errors: list[Exception] = []

                async def on_error(exc: Exception) -> None:
                    errors.append(exc)

                await wait_until(lambda: _listening(client), 10, "nats-server listening")
                probe = await nats.connect(url, user_credentials=str(setup.bridge_creds), error_cb=on_error)
                await probe.publish("trace.a", b"x")
                await probe.flush()
                await asyncio.sleep(0.3)
                await probe.close()
                bridge = subprocess.Popen(
                    [sys.executable, "-m", "nats_otel.cli", "bridge", "--nats-url", url,
                     "--creds", str(setup.bridge_creds), "--subject", "trace.a", "--otlp-endpoint", rx.endpoint,
                     "--metrics-port", str(metrics_port), "--log-level", "DEBUG"],
                    stdout=bridge_log, stderr=subprocess.STDOUT,
                )
                await wait_until(lambda: _ready(metrics_port), 20, "bridge ready")
                app = await nats.connect(url, user_credentials=str(setup.app_creds))
                sent = []
                for _ in range(10):
                    header, trace_id, _ = traceparent()
                    sent.append(trace_id)
                    # Operator-mode account without msg_trace: trace ad hoc, keyed by the traceparent.
                    await app.publish("orders.new", b"{}",
                                      headers={"traceparent": header, "Nats-Trace-Dest": "trace.a"})
                await app.flush()
                await app.close()
                await wait_until(lambda: set(sent) <= set(spans_by_trace(rx.requests)), 20, "spans of every message")
                _, metrics_text = scrape(metrics_port)
                bridge.send_signal(signal.SIGTERM)
                assert bridge.wait(20) == 0
            assert any("permissions violation" in str(e).lower() for e in errors), errors
            logs = (tmp_path / "bridge.log").read_text()
            for seed in setup.secret_seeds:
                assert seed not in logs and seed not in metrics_text
            assert "NATS connected" in logs
        finally:
            if bridge is not None and bridge.poll() is None:
                bridge.kill()
                bridge.wait()
            server.terminate()
            server.wait(10)


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _ready(port: int) -> bool:
    try:
        return scrape(port, "/readyz")[0] == 200
    except OSError:
        return False
