"""Core NATS intake (at most once): subscriptions whose callbacks never block.

A callback only turns the message into a `Delivery` and offers it to the bridge's intake
(bounded in bytes, `intake.py`); when it does not fit the message is dropped and counted
(`queue_full`). Messages nats-py drops itself (its per-subscription limits, set in step with
the intake's) arrive as slow-consumer errors and are counted too (`slow_consumer`).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, Protocol

import nats.errors
from nats.aio.client import Client
from nats.aio.subscription import Subscription

from nats_otel.bridge.settings import BatchSettings, NatsSettings, NatsSource
from nats_otel.bridge.sources.connection import connect_source, raw_from_msg
from nats_otel.bridge.sources.link import Link
from nats_otel.bridge.telemetry import Metrics
from nats_otel.core.decode import RawTraceMessage

__all__ = ["CoreSource", "Delivery"]

log = logging.getLogger("nats_otel.core")


@dataclass(slots=True)
class Delivery:
    """A received trace message; `msg` is the JetStream message to settle, if any."""

    raw: RawTraceMessage
    source: str
    msg: Any = None


class Sink(Protocol):
    """Where received messages go (the bridge's `Intake`): False means it did not fit."""

    def offer(self, delivery: Delivery) -> bool: ...


class CoreSource:
    """Subscribes one source's trace subjects (optionally in a queue group)."""

    def __init__(self, source: NatsSource, batch: BatchSettings, intake: Sink,
                 metrics: Metrics, nats_settings: NatsSettings | None = None) -> None:
        self.source = source
        self.batch = batch
        self.intake = intake
        self.metrics = metrics
        self.nats_settings = nats_settings or NatsSettings()
        self.link = Link(source.name, source.urls)
        self.nc: Client | None = None
        self._subs: list[Subscription] = []
        self._received = metrics.received.labels(source.name)
        self._queue_full = metrics.dropped.labels("queue_full")
        self._slow = metrics.dropped.labels("slow_consumer")

    @property
    def connected(self) -> bool:
        return self.nc is not None and self.nc.is_connected

    def _on_error(self, exc: Exception) -> None:
        if isinstance(exc, nats.errors.SlowConsumerError):
            self._slow.inc()  # nats-py reports each message it dropped

    async def start(self, stopping: asyncio.Event) -> bool:
        """Connect and subscribe; False if asked to stop before connecting."""
        self.nc = await connect_source(self.source, self.nats_settings, self.link, self.metrics, stopping,
                                       self._on_error)
        if self.nc is None:
            return False
        for subject in self.source.subjects:
            # nats-py's buffer in front of the callback gets the intake's byte bound: it must
            # never be the one that drops a burst the intake could still hold.
            sub = await self.nc.subscribe(
                subject, queue=self.source.queue or "", cb=self._on_msg,
                pending_msgs_limit=self.batch.pending_msgs_limit, pending_bytes_limit=self.batch.queue_bytes,
            )
            self._subs.append(sub)
        await self.nc.flush()
        log.info("subscribed", extra={"fields": {"source": self.source.name, "subjects": self.source.subjects,
                                                 "queue": self.source.queue}})
        return True

    async def _on_msg(self, msg: Any) -> None:
        # Never blocks, never awaits: the NATS read path must keep up.
        self._received.inc()
        if not self.intake.offer(Delivery(raw_from_msg(msg), self.source.name)):
            self._queue_full.inc()

    async def stop_intake(self) -> None:
        """Unsubscribe after the messages already read have reached the queue."""
        for sub in self._subs:
            try:
                await sub.drain()
            except Exception as exc:  # noqa: BLE001 - a closed connection has nothing left
                log.debug("drain failed", extra={"fields": {"source": self.source.name, "error": str(exc)}})
        self._subs.clear()

    async def close(self) -> None:
        if self.nc is not None and not self.nc.is_closed:
            await self.nc.close()
