"""The direct receive path of core mode (`bridge/sources/direct.py`, `headers.py`), against
a real nats-server: it delivers what a plain nats-py subscription delivers (subject,
payload, every header value), in order; queue groups split without loss; a restarted
server delivers again; the drain keeps what was read; the received counter is exact; bad
headers are kept where they parse and counted. Also the guard on nats-py's private method,
and the callback path it falls back to.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

import nats
import pytest
from nats.aio.client import Client

from nats_otel.bridge.intake import Intake
from nats_otel.bridge.settings import BatchSettings, NatsSettings, NatsSource
from nats_otel.bridge.sources import direct, stamp
from nats_otel.bridge.sources.delivery import size_of
from nats_otel.bridge.sources.headers import parse_headers
from nats_otel.bridge.sources.nats_core import CoreSource
from nats_otel.bridge.telemetry import Metrics
from nats_otel.devkit.processes import start_topology
from nats_otel.devkit.topology import single_server
from tests.bridge.bridge_helpers import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

RECEIVED = "nats_otel_messages_received_total"


# (name, raw header lines or None, payload): what a plain subscription must agree with.
CASES: list[tuple[str, list[tuple[str, str]] | None, bytes]] = [
    ("no headers", None, b'{"server":{"name":"n1"}}'),
    ("gzip", [("Content-Encoding", "gzip")], b"\x1f\x8b compressed"),
    ("multi-valued, mixed case", [("X-Multi", "one"), ("traceparent", "00-ab-cd-01"), ("X-Multi", "two"),
                                  ("x-MiXed", "Value With Spaces")], b"body"),
    ("empty payload", [("Nats-Trace-Dest", "trace.x")], b""),
    ("empty payload, no headers", None, b""),
    ("1 MB payload", [("Content-Encoding", "snappy")], bytes(range(256)) * 3906),
]


class RawPublisher:
    """A NATS client speaking the protocol by hand: HPUB with repeated header names, or
    header bytes no library would write."""

    def __init__(self, url: str) -> None:
        self.url = urlsplit(url)

    async def __aenter__(self) -> RawPublisher:
        self.reader, self.writer = await asyncio.open_connection(self.url.hostname, self.url.port)
        await self.reader.readline()  # INFO
        connect = {"verbose": False, "pedantic": False, "headers": True, "user": self.url.username,
                   "pass": self.url.password, "protocol": 1}
        self.writer.write(f"CONNECT {json.dumps(connect)}\r\n".encode())
        return self

    def publish(self, subject: str, payload: bytes, header_block: bytes | None = None) -> None:
        if header_block is None:
            self.writer.write(f"PUB {subject} {len(payload)}\r\n".encode() + payload + b"\r\n")
        else:
            total = len(header_block) + len(payload)
            self.writer.write(f"HPUB {subject} {len(header_block)} {total}\r\n".encode() + header_block + payload
                              + b"\r\n")

    async def flush(self) -> None:
        self.writer.write(b"PING\r\n")
        await self.writer.drain()
        while (line := await self.reader.readline()) != b"PONG\r\n":
            assert not line.startswith(b"-ERR"), line

    async def __aexit__(self, *exc: object) -> None:
        self.writer.close()
        await self.writer.wait_closed()


def header_block(pairs: list[tuple[str, str]]) -> bytes:
    return b"NATS/1.0\r\n" + b"".join(f"{k}: {v}\r\n".encode() for k, v in pairs) + b"\r\n"


def core_source(url: str, subjects: list[str], intake: Intake, metrics: Metrics, name: str = "default",
                queue: str | None = None, read_interval: float = 0.0) -> CoreSource:
    """A core source; its connection read as data comes unless `read_interval` (read_pacing.py)."""
    return CoreSource(NatsSource(name=name, urls=[url], subjects=subjects, queue=queue), BatchSettings(),
                      intake, metrics, NatsSettings(read_interval=read_interval))


def taken(intake: Intake) -> list[Any]:
    out = []
    while (delivery := intake.get_nowait()) is not None:
        out.append(delivery)
    return out


async def test_direct_path_delivers_what_nats_py_delivers(url: str) -> None:
    intake, metrics = Intake(1 << 30), Metrics()
    source = core_source(url, ["trace.eq.>"], intake, metrics)
    assert await source.start(asyncio.Event())
    assert isinstance(source.nc, direct.DirectClient)
    plain: list[Any] = []
    reference = await nats.connect(url)

    async def collect(msg: Any) -> None:
        plain.append(msg)

    await reference.subscribe("trace.eq.>", cb=collect, pending_bytes_limit=-1)
    await reference.flush()
    started = datetime.now(UTC).replace(microsecond=0)
    try:
        async with RawPublisher(url) as pub:
            for round_no in range(3):
                for index, (_, pairs, payload) in enumerate(CASES):
                    pub.publish(f"trace.eq.{round_no}.{index}", payload, header_block(pairs) if pairs else None)
            await pub.flush()
        count = 3 * len(CASES)
        await wait_until(lambda: intake.qsize() == count and len(plain) == count, 20, "both subscribers")
        deliveries = taken(intake)
        assert [d.raw.subject for d in deliveries] == [m.subject for m in plain]
        assert [d.raw.payload for d in deliveries] == [m.data for m in plain]
        for delivery, msg, (what, pairs, payload) in zip(deliveries, plain, CASES * 3, strict=True):
            assert delivery.raw.payload == payload, what
            expected: dict[str, list[str]] = {}
            for name, value in pairs or []:
                expected.setdefault(name, []).append(value)
            assert delivery.raw.headers == expected, what
            # nats-py keeps the last value of a name: the direct path keeps that one too, and the others.
            assert {k: v[-1] for k, v in delivery.raw.headers.items()} == (msg.headers or {}), what
            assert delivery.size == size_of(delivery.raw) == len(payload) + len(delivery.raw.subject) + 512
            # Stamped once per read (stamp.py): a time between the test's start and now.
            assert delivery.raw.received_at and delivery.raw.received_at.endswith("Z")
            assert started <= datetime.fromisoformat(delivery.raw.received_at) <= datetime.now(UTC)
        assert metrics.value(RECEIVED, {"source": "default"}) == count
        assert source.nc.stats["in_msgs"] >= count  # nats-py's stats still count what came in
    finally:
        await reference.close()
        await source.close()


async def test_queue_group_of_direct_sources_splits_without_loss(url: str) -> None:
    metrics = Metrics()
    intakes = [Intake(1 << 30), Intake(1 << 30)]
    sources = [core_source(url, ["trace.q"], intake, metrics, name=f"s{i}", queue="bridges")
               for i, intake in enumerate(intakes)]
    for source in sources:
        assert await source.start(asyncio.Event())
    try:
        async with RawPublisher(url) as pub:
            for i in range(4000):
                pub.publish("trace.q", str(i).encode())
            await pub.flush()
        await wait_until(lambda: sum(i.qsize() for i in intakes) == 4000, 20, "every message in one intake")
        parts = [[int(d.raw.payload) for d in taken(intake)] for intake in intakes]
        assert sorted(parts[0] + parts[1]) == list(range(4000))  # none lost, none twice
        assert all(parts), "both members of the group got a share"
        assert [metrics.value(RECEIVED, {"source": f"s{i}"}) for i in range(2)] == [len(p) for p in parts]
    finally:
        for source in sources:
            await source.close()


async def test_messages_arrive_again_after_a_server_restart(tmp_path) -> None:
    with start_topology(single_server(), tmp_path / "nats") as topo:
        url = topo.client_url("n1", "a")
        intake = Intake(1 << 30)
        source = core_source(url, ["trace.r", "trace.r2"], intake, Metrics())
        assert await source.start(asyncio.Event())
        try:
            async with RawPublisher(url) as pub:
                pub.publish("trace.r", b"before")
                await pub.flush()
            await wait_until(lambda: intake.qsize() == 1, 10, "the first message")
            await asyncio.to_thread(topo.restart, "n1")
            await wait_until(lambda: source.connected, 30, "the source reconnected")
            # The SUBs went out again under the same sids: both subjects are still direct.
            assert isinstance(source.nc, direct.DirectClient) and len(source.nc._direct) == 2
            async with RawPublisher(url) as pub:
                pub.publish("trace.r", b"after")
                pub.publish("trace.r2", b"after, second subject", header_block([("a", "1")]))
                await pub.flush()
            await wait_until(lambda: intake.qsize() == 3, 10, "messages after the restart")
            assert [d.raw.payload for d in taken(intake)] == [b"before", b"after", b"after, second subject"]
            # The new connection's reads are served in its socket's callback too.
            parser = source.nc._ps
            assert isinstance(parser, direct.DirectParser)
            assert parser._served_reader is direct._stream_reader(source.nc) is not None
        finally:
            await source.close()


async def test_reads_served_in_the_socket_callback_keep_order_beside_nats_pys_own(url: str) -> None:
    """Reads of direct frames are served as they come (`DirectParser.serve_read`), without
    nats-py's read task; a frame of nats-py's (another subscription, a PONG) and everything
    after it still go to nats-py, so each subscription sees its messages in order, every
    one, whatever mix and sizes (a 1 MB payload spans many reads)."""
    intake = Intake(1 << 30)
    source = core_source(url, ["trace.mix"], intake, Metrics())
    assert await source.start(asyncio.Event())
    assert isinstance(source.nc, direct.DirectClient)
    parser = source.nc._ps
    assert isinstance(parser, direct.DirectParser) and direct.READ_UNSUPPORTED is None
    theirs: list[bytes] = []

    async def on_other(msg: Any) -> None:
        theirs.append(msg.data)

    await source.nc.subscribe("other.mix", cb=on_other)  # nats-py's own path, on the same connection
    await source.nc.flush()
    before = parser.reads_served
    ours_sent: list[bytes] = []
    theirs_sent: list[bytes] = []
    try:
        async with RawPublisher(url) as pub:
            for round_no in range(40):
                for index in range(25):
                    payload = f"t{round_no}.{index}".encode() * (1 + index % 7)
                    if round_no % 10 == 3 and index == 0:
                        payload = bytes(range(256)) * 4096  # 1 MB
                    pub.publish("trace.mix", payload, header_block([("n", str(index))]) if index % 2 else None)
                    ours_sent.append(payload)
                    if index % 6 == 0:
                        other = f"o{round_no}.{index}".encode()
                        pub.publish("other.mix", other)
                        theirs_sent.append(other)
                await pub.flush()
                if round_no % 5 == 0:
                    await source.nc.flush()  # a PONG for nats-py between our frames
                await asyncio.sleep(0.005)  # rounds in reads of their own
        await wait_until(lambda: intake.qsize() == len(ours_sent) and len(theirs) == len(theirs_sent), 30,
                         "every message on both paths")
        assert [d.raw.payload for d in taken(intake)] == ours_sent
        assert theirs == theirs_sent
        assert parser.reads_served - before >= 20  # most rounds came in reads served in the callback
    finally:
        await source.close()


async def test_a_handler_failing_in_the_socket_callback_is_reported_and_reading_goes_on(url: str) -> None:
    """A direct handler that raises, in a read served in the socket's callback: the error
    goes to the client's error callback, as nats-py reports a failing callback, and the
    frames after it in the same read and later ones are still served, in order."""
    errors: list[BaseException] = []
    got: list[bytes] = []

    async def on_error(exc: BaseException) -> None:
        errors.append(exc)

    def handler(_subject: bytes, _reply: bytes | None, _headers: bytes | None, payload: bytes) -> None:
        if payload == b"bad":
            raise ValueError("a handler failed")
        got.append(payload)

    client = direct.DirectClient()
    await client.connect(url, error_cb=on_error, allow_reconnect=False)
    try:
        await client.subscribe_direct("trace.fail", handler)
        await client.flush()
        async with RawPublisher(url) as pub:
            for payload in (b"one", b"bad", b"two"):  # one write: most likely one read
                pub.publish("trace.fail", payload)
            await pub.flush()
            await asyncio.sleep(0.05)
            pub.publish("trace.fail", b"three")
            await pub.flush()
        await wait_until(lambda: len(got) == 3 and errors, 10, "the messages and the error")
        assert got == [b"one", b"two", b"three"]
        assert [str(e) for e in errors] == ["a handler failed"]
        assert isinstance(client._ps, direct.DirectParser) and client._ps.reads_served >= 1
    finally:
        await client.close()


async def test_a_servers_own_trace_messages_take_the_frame_scanner(url: str) -> None:
    """nats-server writes the trace messages it publishes as `MSG <subject> <sid>  <size>`
    (two spaces: no reply), every release from 2.11 on; those once went to nats-py's parser.
    Real trace events, from a traced publish and an ad-hoc one: all served by the scanner,
    none handed to nats-py's per-message path (`_process_msg`)."""
    intake = Intake(1 << 30)
    source = core_source(url, ["trace.a"], intake, Metrics())
    assert await source.start(asyncio.Event())
    client = source.nc
    assert isinstance(client, direct.DirectClient)
    through_nats_py: list[int] = []
    original = client._process_msg

    async def process_msg(sid: int, *args: Any) -> None:
        through_nats_py.append(sid)
        await original(sid, *args)

    client._process_msg = process_msg  # type: ignore[method-assign]
    publisher = await nats.connect(url)
    try:
        for n in range(20):
            trace_id = f"{n + 1:032x}"
            await publisher.publish(f"app.{n}", b"x", headers={"traceparent": f"00-{trace_id}-b7ad6b7169203331-01"})
            await publisher.publish(f"app.adhoc.{n}", b"y", headers={"Nats-Trace-Dest": "trace.a"})
        await publisher.flush()
        await wait_until(lambda: intake.qsize() >= 40, 20, "the servers' trace messages")
        assert through_nats_py == []
        assert all(json.loads(d.raw.payload)["server"]["name"] for d in taken(intake))
    finally:
        await publisher.close()
        await source.close()


async def test_burst_counts_exactly_and_the_drain_keeps_what_was_read(url: str) -> None:
    """A burst larger than the intake: received = held + queue_full, exactly, when scraped;
    stop_intake returns only once everything sent before it is in the intake."""
    metrics = Metrics()
    intake = Intake(3000 * (100 + len("trace.burst") + 512))
    source = core_source(url, ["trace.burst"], intake, metrics)
    assert await source.start(asyncio.Event())
    try:
        async with RawPublisher(url) as pub:
            for _ in range(5000):
                pub.publish("trace.burst", b"x" * 100, header_block([("Content-Encoding", "gzip")]))
            await pub.flush()
        await source.stop_intake()  # no waiting: the drain itself must bring every message in
        assert intake.qsize() == 3000
        assert metrics.value(RECEIVED, {"source": "default"}) == 5000
        assert metrics.value("nats_otel_messages_dropped_total", {"reason": "queue_full"}) == 2000
        assert metrics.value("nats_otel_messages_dropped_total", {"reason": "slow_consumer"}) == 0
        assert isinstance(source.nc, direct.DirectClient) and not source.nc._direct  # unsubscribed
        # Each delivery carries the losses of its source before it (the ledger's vouching):
        # the 3,000 held came before the first drop; the source counts the 2,000 drops.
        assert {delivery.breaks for delivery in taken(intake)} == {0}
        assert source.breaks == 2000
    finally:
        await source.close()


async def test_malformed_headers_are_counted_and_the_rest_kept(url: str, caplog) -> None:
    metrics = Metrics()
    intake = Intake(1 << 30)
    source = core_source(url, ["trace.bad"], intake, metrics)
    assert await source.start(asyncio.Event())
    try:
        with caplog.at_level(logging.WARNING, logger="nats_otel.core"):
            async with RawPublisher(url) as pub:
                pub.publish("trace.bad", b"1", b"NATS/1.0\r\nContent-Encoding: gzip\r\nno colon here\r\n\r\n")
                pub.publish("trace.bad", b"2", b"NATS/1.0\r\nX-Bin: \xff\xfe\r\n\r\n")
                pub.publish("trace.bad", b"3", header_block([("Ok", "yes")]))
                await pub.flush()
            await wait_until(lambda: intake.qsize() == 3, 10, "all three messages")
        first, second, third = taken(intake)
        assert first.raw.headers == {"Content-Encoding": ["gzip"]}
        assert second.raw.headers == {"X-Bin": ["\ufffd\ufffd"]}
        assert third.raw.headers == {"Ok": ["yes"]}
        assert metrics.value("nats_otel_mapping_issues_total", {"kind": "malformed_header"}) == 2
        assert any("malformed message headers" in r.getMessage() for r in caplog.records)
    finally:
        await source.close()


@pytest.mark.parametrize(("block", "headers", "malformed"), [
    (b"NATS/1.0\r\n\r\n", {}, 0),
    (b"NATS/1.0\r\nA: 1\r\na: 2\r\nA:3\r\n\r\n", {"A": ["1", "3"], "a": ["2"]}, 0),
    (b"NATS/1.0\r\nK:  v: w \r\n\r\n", {"K": ["v: w"]}, 0),
    (b"NATS/1.0 503\r\n\r\n", {"Status": ["503"]}, 0),
    (b"NATS/1.0 404 No Messages\r\n\r\n", {"Status": ["404"], "Description": ["No Messages"]}, 0),
    (b"NATS/1.0 abc\r\nA: 1\r\n\r\n", {"A": ["1"]}, 1),
    (b"HTTP/1.1\r\nA: 1\r\n\r\n", {"A": ["1"]}, 1),
    (b"NATS/1.0\r\nno colon\r\n: empty name\r\nBad Name: x\r\n\xe9: y\r\nB: 2\r\n\r\n", {"B": ["2"]}, 4),
    (b"NATS/1.0\r\nA: \xff\r\n\r\n", {"A": ["\ufffd"]}, 1),
    (b"\r\n", {}, 1),
])
def test_parse_headers(block: bytes, headers: dict[str, list[str]], malformed: int) -> None:
    assert parse_headers(block) == (headers, malformed)


def test_the_guard_on_nats_pys_private_method() -> None:
    assert direct.UNSUPPORTED is None  # the installed nats-py: served directly

    class NoMethod:
        async def subscribe(self) -> None: ...

        def _remove_sub(self) -> None: ...

    class Renamed(NoMethod):
        async def _process_msg(self, sid: int, subject: bytes, reply: bytes, payload: bytes, hdr: bytes) -> None: ...

    class NotAsync(NoMethod):
        def _process_msg(self, sid: int, subject: bytes, reply: bytes, data: bytes, headers: bytes) -> None: ...

    assert "no _process_msg" in (direct.direct_unsupported(NoMethod) or "")
    assert "takes" in (direct.direct_unsupported(Renamed) or "")
    assert "not a coroutine" in (direct.direct_unsupported(NotAsync) or "")


async def test_without_direct_dispatch_the_callback_path_delivers(url: str, monkeypatch, caplog) -> None:
    monkeypatch.setattr(direct, "UNSUPPORTED", "nats-py's Client._process_msg takes something else")
    monkeypatch.setattr("nats_otel.bridge.sources.nats_core._fallback_logged", [False])
    metrics = Metrics()
    intake = Intake(1 << 30)
    source = core_source(url, ["trace.fallback"], intake, metrics)
    with caplog.at_level(logging.WARNING, logger="nats_otel.core"):
        assert await source.start(asyncio.Event())
    try:
        assert type(source.nc) is Client
        assert any("direct receive unavailable" in r.getMessage() for r in caplog.records)
        async with RawPublisher(url) as pub:
            pub.publish("trace.fallback", b"p", header_block([("Content-Encoding", "gzip")]))
            await pub.flush()
        # Seen once in a fresh-clone CI (session 53): the source's connection closed for good
        # before the message came, why not logged. If it comes again, the failure says why.
        await wait_until(lambda: intake.qsize() == 1, 10, "the message",
                         detail=lambda: f"connection {source.link.kind}: {source.link.reason}; "
                                        f"last error {source.nc.last_error!r}")
        (delivery,) = taken(intake)
        assert (delivery.raw.payload, delivery.raw.headers) == (b"p", {"Content-Encoding": ["gzip"]})
        assert metrics.value(RECEIVED, {"source": "default"}) == 1
    finally:
        await source.close()


def test_the_handler_decodes_every_subject_past_the_subjects_it_keeps() -> None:
    """The direct handler keeps the text of 1,024 subjects; past that it decodes each one
    anew: every message keeps its own subject, invalid UTF-8 replaced as before."""
    intake = Intake(1 << 30)
    on_raw = core_source("nats://127.0.0.1:4222", ["t.>"], intake, Metrics()).direct_handler()
    subjects = [f"t.{i}".encode() for i in range(1500)] + [b"t.\xff", b"t.0", b"t.1499"]
    for subject in subjects:
        on_raw(subject, None, None, b"{}")
    assert [d.raw.subject for d in taken(intake)] == [s.decode(errors="replace") for s in subjects]


def test_the_stamp_is_made_once_per_millisecond_and_moves_on() -> None:
    """Messages of one read share a stamp; a later read gets a later one."""
    first = stamp.refresh()
    second = stamp.refresh()  # the same millisecond gives the same text, a later one a later time
    assert second == first or datetime.fromisoformat(second) > datetime.fromisoformat(first)
    assert stamp.CURRENT[0] is second  # what the handler reads per message
    time.sleep(0.003)
    later = stamp.refresh()
    assert later > first and datetime.fromisoformat(later) > datetime.fromisoformat(first)


@pytest.mark.parametrize("way", ["DirectClient.flush", "flush_in_order"])
async def test_a_flush_returns_after_the_server_read_what_was_published_before_it(url: str, way: str) -> None:
    # nats-py writes a flush's PING ahead of the publishes still in its buffer (direct.py,
    # `flush_in_order`): the PONG can come before the server read them. Here a connection
    # subscribed to its own subject publishes 1,000 messages of 1 KB without yielding (all in
    # nats-py's buffer), then flushes: its own messages come back before the PONG only if the
    # server read them before the PING, so each is counted (synchronously, by the direct
    # handler) by the time the flush returns.
    nc = direct.DirectClient()
    await nc.connect(url, allow_reconnect=False)
    echoed: list[bytes] = []
    try:
        await nc.subscribe_direct("flush.order", lambda _s, _r, _h, payload: echoed.append(payload))
        await nc.flush()
        for round_number in range(5):
            echoed.clear()
            for i in range(1000):
                await nc.publish("flush.order", b"%04d" % i + b"x" * 996)
            await (nc.flush() if way == "DirectClient.flush" else direct.flush_in_order(nc))
            assert len(echoed) == 1000, f"round {round_number}: {len(echoed)} of 1000 read before the PONG"
            assert echoed[0][:4] == b"0000" and echoed[-1][:4] == b"0999"
    finally:
        await nc.close()
