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
import logging
import time
from collections.abc import Sequence

import nats.errors
from nats.aio.client import Client

from nats_otel.bridge.intake import charge
from nats_otel.bridge.settings import BridgeSettings, JetStreamSettings, NatsSettings, NatsSource
from nats_otel.bridge.sources.connection import connect_source
from nats_otel.bridge.sources.delivery import Delivery, delivery
from nats_otel.bridge.sources.jetstream_setup import (
    JetStreamSetupError,
    ensure_stream_and_durable,
    set_up_when_answering,
)
from nats_otel.bridge.sources.js_pull import Puller
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


class JetStreamSource:
    """Fetches batches from the durable consumer of one source's account and settles them."""

    def __init__(self, source: NatsSource, settings: JetStreamSettings, metrics: Metrics,
                 nats_settings: NatsSettings | None = None, held: Held | None = None, link_wait: float = 0.0,
                 linger: float = 0.0) -> None:
        self.source = source
        self._linger = linger  # how long a fetch waits after its first message for more (`Puller.fetch`)
        # Until then, a downstream report left unlinked may be held (`holdable`): set at start.
        self._hold_until = 0.0
        self._link_wait = link_wait
        self.held = held or Held(256 * 1024 * 1024)
        self.settings = settings
        self.metrics = metrics
        self.nats_settings = nats_settings or NatsSettings()
        self.link = Link(source.name, source.urls)
        self.nc: Client | None = None
        self._sub: Puller | None = None
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
        # A DirectClient where nats-py allows it: the pull replies skip its per-message path (`js_pull`).
        self.nc = await connect_source(self.source, self.nats_settings, self.link, self.metrics, stopping,
                                       direct=True)
        if self.nc is None:
            return False
        if not await set_up_when_answering(self.nc, self.source, self.settings, self.link, stopping):
            return False
        s = self.settings
        puller = Puller(self.nc, s.stream, s.durable, self.metrics.issues.labels("malformed_header"))
        await puller.start(pending_limit=4 * max(s.max_ack_pending, s.fetch_batch) + 1024)
        self._sub = puller
        self.hold_anew()
        log.info("consuming", extra={"fields": {"source": self.source.name, "stream": s.stream, "durable": s.durable,
                                                  "direct": puller.direct}})
        return True

    async def fetch(self, timeout: float) -> list[Delivery]:
        """Up to `fetch_batch` messages; [] when none came within `timeout` or not connected."""
        if self._sub is None or self.nc is None or not self.nc.is_connected:
            await asyncio.sleep(min(timeout, 0.5))
            return []
        if not await self.held.wait_room(timeout):
            return []  # batch.queue_bytes held already: settling makes room
        try:
            pulled = await self._sub.fetch(min(self.settings.fetch_batch, self.settings.max_ack_pending), timeout,
                                         self._linger)
        except (TimeoutError, nats.errors.TimeoutError):
            return []
        except nats.errors.Error as exc:  # reconnecting, consumer hiccup: nothing fetched
            log.warning("fetch failed", extra={"fields": {"source": self.source.name, "error": str(exc)}})
            await asyncio.sleep(min(timeout, 0.5))
            return []
        if not pulled and self._sub.consumer_gone:
            await self._recreate_consumer(self._sub.consumer_gone)
            return []
        self._received.inc(len(pulled))
        if pulled:
            self._pending.set(pulled[-1][0].metadata.num_pending)
        deliveries = [delivery(raw, self.source.name, msg) for msg, raw in pulled]
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
        """Acknowledge a processed batch. A lost ack only means a redelivery (at least once).
        Not flushed here: nats-py's flusher writes them at once, in order with what follows on the
        connection (the next pull request), and closing the connection writes what is left;
        a round trip per batch (and per answered forward) cost a PING, a PONG and a wake-up."""
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

    async def close(self) -> None:
        if self.nc is not None and not self.nc.is_closed:
            await self.nc.close()
