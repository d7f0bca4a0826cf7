"""The small parts behind outages and bursts, table-driven: what a NATS failure is called, URLs
without credentials, the reconnect wait, text logs with the JSON fields, the byte-bounded intake."""

from __future__ import annotations

import asyncio
import json
import logging
import random
import socket
import ssl

import nats.errors
import pytest

from nats_otel.bridge.intake import MESSAGE_OVERHEAD, Intake
from nats_otel.bridge.settings import NatsSettings
from nats_otel.bridge.sources.delivery import Delivery, delivery
from nats_otel.bridge.sources.link import Link, backoff, classify, next_wait, redact_url
from nats_otel.bridge.telemetry import JsonFormatter, TextFormatter
from nats_otel.core.decode import RawTraceMessage


@pytest.mark.parametrize(("url", "shown"), [
    ("nats://a:pwd@127.0.0.1:4222", "nats://127.0.0.1:4222"),
    ("nats://s3cr3t-token@host:4222", "nats://host:4222"),
    ("tls://user:p%40ss@[::1]:4443", "tls://[::1]:4443"),
    ("127.0.0.1:4222", "nats://127.0.0.1:4222"),
    ("wss://u:p@example.com/ws?x=1", "wss://example.com/ws"),
])
def test_urls_are_shown_without_credentials(url: str, shown: str) -> None:
    assert redact_url(url) == shown


@pytest.mark.parametrize(("exc", "kind", "says"), [
    (ConnectionRefusedError(111, "Connect call failed ('127.0.0.1', 1)"), "refused", "connection refused"),
    (OSError("Multiple exceptions: [Errno 111] Connect call failed ('::1', 1, 0, 0), "
             "[Errno 111] Connect call failed ('127.0.0.1', 1)"), "refused", "connection refused"),
    (OSError(113, "Connect call failed ('10.0.0.1', 4222)"), "unreachable", "Connect call failed"),
    (socket.gaierror(-2, "Name or service not known"), "unreachable", "host name not resolved"),
    (TimeoutError(), "timeout", "no answer in time"),
    (nats.errors.Error("nats: 'Authorization Violation'"), "authorization", "authorization violation"),
    (nats.errors.Error("nats: 'User Authentication Expired'"), "authorization", "expired"),
    (ssl.SSLCertVerificationError(1, "certificate verify failed"), "tls", "TLS"),
    (nats.errors.UnexpectedEOF(), "closed", "closed the connection"),
    (ValueError("odd"), "error", "ValueError: odd"),
])
def test_failures_are_called_what_they_are(exc: BaseException, kind: str, says: str) -> None:
    got_kind, reason = classify(exc)
    assert got_kind == kind and says in reason


def test_reconnect_wait_grows_to_the_cap_with_jitter() -> None:
    settings = NatsSettings(reconnect_wait_initial=0.5, reconnect_wait_max=10.0)
    rng = random.Random(7)
    assert backoff(0, settings, rng) == 0.0  # right after a loss: at once
    for failures, ceiling in [(1, 0.5), (2, 1.0), (3, 2.0), (4, 4.0), (5, 8.0), (6, 10.0), (40, 10.0)]:
        waits = [backoff(failures, settings, rng) for _ in range(200)]
        assert all(ceiling / 2 <= w <= ceiling for w in waits), failures
        assert max(waits) - min(waits) > ceiling / 4  # jitter: not all bridges at once


def test_link_describes_without_credentials() -> None:
    link = Link("a", ["nats://a:pwd@127.0.0.1:4222"])
    assert link.describe() == "NATS source 'a': connecting to nats://127.0.0.1:4222"
    link.attempting("nats://a:pwd@127.0.0.1:4222")
    link.failed(nats.errors.Error("nats: 'Authorization Violation'"), 0.4)
    text = link.describe()
    assert "pwd" not in text and "nats://127.0.0.1:4222: authorization violation" in text and "0.4s" in text
    link.up("nats://a:pwd@127.0.0.1:4222")
    assert link.connected and link.down_for() == 0.0 and link.reason is None


def _record(fields: dict) -> logging.LogRecord:
    record = logging.LogRecord("nats_otel.nats", logging.WARNING, __file__, 1, "NATS connect failed", None, None)
    record.fields = fields  # type: ignore[attr-defined]
    return record


def test_text_logs_carry_the_json_fields() -> None:
    fields = {"url": "nats://127.0.0.1:4222", "reason": 'refused "here"', "failures": 3, "retry_in": 1.5,
              "ok": True, "server": None, "subjects": ["trace.a", "t.b"], "empty": ""}
    text = TextFormatter().format(_record(fields))
    assert text.split(" ", 2)[2].startswith("WARNING nats_otel.nats: NATS connect failed url=nats://127.0.0.1:4222 ")
    assert ('reason="refused \\"here\\"" failures=3 retry_in=1.5 ok=true server=null '
            'subjects=["trace.a","t.b"] empty=""') in text
    doc = json.loads(JsonFormatter().format(_record(fields)))
    assert {k: doc[k] for k in fields} == fields  # the same fields, same values


def _delivery(payload_size: int) -> Delivery:
    return delivery(RawTraceMessage("trace.a", {}, b"x" * payload_size), "default")


async def test_intake_is_bounded_in_bytes_and_gives_them_back() -> None:
    one = 1000 + len("trace.a") + MESSAGE_OVERHEAD
    intake = Intake(max_bytes=3 * one + 600)
    assert [intake.offer(_delivery(1000)) for _ in range(4)] == [True, True, True, False]
    assert intake.bytes == 3 * one and intake.qsize() == 3
    assert intake.offer(_delivery(0))  # a small one still fits in what is left ...
    assert not intake.offer(_delivery(0))  # ... once
    first = intake.get_nowait()
    assert first is not None and len(first.raw.payload) == 1000  # oldest first
    taken = [first]
    while (delivery := intake.get_nowait()) is not None:
        taken.append(delivery)
    assert intake.empty() and await intake.get(0.01) is None
    # Taken is still held (a batch waiting out link.wait): no room until it is released.
    assert intake.bytes == 3 * one + len("trace.a") + MESSAGE_OVERHEAD and intake.held == 4
    assert not intake.offer(_delivery(1000))
    intake.release(taken[:2])
    assert intake.held == 2 and intake.offer(_delivery(1000))
    intake.release([*taken[2:], intake.get_nowait()])
    assert intake.bytes == 0 and intake.held == 0


async def test_intake_message_cap_and_waiting_get() -> None:
    intake = Intake(max_bytes=1 << 20, max_messages=2)
    assert [intake.offer(_delivery(10)) for _ in range(3)] == [True, True, False]
    intake.get_nowait(), intake.get_nowait()
    waiter = asyncio.create_task(intake.get(2.0))
    await asyncio.sleep(0.01)
    intake.offer(_delivery(5))
    got = await waiter
    assert got is not None and len(got.raw.payload) == 5


def test_next_server_at_once_the_wait_after_each_round() -> None:
    settings = NatsSettings(reconnect_wait_initial=0.5, reconnect_wait_max=10.0)
    rng = random.Random(1)
    one = [next_wait(n, 1, settings, rng) for n in (1, 2, 3)]
    assert 0.25 <= one[0] <= 0.5 and 0.5 <= one[1] <= 1.0 and 1.0 <= one[2] <= 2.0
    three = [next_wait(n, 3, settings, rng) for n in range(1, 7)]
    assert three[0] == three[1] == 0.0 and 0.25 <= three[2] <= 0.5   # round 1 over
    assert three[3] == three[4] == 0.0 and 0.5 <= three[5] <= 1.0    # round 2 over


async def test_intake_take_gives_the_oldest_at_once_and_keeps_them_charged() -> None:
    intake = Intake(max_bytes=1 << 20)
    for size in range(5):
        assert intake.offer(_delivery(size))
    first = intake.take(3)
    assert [len(d.raw.payload) for d in first] == [0, 1, 2] and intake.qsize() == 2
    rest = intake.take(10)  # fewer than asked: all that waits
    assert [len(d.raw.payload) for d in rest] == [3, 4] and intake.empty() and intake.take(4) == []
    assert await intake.get(0.01) is None  # emptied by take: a waiting get does not wake for nothing
    assert intake.held == 5
    intake.release(first + rest)
    assert intake.bytes == 0 and intake.held == 0


async def test_intake_collect_waits_without_polling_until_the_drain_stops_it() -> None:
    intake = Intake(max_bytes=1 << 20)
    firsts: list[str] = []
    collecting = asyncio.create_task(intake.collect(10, lambda: 5.0, None, lambda: firsts.append("first")))
    await asyncio.sleep(0.05)
    assert not collecting.done() and firsts == []  # no first delivery, no time limit: still waiting
    intake.stop_waiting()  # the drain begins
    assert await asyncio.wait_for(collecting, 1.0) == [] and firsts == []
    assert await asyncio.wait_for(intake.get(None), 1.0) is None  # it never waits for a first again
    assert intake.offer(_delivery(7))  # what still arrives is queued, and collected
    batch = await asyncio.wait_for(intake.collect(10, lambda: 0.0, None, lambda: None), 1.0)
    assert [len(d.raw.payload) for d in batch] == [7]


async def test_intake_batch_wakes_when_it_can_fill_not_at_each_delivery() -> None:
    intake = Intake(max_bytes=1 << 20)
    intake.offer(_delivery(0))
    collecting = asyncio.create_task(intake.collect(3, lambda: 30.0, None, lambda: None))
    await asyncio.sleep(0.01)
    intake.offer(_delivery(1))
    await asyncio.sleep(0.01)
    assert not collecting.done()  # two of three, its time not up: it waits on
    intake.offer(_delivery(2))  # the third fills it: at once, not 30 s later
    batch = await asyncio.wait_for(collecting, 1.0)
    assert [len(d.raw.payload) for d in batch] == [0, 1, 2]
    # A wait whose time ran out leaves no waiter behind: the next one waits and wakes alike.
    await intake.wait_count(1, 0.01)
    waiting = asyncio.create_task(intake.wait_count(1, 30.0))
    await asyncio.sleep(0.01)
    intake.offer(_delivery(3))
    await asyncio.wait_for(waiting, 1.0)
