"""Outages, with real processes: an OTLP endpoint with nothing behind it (or refusing us), an
unreachable NATS URL, wrong NATS credentials, a NATS server lost and back.

What each asserts: `/readyz` says why the bridge is not ready (which URL, refused,
unreachable, authorization) and never a credential; every failed attempt is logged with
the URL and the reason, in text and JSON logs alike; the wait between attempts grows;
`--nats-give-up-after` ends the bridge with exit code 3.
"""

from __future__ import annotations

import asyncio
import http.server
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nats_otel.bridge.loop import Bridge
from nats_otel.bridge.settings import load_settings
from nats_otel.devkit.processes import start_topology
from nats_otel.devkit.receivers import OTLPGrpcReceiver, OTLPHttpReceiver
from nats_otel.devkit.server_config import free_ports
from nats_otel.devkit.topology import single_server
from tests.bridge.bridge_helpers import publish_traced, scrape, stop_bridge, terminate, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

SECRET = "wr0ng-Secret-71x"


@pytest.fixture(scope="module")
def server() -> Iterator:
    with start_topology(single_server()) as running:
        yield running


def readyz(port: int | None) -> tuple[int, str]:
    """(status, detail) of /readyz; (0, "") while nothing answers yet."""
    if port is None:
        return 0, ""
    try:
        status, body = scrape(port, "/readyz")
    except OSError:
        return 0, ""
    return status, json.loads(body)["detail"] if body.startswith("{") else body


def bridge_process(log: Path, *args: str) -> subprocess.Popen:
    env = {**os.environ, "NATS_OTEL_TELEMETRY__METRICS_HOST": "127.0.0.1"}  # loopback only
    with open(log, "wb") as err:
        return subprocess.Popen([sys.executable, "-m", "nats_otel.cli", "bridge", "--subject", "trace.a",
                                 "--metrics-port", "0", *args],
                                stdout=subprocess.DEVNULL, stderr=err, env=env, start_new_session=True)


# --------------------------------------------------------------------------- the OTLP backend


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
async def test_readyz_names_the_otlp_endpoint_until_a_receiver_listens(server, protocol: str) -> None:
    """Connected to NATS, but nothing listens at the OTLP endpoint: not ready, and /readyz
    names the endpoint and says unreachable (before any trace message, i.e. by the probe).
    A receiver started on that port makes it ready, and spans flow."""
    (port,) = free_ports(1)
    endpoint = f"http://127.0.0.1:{port}" + ("/v1/traces" if protocol != "grpc" else "")
    settings = load_settings(env={}, overrides={
        "sources": [{"urls": [server.client_url("n1", "a")], "subjects": ["trace.a"]}],
        "otlp": {"endpoint": endpoint, "protocol": protocol, "timeout": 2.0, "retry_max_elapsed": 0.5},
        "telemetry": {"metrics_port": 0, "metrics_host": "127.0.0.1"}, "batch": {"max_delay": 0.05},
    })
    bridge = Bridge(settings)
    task = asyncio.create_task(bridge.run())
    receiver = OTLPGrpcReceiver(port=port) if protocol == "grpc" else OTLPHttpReceiver(port=port)
    try:
        await wait_until(lambda: bridge.sources and all(s.link.connected for s in bridge.sources)
                         and "unreachable" in readyz(bridge.metrics_port)[1], 15, "NATS up, OTLP unreachable")
        status, why = readyz(bridge.metrics_port)
        assert status == 503
        assert f"OTLP endpoint {endpoint}: unreachable" in why and "NATS" not in why
        receiver.start()
        await wait_until(lambda: readyz(bridge.metrics_port)[0] == 200, 30, "ready once the receiver listens")
        assert receiver.span_count == 0  # proven by the (empty) probe, not by traffic
        traces = await publish_traced(server.client_url("n1", "a"), 5)
        await wait_until(lambda: {s.trace_id.hex() for _, s in receiver.spans()} >= set(traces), 15, "spans")
    finally:
        assert await stop_bridge(bridge, task) == 0
        receiver.stop()


class _Refusing(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(401)
        self.send_header("Content-Length", "13")
        self.end_headers()
        self.wfile.write(b"who are you?\n")

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - base signature
        pass


async def test_readyz_says_authorization_when_the_backend_refuses_us(server) -> None:
    """A backend that answers 401 (a real HTTP server): /readyz says authorization, the
    header's secret is sent but never shown."""
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Refusing)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    endpoint = f"http://127.0.0.1:{httpd.server_port}/v1/traces"
    settings = load_settings(env={}, overrides={
        "sources": [{"urls": [server.client_url("n1", "a")], "subjects": ["trace.a"]}],
        "otlp": {"endpoint": endpoint, "protocol": "http/protobuf", "headers": {"authorization": SECRET}},
        "telemetry": {"metrics_port": 0, "metrics_host": "127.0.0.1"},
    })
    bridge = Bridge(settings)
    task = asyncio.create_task(bridge.run())
    try:
        await wait_until(lambda: "authorization" in readyz(bridge.metrics_port)[1], 15, "authorization in /readyz")
        status, why = readyz(bridge.metrics_port)
        assert status == 503 and f"OTLP endpoint {endpoint}: authorization refused" in why and "HTTP 401" in why
        assert SECRET not in why
    finally:
        assert await stop_bridge(bridge, task) == 0
        httpd.shutdown()
        httpd.server_close()


# --------------------------------------------------------------------------- NATS


def _lines(log: Path) -> list[str]:
    return log.read_text(errors="replace").splitlines() if log.exists() else []


def _port_from_text_log(log: Path) -> int | None:
    for line in _lines(log):
        match = re.search(r"serving /metrics, /healthz, /readyz port=(\d+)", line)
        if match:
            return int(match.group(1))
    return None


async def test_unreachable_nats_url_text_logs_readyz_backoff_and_give_up(tmp_path: Path) -> None:
    """Nothing listens at the NATS URL. Text logs: the metrics port chosen with
    `--metrics-port 0` is in them, and each failed attempt with its URL and reason as
    key=value; the waits grow; /readyz names the URL and says refused; after
    `--nats-give-up-after` the bridge exits with code 3."""
    (nats_port,) = free_ports(1)
    url = f"nats://127.0.0.1:{nats_port}"
    log = tmp_path / "bridge.log"
    with OTLPGrpcReceiver() as rx:
        proc = bridge_process(log, "--nats-url", url, "--otlp-endpoint", rx.endpoint, "--log-format", "text",
                              "--nats-give-up-after", "6")
        try:
            await wait_until(lambda: _port_from_text_log(log) is not None, 15, "the metrics port in the text log")
            port = _port_from_text_log(log)
            assert port and scrape(port)[0] == 200  # the logged port is the one serving /metrics
            await wait_until(lambda: "connection refused" in readyz(port)[1], 10, "/readyz says why")
            status, why = readyz(port)
            assert status == 503 and url in why and "OTLP" not in why  # the backend was proven
            assert await asyncio.to_thread(proc.wait, 20) == 3
        finally:
            terminate(proc)
    failures = [line for line in _lines(log) if "NATS connect failed" in line]
    assert len(failures) >= 3, _lines(log)
    for line in failures:
        assert f"url={url} " in line and "kind=refused" in line and 'reason="connection refused' in line
    waits = [float(re.search(r"retry_in=([\d.]+)", line).group(1)) for line in failures]
    # Each wait is drawn from [c/2, c] with c doubling from 0.5 s: below the cap they never shrink.
    assert waits == sorted(waits) and waits[-1] > 2 * waits[0], waits
    give_up = [line for line in _lines(log) if "giving up" in line]
    assert len(give_up) == 1 and "ERROR" in give_up[0] and "exit_code=3" in give_up[0]


async def test_wrong_credentials_are_called_authorization_json_logs(server, tmp_path: Path) -> None:
    """A real server refusing the password (given in the URL): JSON logs say authorization
    with the URL stripped of its credentials, /readyz too; the secret appears nowhere; exit 3.
    The JSON lines carry the same fields as the text lines above."""
    good = server.client_url("n1", "a")
    bad_url = good.replace(":pwd@", f":{SECRET}@")
    plain = "nats://" + good.rsplit("@", 1)[1]
    log = tmp_path / "bridge.log"
    with OTLPGrpcReceiver() as rx:
        proc = bridge_process(log, "--nats-url", bad_url, "--otlp-endpoint", rx.endpoint, "--nats-give-up-after", "5")
        try:
            def port() -> int | None:
                for line in _lines(log):
                    if line.startswith("{") and json.loads(line)["msg"].startswith("serving /metrics"):
                        return json.loads(line)["port"]
                return None

            await wait_until(lambda: port() is not None, 15, "the metrics port in the JSON log")
            await wait_until(lambda: "authorization" in readyz(port())[1], 10, "/readyz says authorization")
            status, why = readyz(port())
            assert status == 503 and plain in why and "authorization violation" in why and SECRET not in why
            assert await asyncio.to_thread(proc.wait, 20) == 3
        finally:
            terminate(proc)
    text = log.read_text()
    assert SECRET not in text
    records = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    failures = [r for r in records if r["msg"] == "NATS connect failed"]
    assert len(failures) >= 2
    for r in failures:
        assert r["level"] == "error" and r["url"] == plain and r["kind"] == "authorization"
        assert r["reason"].startswith("authorization violation")
        assert {"source", "url", "kind", "reason", "failures", "retry_in"} <= r.keys()


async def test_server_lost_reconnect_waits_grow_then_back(tmp_path: Path, caplog) -> None:
    """The server is killed under a connected bridge: each reconnect attempt is logged with
    the URL and reason, the waits grow, /readyz says reconnecting with the URL; the server
    restarted on its port, the bridge reconnects and is ready again."""
    caplog.set_level(logging.INFO, logger="nats_otel")
    with start_topology(single_server(), tmp_path / "nats") as topo, OTLPGrpcReceiver() as rx:
        url = topo.client_url("n1", "a")
        plain = "nats://" + url.rsplit("@", 1)[1]
        settings = load_settings(env={}, overrides={
            "sources": [{"urls": [url], "subjects": ["trace.a"]}], "otlp": {"endpoint": rx.endpoint},
            "telemetry": {"metrics_port": 0, "metrics_host": "127.0.0.1"}, "batch": {"max_delay": 0.05},
        })
        bridge = Bridge(settings)
        task = asyncio.create_task(bridge.run())
        try:
            await wait_until(lambda: bridge.ready()[0], 15, "ready")
            await asyncio.to_thread(topo.kill, "n1", signal.SIGKILL)
            # The server is reaped: from here on nothing listens on its port. The retry made
            # at once when the connection dropped may race the dying process (a reset
            # connection, not a refused one); every attempt after this must be refused.
            dead_at = time.time()

            def reconnect_failures() -> list[logging.LogRecord]:
                return [r for r in caplog.records if r.getMessage() == "NATS reconnect failed"]

            def failures_since_dead() -> list[dict]:
                return [r.fields for r in reconnect_failures() if r.created > dead_at]  # type: ignore[attr-defined]

            await wait_until(lambda: len(reconnect_failures()) >= 4 and len(failures_since_dead()) >= 3, 20,
                             "reconnect attempts")
            status, why = readyz(bridge.metrics_port)
            assert status == 503 and f"not connected: {plain}: connection refused" in why
            fields = [r.fields for r in reconnect_failures()]  # type: ignore[attr-defined]
            assert all(f["url"] == plain for f in fields), fields
            assert all(f["kind"] == "refused" for f in failures_since_dead()), fields
            waits = [f["retry_in"] for f in fields[:4]]
            assert waits == sorted(waits) and waits[-1] > 2 * waits[0], waits
            await asyncio.to_thread(topo.restart, "n1")
            await wait_until(lambda: bridge.ready()[0], 30, "ready after the restart")
            assert any(r.getMessage() == "NATS reconnected" for r in caplog.records)
            traces = await publish_traced(url, 3)
            await wait_until(lambda: {s.trace_id.hex() for _, s in rx.spans()} >= set(traces), 15, "spans")
        finally:
            assert await stop_bridge(bridge, task) == 0
