"""Security of the bridge, with real processes and certificates generated here.

* mutual TLS to NATS (`tls { verify: true }`) and to an OTLP/gRPC receiver requiring a client
  certificate; clients without a certificate are refused by both;
* nkey authentication, with the least-privilege users of docs/security.md (core and
  JetStream mode): the bridge works with exactly those permissions, anything else is denied;
* who can write to the trace destination (config/nats-server/trace-permissions.conf): a
  traced user can forge spans into any trace; a user denied the destination cannot, and its
  own traced messages are refused; an account without msg_trace is out of reach;
* an application `Authorization` header never reaches an exported span unless allow-listed;
* no secret (password, token, OTLP header, nkey seed) in the bridge's logs or `/metrics`.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import nats
import nkeys
import pytest

from nats_otel.bridge.export.otlp import GrpcExporter
from nats_otel.bridge.settings import OtlpSettings, load_settings
from nats_otel.core.mapping import map_message  # noqa: F401 - the header allow-list lives there
from nats_otel.devkit.processes import find_nats_server
from nats_otel.devkit.receivers import OTLPGrpcReceiver
from nats_otel.devkit.server_config import free_ports
from tests.bridge.bridge_helpers import (
    bridge_counts,
    metric,
    publish_traced,
    scrape,
    start_bridge,
    stop_bridge,
    terminate,
    traceparent,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

APP_PASSWORD = "app-Pa55word-ZQX"


# --------------------------------------------------------------------------- fixtures


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1/localhost and a client certificate."""
    d = tmp_path_factory.mktemp("pki")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl("req", "-x509", *ec, "-keyout", str(d / "ca.key"), "-out", str(d / "ca.pem"), "-days", "2",
             "-subj", "/CN=nats-otel test CA", "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    for name, usage, san in (("server", "serverAuth", "IP:127.0.0.1,DNS:localhost"),
                             ("client", "clientAuth", "DNS:nats-otel-bridge")):
        _openssl("req", "-new", *ec, "-keyout", str(d / f"{name}.key"), "-out", str(d / f"{name}.csr"),
                 "-subj", f"/CN={name}")
        (d / f"{name}.ext").write_text(f"subjectAltName={san}\nextendedKeyUsage={usage}\n"
                                       "basicConstraints=CA:FALSE\n")
        _openssl("x509", "-req", "-in", str(d / f"{name}.csr"), "-CA", str(d / "ca.pem"), "-CAkey",
                 str(d / "ca.key"), "-CAcreateserial", "-out", str(d / f"{name}.pem"), "-days", "2",
                 "-extfile", str(d / f"{name}.ext"))
    return {p.stem + "_" + p.suffix[1:]: p for p in d.iterdir()}


def new_nkey_user(directory: Path, name: str) -> tuple[str, Path]:
    """A fresh user nkey: (public key, seed file)."""
    seed = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)
    path = directory / f"{name}.nk"
    path.write_bytes(seed + b"\n")
    path.chmod(0o600)
    return nkeys.from_seed(seed).public_key.decode(), path


@contextmanager
def nats_server(directory: Path, users: str, *, tls: str = "", jetstream: bool = False) -> Iterator[str]:
    """One nats-server with account A (msg_trace to `trace.a`) holding `users`; yields host:port."""
    client, http = free_ports(2)
    store = directory / "js"
    with server_from_config(directory, client, f"""
listen: "127.0.0.1:{client}"
http: "127.0.0.1:{http}"
{tls}
accounts {{
  SYS {{ users: [ {{ user: sys, password: sys }} ] }}
  A {{
    users: [
      {{ user: app, password: "{APP_PASSWORD}" }}
{users}
    ]
    {"jetstream: enabled" if jetstream else ""}
    msg_trace: {{ dest: "trace.a", sampling: 100 }}
  }}
}}
system_account: SYS
{f'jetstream {{ store_dir: "{store}" }}' if jetstream else ""}
""") as hostport:
        if jetstream:
            time.sleep(0.5)
        yield hostport


@contextmanager
def server_from_config(directory: Path, client: int, text: str) -> Iterator[str]:
    """nats-server on the config `text`, listening for clients on `client`; yields host:port
    once it accepts connections. Stopped by its pid when the block ends."""
    conf = directory / "server.conf"
    conf.write_text(text)
    log = open(directory / "server.log", "ab")  # noqa: SIM115 - closed below
    proc = subprocess.Popen([find_nats_server(), "-c", str(conf)], stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 15
        while True:
            assert proc.poll() is None, (directory / "server.log").read_text()[-2000:]
            try:
                socket.create_connection(("127.0.0.1", client), 0.2).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "nats-server did not start"
                time.sleep(0.05)
        yield f"127.0.0.1:{client}"
    finally:
        terminate(proc)
        log.close()


def trace_ids(rx: OTLPGrpcReceiver) -> set[str]:
    return {span.trace_id.hex() for _, span in rx.spans()}


# --------------------------------------------------------------------------- TLS


async def test_mutual_tls_to_nats_and_to_otlp_grpc(tmp_path: Path, pki: dict[str, Path]) -> None:
    tls = f"""tls {{
  cert_file: "{pki['server_pem']}"
  key_file: "{pki['server_key']}"
  ca_file: "{pki['ca_pem']}"
  verify: true
}}"""
    rx_tls = (pki["server_pem"].read_bytes(), pki["server_key"].read_bytes(), pki["ca_pem"].read_bytes())
    with nats_server(tmp_path, "", tls=tls) as hostport, OTLPGrpcReceiver(tls=rx_tls) as rx:
        url = f"tls://app:{APP_PASSWORD}@{hostport}"
        import ssl

        app_tls = ssl.create_default_context(cafile=str(pki["ca_pem"]))
        app_tls.load_cert_chain(str(pki["client_pem"]), str(pki["client_key"]))
        # Without a client certificate the server refuses the connection.
        no_cert = ssl.create_default_context(cafile=str(pki["ca_pem"]))
        with pytest.raises(Exception):  # noqa: B017 - nats-py raises various errors here
            await nats.connect(url, tls=no_cert, allow_reconnect=False, max_reconnect_attempts=0,
                               connect_timeout=2)
        # ... and so does the OTLP receiver (the bridge's own exporter, without client cert).
        bare = GrpcExporter(OtlpSettings(endpoint=rx.endpoint, certificate=pki["ca_pem"], timeout=2,
                                         retry_max_elapsed=0))
        assert not bare.export([]).ok
        bare.close()
        assert rx.request_count == 0

        settings = load_settings(env={}, overrides={
            "sources": [{"urls": [f"tls://{hostport}"], "subjects": ["trace.a"], "user": "app",
                         "password": APP_PASSWORD,
                         "tls": {"ca": str(pki["ca_pem"]), "cert": str(pki["client_pem"]),
                                 "key": str(pki["client_key"])}}],
            "otlp": {"endpoint": rx.endpoint, "certificate": str(pki["ca_pem"]),
                     "client_certificate": str(pki["client_pem"]), "client_key": str(pki["client_key"])},
            "batch": {"max_delay": 0.05},
        })
        bridge, task = await start_bridge(settings)
        try:
            ids = await publish_traced(url, 20, tls=app_tls)
            await wait_until(lambda: trace_ids(rx) >= set(ids), 15, "spans over mutual TLS",
                             detail=lambda: f"{len(trace_ids(rx) & set(ids))} of {len(ids)} traces arrived, "
                                            f"{rx.request_count} requests; bridge: {bridge_counts(bridge)}")
            assert bridge.metrics.value("nats_otel_export_failures_total", {"exporter": "otlp-grpc"}) == 0
        finally:
            assert await stop_bridge(bridge, task) == 0


# --------------------------------------------------------------------------- nkeys, least privilege

# docs/security.md: the bridge user's permissions, core mode and JetStream mode.
CORE_PERMISSIONS = '{ publish: { deny: [">"] }, subscribe: { allow: ["trace.a"] } }'
JS_PERMISSIONS = """{
        publish: { allow: [
          "$JS.API.STREAM.INFO.NATS_TRACES",
          "$JS.API.CONSUMER.DURABLE.CREATE.NATS_TRACES.nats-otel",
          "$JS.API.CONSUMER.MSG.NEXT.NATS_TRACES.nats-otel",
          "$JS.ACK.NATS_TRACES.nats-otel.>"
        ] }
        subscribe: { allow: ["_INBOX.>"] }
      }"""


async def denied(url: str, action, **connect) -> str:
    """The permissions violation the server reports when a user (`connect` options) tries `action`."""
    errors: list[str] = []

    async def error_cb(exc: Exception) -> None:
        errors.append(str(exc))

    nc = await nats.connect(url, error_cb=error_cb, **connect)
    try:
        await action(nc)
        await nc.flush()
        await asyncio.sleep(0.2)
        return " ".join(errors).lower()
    finally:
        await nc.close()


async def test_nkey_least_privilege_core_mode(tmp_path: Path) -> None:
    public, seed = new_nkey_user(tmp_path, "bridge")
    users = f"      {{ nkey: {public}, permissions: {CORE_PERMISSIONS} }}"
    with nats_server(tmp_path, users) as hostport, OTLPGrpcReceiver() as rx:
        url = f"nats://{hostport}"
        app_url = f"nats://app:{APP_PASSWORD}@{hostport}"
        # The nkey is the only way in for this user: without it (or with another) no access.
        _, other = new_nkey_user(tmp_path, "other")
        with pytest.raises(Exception):  # noqa: B017
            await nats.connect(url, nkeys_seed=str(other), allow_reconnect=False, max_reconnect_attempts=0)
        assert "permissions violation" in await denied(
            url, lambda nc: nc.subscribe("app.work"), nkeys_seed=str(seed))
        assert "permissions violation" in await denied(
            url, lambda nc: nc.publish("trace.a", b"x"), nkeys_seed=str(seed))
        settings = load_settings(env={}, overrides={
            "sources": [{"urls": [url], "subjects": ["trace.a"], "nkey_seed": str(seed)}],
            "otlp": {"endpoint": rx.endpoint}, "batch": {"max_delay": 0.05},
        })
        bridge, task = await start_bridge(settings)
        try:
            ids = await publish_traced(app_url, 20)
            await wait_until(lambda: trace_ids(rx) >= set(ids), 15, "spans with the least-privilege user")
        finally:
            assert await stop_bridge(bridge, task) == 0


async def test_nkey_least_privilege_jetstream_mode(tmp_path: Path) -> None:
    public, seed = new_nkey_user(tmp_path, "bridge")
    users = f"      {{ nkey: {public}, permissions: {JS_PERMISSIONS} }}"
    with nats_server(tmp_path, users, jetstream=True) as hostport, OTLPGrpcReceiver() as rx:
        url = f"nats://{hostport}"
        app_url = f"nats://app:{APP_PASSWORD}@{hostport}"
        # An administrator creates the stream; the bridge user may not.
        admin = await nats.connect(app_url)
        await admin.jetstream().add_stream(name="NATS_TRACES", subjects=["trace.a"])
        await admin.close()
        # Denied: creating streams, deleting the stream, reading another durable, core subscriptions.
        assert "permissions violation" in await denied(
            url, lambda nc: nc.publish("$JS.API.STREAM.DELETE.NATS_TRACES", b""), nkeys_seed=str(seed))
        assert "permissions violation" in await denied(
            url, lambda nc: nc.publish("$JS.API.CONSUMER.MSG.NEXT.NATS_TRACES.other", b""), nkeys_seed=str(seed))
        assert "permissions violation" in await denied(
            url, lambda nc: nc.subscribe("trace.a"), nkeys_seed=str(seed))
        settings = load_settings(env={}, overrides={
            "mode": "jetstream",
            "sources": [{"urls": [url], "subjects": ["trace.a"], "nkey_seed": str(seed)}],
            "otlp": {"endpoint": rx.endpoint},
        })
        bridge, task = await start_bridge(settings)
        try:
            ids = await publish_traced(app_url, 30)
            await wait_until(lambda: trace_ids(rx) >= set(ids), 20, "spans with the least-privilege JetStream user")
            await wait_until(lambda: bridge.metrics.value("nats_otel_jetstream_acks_total", {"kind": "ack"}) >= 30,
                             10, "acks allowed")
        finally:
            assert await stop_bridge(bridge, task) == 0
        admin = await nats.connect(app_url)
        info = await admin.jetstream().consumer_info("NATS_TRACES", "nats-otel")
        await admin.close()
        assert info.num_ack_pending == 0 and info.num_pending == 0


# --------------------------------------------------------------------------- who can forge trace messages

ROOT = Path(__file__).resolve().parents[2]
TRACE_PERMISSIONS = ROOT / "config" / "nats-server" / "trace-permissions.conf"


async def publish_as(url: str, user: str, subject: str, data: bytes = b"work",
                     headers: dict[str, str] | None = None) -> tuple[bool, str]:
    """`user` (password `pwd`) publishes on `subject`, which it subscribes itself: whether its
    own subscription got the message, and the errors the server sent it (lower case)."""
    errors: list[str] = []

    async def error_cb(exc: Exception) -> None:
        errors.append(str(exc).lower())

    nc = await nats.connect(url, user=user, password="pwd", error_cb=error_cb)
    try:
        sub = await nc.subscribe(subject)
        await nc.flush()
        await nc.publish(subject, data, headers=headers)
        await nc.flush()
        try:
            await sub.next_msg(timeout=0.5)
            delivered = True
        except TimeoutError:
            delivered = False
        return delivered, " ".join(errors)
    finally:
        await nc.close()


async def test_who_can_write_the_trace_destination(tmp_path: Path) -> None:
    """config/nats-server/trace-permissions.conf as shipped, with the bridge as its `bridge`
    user and a plain subscriber beside it (the same user) recording the trace destination:

    * `orders` (traced): its traced message gives the server's trace message; a copy of it
      with another trace id, published by `orders` on trace.a, becomes spans in that trace:
      the forgery docs/security.md describes;
    * `sensor` (denied trace.>): its forged copy is refused (permissions violation), and so is
      its own traced message: not traced and not delivered (the server checks the same
      permission before tracing); its untraced message flows;
    * `partner` (account without msg_trace): its trace.a is its own account's, the bridge
      sees nothing of it; its traced message is delivered, untraced; its traced request into
      A's service is traced in A (genuine events, under the trace id it sent).
    """
    client, http = free_ports(2)
    text = TRACE_PERMISSIONS.read_text()
    text = text.replace('listen: "127.0.0.1:4222"', f'listen: "127.0.0.1:{client}"')
    text = text.replace('http: "127.0.0.1:8222"', f'http: "127.0.0.1:{http}"')
    assert f":{client}\"" in text and f":{http}\"" in text
    with server_from_config(tmp_path, client, text) as hostport, OTLPGrpcReceiver() as rx:
        url = f"nats://{hostport}"
        recorder = await nats.connect(url, user="bridge", password="pwd")
        recorded: list[bytes] = []

        async def record(msg) -> None:
            recorded.append(msg.data)

        await recorder.subscribe("trace.a", cb=record)
        await recorder.flush()
        settings = load_settings(env={}, overrides={
            "sources": [{"urls": [url], "subjects": ["trace.a"], "user": "bridge", "password": "pwd"}],
            "otlp": {"endpoint": rx.endpoint}, "batch": {"max_delay": 0.05},
        })
        bridge, task = await start_bridge(settings)
        responder = await nats.connect(url, user="orders", password="pwd")
        try:
            async def serve(msg) -> None:
                await msg.respond(b"ok")

            await responder.subscribe("orders.new", cb=serve)
            await responder.flush()
            ids = {name: traceparent() for name in (
                "orders", "victim", "sensor_forged", "sensor", "partner_forged", "partner", "partner_request")}

            def tid(name: str) -> str:
                return ids[name][1]

            def recorded_ids() -> set[str]:
                return {name for name in ids for data in recorded if tid(name).encode() in data}

            assert await publish_as(url, "orders", "orders.work", headers={"traceparent": ids["orders"][0]}) \
                == (True, "")
            await wait_until(lambda: "orders" in recorded_ids(), 10, "the trace message of orders' message")
            genuine = next(data for data in recorded if tid("orders").encode() in data)

            def forged(name: str) -> bytes:
                return genuine.replace(tid("orders").encode(), tid(name).encode())

            violation = 'permissions violation for publish to "trace.a"'
            # sensor may not publish on trace.a: neither a forgery nor a traced message of its own.
            delivered, errors = await publish_as(url, "sensor", "trace.a", forged("sensor_forged"))
            assert (delivered, violation in errors) == (False, True), errors
            sensor_traced = {"traceparent": ids["sensor"][0]}
            delivered, errors = await publish_as(url, "sensor", "orders.work", headers=sensor_traced)
            assert (delivered, violation in errors) == (False, True), errors
            assert await publish_as(url, "sensor", "orders.work") == (True, "")
            # partner's account has no msg_trace: its trace.a is its own; nothing is traced there.
            assert await publish_as(url, "partner", "trace.a", forged("partner_forged")) == (True, "")
            assert await publish_as(url, "partner", "partner.work", headers={"traceparent": ids["partner"][0]}) \
                == (True, "")
            nc = await nats.connect(url, user="partner", password="pwd")
            reply = await nc.request("orders.new", b"order", headers={"traceparent": ids["partner_request"][0]},
                                     timeout=5)
            await nc.close()
            assert reply.data == b"ok"
            # orders may publish on trace.a: its forged copy is taken as the servers' own.
            assert await publish_as(url, "orders", "trace.a", forged("victim")) == (True, "")

            arriving = {"orders", "victim", "partner_request"}
            await wait_until(lambda: {tid(n) for n in arriving} <= trace_ids(rx), 15, "spans",
                             detail=lambda: f"recorded {sorted(recorded_ids())}; bridge: {bridge_counts(bridge)}")
        finally:
            await responder.close()
            await recorder.close()
            assert await stop_bridge(bridge, task) == 0
    assert recorded_ids() == arriving
    assert {tid(name) for name in ids} & trace_ids(rx) == {tid(n) for n in arriving}
    # The forged spans are the genuine ones' twins in the victim's trace.
    by_trace: dict[str, set[str]] = {}
    for _, span in rx.spans():
        by_trace.setdefault(span.trace_id.hex(), set()).add(span.name)
    assert by_trace[tid("victim")] == by_trace[tid("orders")] and by_trace[tid("victim")]


def test_security_doc_shows_the_shipped_trace_permissions() -> None:
    text = TRACE_PERMISSIONS.read_text()
    accounts = text[text.index("accounts {"):text.index("system_account")].strip()
    assert accounts in (ROOT / "docs" / "security.md").read_text()


# --------------------------------------------------------------------------- header allow-list

SECRET_HEADER = "Bearer s3cr3t-TOKEN-7fa1"


@pytest.mark.parametrize(("allow", "exported"), [([], False), (["X-Tenant"], False), (["authorization"], True)])
async def test_authorization_header_exported_only_when_allow_listed(tmp_path: Path, allow, exported) -> None:
    with nats_server(tmp_path, "") as hostport, OTLPGrpcReceiver() as rx:
        app_url = f"nats://app:{APP_PASSWORD}@{hostport}"
        settings = load_settings(env={}, overrides={
            "sources": [{"urls": [app_url], "subjects": ["trace.a"]}],
            "otlp": {"endpoint": rx.endpoint}, "batch": {"max_delay": 0.05}, "allow_headers": allow,
        })
        bridge, task = await start_bridge(settings)
        try:
            ids = await publish_traced(app_url, 5, {"Authorization": SECRET_HEADER, "X-Tenant": "tenant-42"})
            await wait_until(lambda: trace_ids(rx) >= set(ids), 15, "spans")
        finally:
            assert await stop_bridge(bridge, task) == 0
        wire = b"".join(r.SerializeToString() for r in rx.requests)
        assert (SECRET_HEADER.encode() in wire) is exported
        assert (b"tenant-42" in wire) is ("X-Tenant" in allow)
        assert b"traceparent" in wire  # the default allow-list still exports the trace headers


# --------------------------------------------------------------------------- secrets in logs and /metrics


async def test_no_secret_in_logs_or_metrics(tmp_path: Path) -> None:
    """Bridge process at DEBUG with a password, an OTLP auth header and an nkey seed on disk,
    through a connect failure, an export failure and a rejected message: none of them leaks."""
    otlp_token = "otlp-T0ken-93kd"
    with nats_server(tmp_path, "") as hostport, OTLPGrpcReceiver() as rx:
        (port,) = free_ports(1)
        log = tmp_path / "bridge.log"
        env = {**os.environ, "OTEL_EXPORTER_OTLP_HEADERS": f"authorization=Bearer {otlp_token}"}
        def args(password: str) -> list[str]:
            return [sys.executable, "-m", "nats_otel.cli", "bridge", "--nats-url", f"nats://{hostport}",
                    "--subject", "trace.a", "--user", "app", "--password", password, "--otlp-endpoint",
                    rx.endpoint, "--metrics-port", str(port), "--log-level", "DEBUG", "--max-runtime", "60"]

        with open(log, "wb") as out:
            # First with a wrong password: connect failures are logged, and SIGTERM still ends
            # a bridge that cannot get in (regression: nats-py retried inside connect forever).
            bad = subprocess.Popen(args("wrong-" + APP_PASSWORD), stdout=out, stderr=subprocess.STDOUT, env=env,
                                   start_new_session=True)
            try:
                await wait_until(lambda: b"Authorization Violation" in log.read_bytes(), 20, "auth failure logged")
                bad.send_signal(signal.SIGTERM)
                assert bad.wait(10) == 0
            finally:
                if bad.poll() is None:
                    bad.kill()
                    bad.wait(5)
            proc = subprocess.Popen(args(APP_PASSWORD), stdout=out, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True)
        try:
            await wait_until(lambda: _ready(port), 20, "bridge ready")
            app_url = f"nats://app:{APP_PASSWORD}@{hostport}"
            ids = await publish_traced(app_url, 5, {"Authorization": SECRET_HEADER})
            await wait_until(lambda: trace_ids(rx) >= set(ids), 15, "spans")
            assert rx.received[0].headers.get("authorization") == f"Bearer {otlp_token}"  # it was used
            rx.unavailable = True  # an export failure gets logged
            await publish_traced(app_url, 2, {"Authorization": SECRET_HEADER})
            await wait_until(lambda: metric(scrape(port)[1], "nats_otel_export_failures_total",
                                            exporter="otlp-grpc") >= 1, 15, "an export failure")
            nc = await nats.connect(app_url)
            await nc.publish("trace.a", b"\x1f\x8bgarbage", headers={"Content-Encoding": "gzip"})
            await nc.close()
            await wait_until(lambda: metric(scrape(port)[1], "nats_otel_messages_rejected_total",
                                            reason="bad_compression") >= 1, 10, "a rejected message")
            _, page = scrape(port)
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(20)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(5)
    text = log.read_text()
    assert "Authorization Violation" in text and "export failed" in text and "rejected" in text  # logs were made
    for secret in (APP_PASSWORD, otlp_token, SECRET_HEADER, "s3cr3t"):
        assert secret not in text, f"secret {secret!r} in the logs"
        assert secret not in page, f"secret {secret!r} in /metrics"


def _ready(port: int) -> bool:
    try:
        return scrape(port, "/readyz")[0] == 200
    except OSError:
        return False
