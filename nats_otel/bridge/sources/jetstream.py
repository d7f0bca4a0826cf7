"""JetStream intake (at least once): a durable pull consumer on a stream of trace subjects.

The bridge settles every delivery after export: `ack` when exported, `nak(delay)` on a
transient export failure, `term` for a message that can never decode. What is in flight
(fetched, not yet settled) is bounded twice: `max_ack_pending` messages (the server stops
delivering), and `batch.queue_bytes` bytes (`Held`: the bridge stops fetching), so a dead
backend stops intake instead of filling memory, and big trace messages cannot multiply
`max_ack_pending` into gigabytes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg

from nats_otel.bridge.intake import charge
from nats_otel.bridge.settings import BridgeSettings, JetStreamSettings, NatsSettings, NatsSource
from nats_otel.bridge.sources.connection import connect_source, raw_from_msg
from nats_otel.bridge.sources.delivery import Delivery, delivery
from nats_otel.bridge.sources.jetstream_setup import (
    JetStreamSetupError,
    ensure_stream_and_durable,
    set_up_when_answering,
)
from nats_otel.bridge.sources.link import Link
from nats_otel.bridge.telemetry import Metrics

__all__ = ["Held", "JetStreamSetupError", "JetStreamSource"]

log = logging.getLogger("nats_otel.jetstream")

# How many times one downstream report may be held for its upstream's evidence (`holdable`).
_HOLDS = 2


class Held:
    """Trace messages fetched and not yet settled, over all JetStream sources, bounded in bytes
    like the core-mode intake (each charged as there: `intake.charge`). Fetching waits while
    the bound is reached, so it is passed by one fetch batch at most; a message bigger than
    the bound alone is still fetched when nothing else is held (never a deadlock)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self.messages = 0
        self._room = asyncio.Event()
        self._room.set()

    def full(self) -> bool:
        return self.bytes >= self.max_bytes

    async def wait_room(self, timeout: float) -> bool:
        """True once below the bound (at once if it is), False after `timeout` seconds."""
        if not self.full():
            return True
        self._room.clear()
        try:
            await asyncio.wait_for(self._room.wait(), timeout)
        except TimeoutError:
            return False
        return True

    def take(self, deliveries: Sequence[Delivery]) -> None:
        self.bytes += sum(map(charge, deliveries))
        self.messages += len(deliveries)

    def release(self, deliveries: Sequence[Delivery]) -> None:
        self.bytes -= sum(map(charge, deliveries))
        self.messages -= len(deliveries)
        if not self.full():
            self._room.set()


class _Puller:
    """Pull requests to the durable consumer, answered into one callback subscription.

    nats-py's `PullSubscription.fetch` waits for each message with its own task and timer,
    which cost more than converting it; here a callback appends to a buffer and `fetch`
    wakes once per batch. Messages a lingering request delivers after `fetch` returned
    stay in the buffer for the next one (they count against max_ack_pending meanwhile).
    """

    def __init__(self, nc: Client, stream: str, durable: str) -> None:
        self.nc = nc
        self.subject = f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{durable}"
        self.inbox = nc.new_inbox()
        self.buffer: deque[Msg] = deque()
        # Why the durable answered that it is not there (None while it is): an operator
        # deleted it, or nothing serves its pull subject. Pulling again never recovers it.
        self.consumer_gone: str | None = None
        self._wake = asyncio.Event()
        self._want = 1
        self._sub: Any = None

    async def start(self, pending_limit: int) -> None:
        self._sub = await self.nc.subscribe(self.inbox, cb=self._on_msg, pending_msgs_limit=pending_limit)

    async def _on_msg(self, msg: Msg) -> None:
        status = msg.headers.get("Status") if msg.headers else None
        if status is None and msg.reply:
            self.buffer.append(msg)
            if len(self.buffer) >= self._want:
                self._wake.set()
        elif status != "100":  # 404 no messages, 408 expired, 409 limits: this request is over
            description = (msg.headers or {}).get("Description", "")
            if status == "503" or (status == "409" and "consumer deleted" in description.lower()):
                self.consumer_gone = f"{status} {description or 'no responders'}".strip()
            self._wake.set()

    async def _round(self, request: dict[str, Any], want: int, timeout: float) -> None:
        self._want = want
        self._wake.clear()  # before the request: a reply that comes while it is sent still wakes
        await self.nc.publish(self.subject, json.dumps(request).encode(), reply=self.inbox)
        await self._woken(timeout)

    async def _wait(self, want: int, timeout: float) -> None:
        """Until `want` messages wait in the buffer, the open request ends, or `timeout` passed."""
        self._want = want
        if len(self.buffer) < want:
            self._wake.clear()
            await self._woken(timeout)

    async def _woken(self, timeout: float) -> None:
        try:
            await asyncio.wait_for(self._wake.wait(), timeout)
        except TimeoutError:
            pass

    async def fetch(self, batch: int, timeout: float, linger: float = 0.0) -> list[Msg]:
        """Up to `batch` messages: what is there now, else what comes first within `timeout`;
        then, with `linger`, what else comes within `linger` after the first (`batch.max_delay`:
        a bridge with a small share of a moderate rate fetches a few batches a second, not one
        per message that trickles in, as core mode collects them)."""
        open_request = False
        if not self.buffer:
            self.consumer_gone = None  # judged afresh by this round's replies
            # What is there now, at once; else one lingering request until the first arrives.
            await self._round({"batch": batch, "no_wait": True}, batch, timeout)
            if not self.buffer:
                expires = max(int(timeout * 1e9) - 50_000_000, 10_000_000)
                await self._round({"batch": batch, "expires": expires}, 1, timeout)
                open_request = True  # it goes on delivering up to `batch` until it expires
        if linger > 0 and 0 < len(self.buffer) < batch:
            if open_request:
                await self._wait(batch, linger)
            else:
                rest = {"batch": batch - len(self.buffer), "expires": max(int(linger * 1e9), 10_000_000)}
                await self._round(rest, batch, linger + 0.05)
        out: list[Msg] = []
        while self.buffer and len(out) < batch:
            out.append(self.buffer.popleft())
        return out


class JetStreamSource:
    """Fetches batches from the durable consumer of one source's account and settles them."""

    def __init__(self, source: NatsSource, settings: JetStreamSettings, metrics: Metrics,
                 nats_settings: NatsSettings | None = None, held: Held | None = None, link_wait: float = 0.0,
                 linger: float = 0.0) -> None:
        self.source = source
        self._linger = linger  # how long a fetch waits after its first message for more (`_Puller.fetch`)
        # Until then, a downstream report left unlinked may be held (`holdable`): set at start.
        self._hold_until = 0.0
        self._link_wait = link_wait
        self.held = held or Held(256 * 1024 * 1024)
        self.settings = settings
        self.metrics = metrics
        self.nats_settings = nats_settings or NatsSettings()
        self.link = Link(source.name, source.urls)
        self.nc: Client | None = None
        self._sub: _Puller | None = None
        self._received = metrics.received.labels(source.name)
        self._pending = metrics.js_pending.labels(source.name)
        self._recreated = metrics.js_consumer_recreated.labels(source.name)
        self._setup_failed = metrics.js_consumer_setup_failed.labels(source.name)

    @classmethod
    def for_settings(cls, settings: BridgeSettings, metrics: Metrics) -> list[JetStreamSource]:
        """One source per configured source, sharing one `Held` bound (`batch.queue_bytes`),
        which /metrics shows as the intake's depth and bytes (JetStream's intake)."""
        held = Held(settings.batch.queue_bytes)
        metrics.queue_depth.set_function(lambda: held.messages)
        metrics.queue_bytes.set_function(lambda: held.bytes)
        return [cls(src, settings.jetstream, metrics, settings.nats, held, settings.link.wait, settings.batch.max_delay)
                for src in settings.sources]

    @property
    def connected(self) -> bool:
        return self.nc is not None and self.nc.is_connected and self._sub is not None

    async def start(self, stopping: asyncio.Event) -> bool:
        """Connect, then ensure the stream (if asked) and the durable consumer once JetStream
        answers (`jetstream_setup`), bind. False if stopped meanwhile. Raises
        `JetStreamSetupError` when the stream is missing and may not be created, or when
        JetStream did not answer within `jetstream.startup_wait`."""
        self.nc = await connect_source(self.source, self.nats_settings, self.link, self.metrics, stopping)
        if self.nc is None:
            return False
        if not await set_up_when_answering(self.nc, self.source, self.settings, self.link, stopping):
            return False
        s = self.settings
        puller = _Puller(self.nc, s.stream, s.durable)
        await puller.start(pending_limit=4 * max(s.max_ack_pending, s.fetch_batch) + 1024)
        self._sub = puller
        self.hold_anew()
        log.info("consuming", extra={"fields": {"source": self.source.name, "stream": s.stream, "durable": s.durable}})
        return True

    async def fetch(self, timeout: float) -> list[Delivery]:
        """Up to `fetch_batch` messages; [] when none came within `timeout` or not connected."""
        if self._sub is None or self.nc is None or not self.nc.is_connected:
            await asyncio.sleep(min(timeout, 0.5))
            return []
        if not await self.held.wait_room(timeout):
            return []  # batch.queue_bytes held already: settling makes room
        try:
            msgs = await self._sub.fetch(min(self.settings.fetch_batch, self.settings.max_ack_pending), timeout,
                                         self._linger)
        except (TimeoutError, nats.errors.TimeoutError):
            return []
        except nats.errors.Error as exc:  # reconnecting, consumer hiccup: nothing fetched
            log.warning("fetch failed", extra={"fields": {"source": self.source.name, "error": str(exc)}})
            await asyncio.sleep(min(timeout, 0.5))
            return []
        if not msgs and self._sub.consumer_gone:
            await self._recreate_consumer(self._sub.consumer_gone)
            return []
        self._received.inc(len(msgs))
        if msgs:
            self._pending.set(msgs[-1].metadata.num_pending)
        deliveries = [delivery(raw_from_msg(m), self.source.name, m) for m in msgs]
        self.held.take(deliveries)
        return deliveries

    async def _recreate_consumer(self, why: str) -> None:
        """The durable is gone (deleted by an operator, say): set it up again, or retry later.

        Recreated with deliver-all, it delivers the retained messages again: duplicates, never
        loss (at least once). Without this the bridge would pull from nothing forever.
        """
        assert self._sub is not None and self.nc is not None
        log.warning("durable consumer gone; setting it up again", extra={"fields": {
            "source": self.source.name, "durable": self.settings.durable, "reply": why}})
        try:
            await ensure_stream_and_durable(self.nc.jetstream(), self.source, self.settings)
        except (nats.errors.Error, JetStreamSetupError) as exc:
            log.warning("could not set up the durable consumer; retrying", extra={"fields": {
                "source": self.source.name, "error": str(exc)}})
            self._setup_failed.inc()
            await asyncio.sleep(1.0)
            return
        self._sub.consumer_gone = None
        self._recreated.inc()

    def hold_anew(self) -> float:
        """From now, for `link.wait` plus an ack wait, what is left unlinked may be held
        (`holdable`): at the start, and when the bridges' trace ownership changed (`js_routing`).
        Returns when that window closes (monotonic): what was held comes back after it."""
        self._hold_until = time.monotonic() + self._link_wait + self.settings.ack_wait + 1.0
        return self._hold_until

    @property
    def hold_closes(self) -> float:
        """When the current hold window closes (monotonic; `hold_anew`)."""
        return self._hold_until

    def holdable(self, deliveries: Sequence[Delivery]) -> frozenset[int]:
        """For `link.wait` plus an ack wait after the start, what this source fetches first
        may have its upstream report still waiting for redelivery (taken by a bridge killed
        before it could share the evidence): the positions of the deliveries that may be
        held (delivered at most `_HOLDS` times) if left unlinked, instead of exported so."""
        if time.monotonic() >= self._hold_until:
            return frozenset()
        found = []
        for position, item in enumerate(deliveries):
            try:
                delivered = item.msg.metadata.num_delivered
            except Exception:  # noqa: BLE001 - not a JetStream message (no metadata): never held
                continue
            if delivered <= _HOLDS:
                found.append(position)
        return frozenset(found)

    async def hold(self, deliveries: Sequence[Delivery]) -> None:
        """Nak what was held until after the hold window (`holdable`), counted."""
        self.metrics.link_held.inc(len(deliveries))
        delay = max(1.0, self._hold_until - time.monotonic() + self.settings.ack_wait / 5)
        await self.settle((), deliveries, (), delay)

    async def settle(self, ack: Sequence[Delivery], nak: Sequence[Delivery], term: Sequence[Delivery],
                     nak_delay: float) -> None:
        """Acknowledge a processed batch. A lost ack only means a redelivery (at least once)."""
        self.held.release([*ack, *nak, *term])  # settled or not, the bridge lets go of them
        for kind, group in (("ack", ack), ("nak", nak), ("term", term)):
            for d in group:
                try:
                    if kind == "ack":
                        await d.msg.ack()
                    elif kind == "nak":
                        await d.msg.nak(delay=nak_delay)
                    else:
                        await d.msg.term()
                except nats.errors.Error as exc:
                    log.warning("settling failed; the message will be redelivered",
                                extra={"fields": {"kind": kind, "error": str(exc)}})
                    continue
            if group:
                self.metrics.js_acks.labels(kind).inc(len(group))
        if self.nc is not None and self.nc.is_connected and (ack or nak or term):
            try:
                await self.nc.flush(timeout=5)
            except Exception as exc:  # noqa: BLE001 - unflushed acks are redelivered later
                log.warning("flush after settling failed", extra={"fields": {"error": str(exc)}})

    async def close(self) -> None:
        if self.nc is not None and not self.nc.is_closed:
            await self.nc.close()
