"""JetStream mode's loops (`loop.Bridge` runs them, `run`): fetch, route, wait out `link.wait`,
convert, export, settle.

Each source has one fetcher and `_inflight` settlers; each batch waits `link.wait` after its
hop evidence was recorded, then is converted, exported and settled (`max_ack_pending` bounds
what is in flight). The settlers take the batches as core mode's workers do (`ripening`): in
order, one at a time, and a small one takes in those ripening within `batch.coalesce` behind
it, so that they are converted, exported and settled together: the acks come that much
later, never before the spans were exported. With trace ownership (`js_routing`) the
fetcher keeps what this bridge owns and forwards the rest, and one more loop takes the trace
messages the other bridges forwarded here from the intake (core mode's, unused otherwise)
and settles them by answering their senders.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from nats_otel.bridge.intake import DELAYED_BATCHES
from nats_otel.bridge.js_routing import ACK, HOLD, NAK, TERM, ForwardedMsg, JetStreamRouter
from nats_otel.bridge.loop_bridge import LoopBridge
from nats_otel.bridge.policy import NakBackoff
from nats_otel.bridge.ripening import Ripening, Waiting
from nats_otel.bridge.sources.delivery import Delivery
from nats_otel.bridge.sources.jetstream import Held, JetStreamSource

__all__ = ["answer", "catch_up", "owners_changed", "run", "settle_fetched"]

_FETCH_TIMEOUT_S = 1.0


class Bridge(LoopBridge, Protocol):
    """What these loops read of `loop.Bridge` beyond what both modes' loops read."""

    sources: list[Any]
    _stopping: asyncio.Event | None
    _backoff: NakBackoff


async def run(bridge: Bridge, source: JetStreamSource, forwarded: bool = False) -> None:
    """Fetch from `source` (or, `forwarded`, take what other bridges forwarded here) until
    the intake is done; hand each batch to the settlers after recording its evidence."""
    assert bridge._stopping is not None
    batches: asyncio.Queue[Waiting | None] = asyncio.Queue(maxsize=DELAYED_BATCHES)
    ripening = Ripening(batches, bridge.settings.batch.max_messages, bridge.settings.batch.coalesce)
    settlers = [asyncio.create_task(_settler(bridge, source, ripening, forwarded)) for _ in range(bridge._inflight)]
    router = bridge.router if isinstance(bridge.router, JetStreamRouter) else None
    if router is not None and not forwarded:
        await router.settled()  # a newcomer listens for the members before it routes
    try:
        while not bridge._intake_done or (forwarded and not bridge.intake.empty()):
            pause = bridge._backoff.pause_left()
            if pause > 0 and not bridge._intake_done:
                # Backpressure: the backend is failing; fetching more would only nak more.
                try:
                    await asyncio.wait_for(bridge._stopping.wait(), pause)
                except TimeoutError:
                    pass
                continue
            if forwarded:
                deliveries = await _take_forwarded(bridge, source)
            else:
                deliveries = await source.fetch(_FETCH_TIMEOUT_S)
                if deliveries and router is not None:
                    deliveries = await router.route_fetched(deliveries)
            if deliveries:
                raws = [d.raw for d in deliveries]
                await batches.put((await bridge._observe(deliveries, raws), deliveries, raws))
    finally:
        for _ in settlers:
            await batches.put(None)
        await asyncio.gather(*settlers)


async def _settler(bridge: Bridge, source: JetStreamSource, ripening: Ripening, forwarded: bool) -> None:
    while True:
        async with ripening.turn:  # one settler at a time takes batches, in order, and ripens them
            item = await ripening.take()
            if item is None:
                return
            deliveries, raws = await ripening.ripen(item, bridge._until, bridge._past_deadline, bridge._draining)
        if forwarded:  # held as fetched ones are: the sender holds what the answer says is held
            ack, nak, term, hold = await bridge._process(deliveries, raws, source.holdable(deliveries))
            fetched = answer(source.held, ack, nak, term, hold)
            if any(fetched):  # this bridge's own, taken back from an owner that was gone
                await settle_fetched(bridge, *fetched)
            continue
        ack, nak, term, hold = await bridge._process(deliveries, raws, source.holdable(deliveries))
        await source.settle(ack, nak, term, bridge._backoff.after(bool(nak)))
        if hold:
            await source.hold(hold)


async def _take_forwarded(bridge: Bridge, source: JetStreamSource) -> list[Delivery]:
    """A batch of the trace messages forwarded here: out of the intake, held as fetched ones are."""
    batch = await bridge._collect(_nothing)  # not core mode's streams: nothing to note
    if batch:
        bridge.intake.release(batch)
        source.held.take([d for d in batch if isinstance(d.msg, ForwardedMsg)])  # the rest are held already
    return batch


async def settle_fetched(bridge: Bridge, ack: list[Delivery], nak: list[Delivery], term: list[Delivery],
                         hold: list[Delivery]) -> None:
    """Settle what this bridge fetched and forwarded, once its owner answered (or not)."""
    delay = bridge.settings.jetstream.nak_delay_initial
    for source in bridge.sources:
        if isinstance(source, JetStreamSource):
            name = source.source.name
            mine = [[d for d in group if d.source == name] for group in (ack, nak, term, hold)]
            if any(mine[:3]):
                await source.settle(mine[0], mine[1], mine[2], delay)
            if mine[3]:
                await source.hold(mine[3])


def owners_changed(bridge: Bridge) -> None:
    """The members changed (`js_routing`): this bridge may now own traces whose upstream
    reports another bridge mapped, and whose downstream reports come here, redelivered or
    late. As a restarted bridge does: replay what was kept, and for a while hold what is left
    unlinked (`JetStreamSource.holdable`), so that its redelivery finds the replayed evidence,
    and replay again as that while ends (`catch_up`), just before the held come back."""
    if bridge._stopping is not None and bridge._stopping.is_set():
        return  # leaving: it owns nothing more
    closes = [source.hold_anew() for source in bridge.sources if isinstance(source, JetStreamSource)]
    if bridge.exchange is not None:
        bridge.exchange.replay_soon()
        catch_up(bridge, closes)


def catch_up(bridge: Bridge, closes: list[float]) -> None:
    """Replay once more as each hold window closes (monotonic `closes`: at the start, or at
    a change): the evidence the former owners keep after the change's replay ran
    (`LinkExchange.replay_at`)."""
    if bridge.exchange is not None:
        for when in set(closes):
            bridge.exchange.replay_at(when)


def answer(held: Held, ack: list[Delivery], nak: list[Delivery], term: list[Delivery], hold: list[Delivery]
           ) -> tuple[list[Delivery], list[Delivery], list[Delivery], list[Delivery]]:
    """Settle the forwarded trace messages among these: their part of their forwards' answers
    (`js_routing`). Returns the others (this bridge's own JetStream messages), to settle."""
    settled: list[Delivery] = []
    fetched: tuple[list[Delivery], list[Delivery], list[Delivery], list[Delivery]] = ([], [], [], [])
    for outcome, group, rest in zip((ACK, NAK, TERM, HOLD), (ack, nak, term, hold), fetched, strict=True):
        for delivery in group:
            if isinstance(delivery.msg, ForwardedMsg):
                delivery.msg.settle(outcome)
                settled.append(delivery)
            else:
                rest.append(delivery)
    held.release(settled)
    return fetched


def _nothing() -> None:
    pass
