"""The answers that settle JetStream forwards (`bridge/js_routing.py`), both sides, over a
real nats-server: this test plays the other bridge of a pair, on the exchange's own
subjects, with the exchange's key.

The sender acks, naks or terms a forwarded message only as its owner's signed answer says,
once; a forged or malformed answer settles nothing (counted, logged); a forward nobody
answers is naked after `answer_wait`, as is one to a member that fell silent. The owner
answers a forward once every message of it is settled, and at once `n` for what its intake
refused."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import nats
import pytest

from nats_otel.bridge.intake import Intake
from nats_otel.bridge.jetstream_loop import answer
from nats_otel.bridge.js_routing import ACK, HOLD, NAK, SIGNATURE_HEADER, TERM, ForwardedMsg, JetStreamRouter
from nats_otel.bridge.ownership import Ring, decode_forward, encode_forward
from nats_otel.bridge.routing import Leaving
from nats_otel.bridge.sharding import shard_key
from nats_otel.bridge.sources.delivery import Delivery, delivery
from nats_otel.bridge.sources.jetstream import Held
from nats_otel.bridge.telemetry import Metrics
from nats_otel.core.decode import RawTraceMessage
from nats_otel.core.evidence import sign
from tests.bridge.bridge_helpers import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

BASE = "nats-otel.links.test"
KEY = b"a shared key of the exchange, 32b"
ME, PEER = "bridge-a", "bridge-b"


def _raw(i: int) -> RawTraceMessage:
    return RawTraceMessage("trace.a", {}, b'{"traceparent":["00-%032x-00000000000000%02x-01"]}' % (i, i % 256))


def _owned_by(member: str, count: int) -> list[RawTraceMessage]:
    ring = Ring([ME, PEER])
    raws = (_raw(i) for i in range(1, 10_000))
    return [raw for raw in raws if ring.owner(shard_key(raw)) == member][:count]


def _value(metrics: Metrics, result: str) -> float:
    return metrics.registry.get_sample_value("nats_otel_routed_total", {"result": result}) or 0.0


class _Fetched:
    """What the router reads of a fetched JetStream message: its delivery count (the third)."""

    metadata = SimpleNamespace(num_delivered=3)


class _Settled:
    """The sender's settle callback: what it was told to ack, nak and term."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[Delivery], ...]] = []

    async def __call__(self, ack: list[Delivery], nak: list[Delivery], term: list[Delivery],
                       hold: list[Delivery]) -> None:
        self.calls.append((ack, nak, term, hold))


async def _router(url: str, settle: Any, intake: Intake, answer_wait_s: float = 30.0) -> tuple[JetStreamRouter, Any]:
    nc = await nats.connect(url)
    router = JetStreamRouter(BASE, ME, intake, Metrics(), lambda: None, KEY, settle, answer_wait_s)
    await router.start(nc)
    router.heard(PEER, bye=False)  # the peer is a member: the ring is [ME, PEER]
    return router, nc


async def _forward_to_peer(router: JetStreamRouter, nc: Any, count: int) -> tuple[list[Delivery], Any]:
    """Route `count` fetched messages of the peer's traces; the forward as the peer receives it."""
    got: asyncio.Queue[Any] = asyncio.Queue()
    sub = await nc.subscribe(router.subject_of(PEER), cb=got.put)
    part = [delivery(raw, "a", _Fetched()) for raw in _owned_by(PEER, count)]
    assert await router.route_fetched(part) == []  # none of them is this bridge's
    msg = await asyncio.wait_for(got.get(), 5)
    await sub.unsubscribe()
    return part, decode_forward(msg.data, KEY)


async def test_the_sender_settles_as_the_signed_answer_says_and_only_then(url: str) -> None:
    settled = _Settled()
    router, nc = await _router(url, settled, Intake(1 << 20))
    try:
        part, forward = await _forward_to_peer(router, nc, 4)
        assert [frame.delivered for frame in forward.frames] == [3, 3, 3, 3]  # JetStream's count, carried
        reply = router.reply_subject(ME, forward.number, PEER)
        outcomes = bytes([ACK, NAK, TERM, HOLD])
        await nc.publish(reply, outcomes)  # unsigned: anyone could have sent it
        await nc.publish(reply, outcomes, headers={SIGNATURE_HEADER: sign(KEY, reply.encode() + b"aaaa")})
        await nc.publish(reply, b"aa", headers={SIGNATURE_HEADER: sign(KEY, reply.encode() + b"aa")})
        await wait_until(lambda: _value(router._metrics, "malformed") == 1, 5, "the short answer counted")
        assert _value(router._metrics, "forged") == 2 and settled.calls == []
        await nc.publish(reply, outcomes, headers={SIGNATURE_HEADER: sign(KEY, reply.encode() + outcomes)})
        await wait_until(lambda: settled.calls, 5, "the answer settled")
        assert settled.calls == [([part[0]], [part[1]], [part[2]], [part[3]])]
        await nc.publish(reply, outcomes, headers={SIGNATURE_HEADER: sign(KEY, reply.encode() + outcomes)})
        await nc.flush()
        await asyncio.sleep(0.2)
        assert len(settled.calls) == 1 and _value(router._metrics, "answered") == 4  # once
    finally:
        await nc.close()


async def test_a_forward_never_answered_is_naked_and_so_is_one_to_a_silent_member(url: str) -> None:
    settled = _Settled()
    router, nc = await _router(url, settled, Intake(1 << 20), answer_wait_s=0.3)
    try:
        part, _ = await _forward_to_peer(router, nc, 2)
        await asyncio.sleep(0.4)
        router.tick()  # the bridge's exchange ticks every 0.5 s
        await wait_until(lambda: settled.calls, 5, "the unanswered forward naked")
        assert settled.calls == [([], part, [], [])] and _value(router._metrics, "unanswered") == 2
        router._answer_wait = 30.0
        later, _ = await _forward_to_peer(router, nc, 2)
        router._leave(PEER, Leaving.SILENT)  # as `tick` finds it after MEMBER_SILENCE_S
        await wait_until(lambda: len(settled.calls) == 2, 5, "the forward to the silent member naked")
        assert settled.calls[1] == ([], later, [], [])
    finally:
        await nc.close()


async def test_the_owner_answers_once_all_is_settled_and_at_once_for_what_it_refused(url: str) -> None:
    raws = _owned_by(ME, 4)
    small = Intake(max_bytes=2 * (len(raws[0].payload) + len(raws[0].subject or "") + 512) + 10)
    router, nc = await _router(url, _Settled(), small)
    answers: asyncio.Queue[Any] = asyncio.Queue()
    reply = router.reply_subject(PEER, 7, ME)
    await nc.subscribe(reply, cb=answers.put)
    try:
        data = encode_forward(PEER, router.view, 7, ["a"], [(raw, 0, -1, 2) for raw in raws], (), KEY)
        await nc.publish(router.subject_of(ME), data)
        await wait_until(lambda: small.qsize() == 2, 5, "the two that fit taken in")
        assert _value(router._metrics, "refused") == 2 and answers.empty()
        taken = small.take(2)
        assert all(isinstance(d.msg, ForwardedMsg) and d.msg.metadata.num_delivered == 2 for d in taken)
        held = Held(1 << 20)
        held.take(taken)
        assert answer(held, [taken[1]], [], [], []) == ([], [], [], [])
        await asyncio.sleep(0.2)
        assert answers.empty()  # one of the forward's four is still unsettled
        answer(held, [], [], [], [taken[0]])
        msg = await asyncio.wait_for(answers.get(), 5)
        assert msg.data == bytes([HOLD, ACK, NAK, NAK])  # as ordered in the forward
        assert msg.headers[SIGNATURE_HEADER] == sign(KEY, reply.encode() + msg.data)
        assert held.messages == 0 and held.bytes == 0
    finally:
        await nc.close()

