"""Core NATS intake (at most once): subscriptions whose messages go straight to the intake.

Each message becomes a `Delivery` offered to the bridge's intake (bounded in bytes,
`intake.py`); what does not fit is dropped and counted (`queue_full`). That bound is the
only one: the subscriptions are direct (`direct.py`: nats-py's parser hands subject, raw
header block and payload to `_on_raw`, with no `Msg`, no queue and no task in between), so
nats-py's per-subscription pending limits do not apply to them and nothing is dropped as a
slow consumer. When the installed nats-py cannot be served directly (`direct.UNSUPPORTED`,
logged once), the subscriptions take a callback as before; there nats-py's buffer gets
limits in step with the intake's, and what it drops arrives as slow-consumer errors,
counted `slow_consumer`.

Headers are parsed here (`headers.py`, every value of a name kept) only when a message
has any; a malformed part is skipped, the message kept, and counted in
`nats_otel_mapping_issues{kind="malformed_header"}` and logged (at most every 10 s).
`stop_intake` drains: UNSUB, then a flush; what was read before it is in the intake.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Protocol

import nats.errors
from nats.aio.client import Client
from nats.aio.subscription import Subscription

from nats_otel.bridge.intake import Intake
from nats_otel.bridge.settings import BatchSettings, NatsSettings, NatsSource
from nats_otel.bridge.sources import direct, frames
from nats_otel.bridge.sources.connection import connect_source, raw_from_msg
from nats_otel.bridge.sources.delivery import MESSAGE_OVERHEAD, Delivery, delivery
from nats_otel.bridge.sources.headers import HeaderReader, SubjectTexts
from nats_otel.bridge.sources.link import Link
from nats_otel.bridge.sources.stamp import CURRENT as _STAMP
from nats_otel.bridge.telemetry import Metrics
from nats_otel.core.decode import NO_RAW_HEADERS, RawTraceMessage

__all__ = ["CoreSource", "Delivery"]

# How long after subscribing the bridge counts on every server of the network to send it
# the reports of its subjects (interest propagation over routes, gateways, leafnodes).
_INTEREST_MARGIN_NS = 500_000_000

log = logging.getLogger("nats_otel.core")

_fallback_logged: list[bool] = [False]


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
        self._headers = HeaderReader(metrics.issues.labels("malformed_header"), log, {"source": source.name})
        # Times a trace message of this source could have been lost since it started: a drop
        # of its own (queue_full, slow_consumer) or a lost connection (`link.downs`). Each
        # delivery carries the count it was received under (`Delivery.breaks`).
        self._dropped = 0
        # Report time from which this source received every report of its subscriptions,
        # while it lost nothing (`ReportLedger.whole`); None until subscribed.
        self.whole_since_ns: int | None = None
        # The breaks when it became whole (`whole_since_ns`): whole while they are the same.
        self.since_breaks = 0
        self._on_raw = self.direct_handler()

    @property
    def breaks(self) -> int:
        return self._dropped + self.link.downs

    def note_reroute(self, margin_ns: int) -> None:
        """The bridges' trace ownership changed (`routing`): what this source received before
        went to other owners than what it receives after, so it vouches anew from here: a
        break, like a loss (`_dropped` is what the receive path reads inline), and whole
        again from now (report time: `margin_ns`, twice the clock skew, after it)."""
        self._dropped += 1
        self.since_breaks = self.breaks
        self.whole_since_ns = time.time_ns() + margin_ns

    @property
    def connected(self) -> bool:
        return self.nc is not None and self.nc.is_connected

    def _on_error(self, exc: Exception) -> None:
        if isinstance(exc, nats.errors.SlowConsumerError):
            self._slow.inc()  # nats-py reports each message it dropped
            self._dropped += 1

    async def start(self, stopping: asyncio.Event) -> bool:
        """Connect and subscribe; False if asked to stop before connecting."""
        if direct.UNSUPPORTED is not None and not _fallback_logged[0]:
            _fallback_logged[0] = True
            log.warning("direct receive unavailable; using nats-py callbacks",
                        extra={"fields": {"reason": direct.UNSUPPORTED}})
        self.nc = await connect_source(self.source, self.nats_settings, self.link, self.metrics, stopping,
                                       self._on_error, direct=True)
        if self.nc is None:
            return False
        for subject in self.source.subjects:
            self._subs.append(await self._subscribe(self.nc, subject))
        await self.nc.flush()
        # The server has the subscriptions; the other servers of its cluster, gateways and
        # leafnodes learn of the interest a little later: a report published before that is
        # never sent. A margin, generous against the milliseconds that takes.
        self.whole_since_ns = time.time_ns() + _INTEREST_MARGIN_NS
        log.info("subscribed", extra={"fields": {"source": self.source.name, "subjects": self.source.subjects,
                                                 "queue": self.source.queue,
                                                 "direct": isinstance(self.nc, direct.DirectClient),
                                                 "frames": self._frame_reader()}})
        return True

    def _frame_reader(self) -> str:
        """Which parser reads the frames: the frame scanner ("compiled" or "python") in front
        of nats-py's, or nats-py's alone ("nats-py")."""
        if isinstance(self.nc, direct.DirectClient) and isinstance(self.nc._ps, direct.DirectParser):
            return frames.IMPLEMENTATION
        return "nats-py"

    async def _subscribe(self, nc: Client, subject: str) -> Subscription:
        if isinstance(nc, direct.DirectClient):
            return await nc.subscribe_direct(subject, self._on_raw, queue=self.source.queue or "")
        # nats-py's buffer in front of the callback gets the intake's byte bound: it must
        # never be the one that drops a burst the intake could still hold.
        return await nc.subscribe(
            subject, queue=self.source.queue or "", cb=self._on_msg,
            pending_msgs_limit=self.batch.pending_msgs_limit, pending_bytes_limit=self.batch.queue_bytes,
        )

    def direct_handler(self) -> direct.DirectHandler:
        """The per-message function of the direct path: the compiled `DeliverySink` when the
        frame scanner is compiled and the intake is the bridge's `Intake` (whose `offer` it
        runs inline), else `on_raw` below, the reference."""
        sink = frames.delivery_sink()
        if sink is not None and type(self.intake) is Intake:
            return sink(self, self.intake, self._received, self._queue_full, self._headers, SubjectTexts(),
                        _STAMP, self.link, self.source.name)
        return self.python_handler()

    def python_handler(self) -> direct.DirectHandler:
        """The per-message function of the direct path, its lookups bound once: it runs for
        every message inside nats-py's parser, so it never awaits and never raises."""
        tally = self._received
        offer = self.intake.offer
        queue_full = self._queue_full
        name = self.source.name
        headers_of = self._headers
        link = self.link

        stamp = _STAMP
        subjects = SubjectTexts()  # each subject's text made once, not per message

        def on_raw(subject: bytes, _reply: bytes | None, header_block: bytes | None, payload: bytes) -> None:
            tally.value += 1
            subject_text = subjects.get(subject) or subjects.add(subject)
            # The read's receive time, stamped once per read by the parser (stamp.py).
            raw = RawTraceMessage(subject_text, headers_of(header_block) if header_block else NO_RAW_HEADERS, payload,
                                  stamp[0])
            # `delivery(raw, name)`, inline (a call less per message): sized as `size_of` sizes it.
            if not offer(Delivery(raw, name, len(payload) + len(subject_text) + MESSAGE_OVERHEAD, None,
                                  self._dropped + link.downs)):
                queue_full.inc()
                self._dropped += 1

        return on_raw

    async def _on_msg(self, msg: Any) -> None:
        # The fallback path. Never blocks, never awaits: the NATS read path must keep up.
        self._received.inc()
        received = delivery(raw_from_msg(msg), self.source.name)
        received.breaks = self.breaks
        if not self.intake.offer(received):
            self._queue_full.inc()
            self._dropped += 1

    async def stop_intake(self) -> None:
        """Unsubscribe after the messages already read have reached the intake."""
        for sub in self._subs:
            try:
                await sub.drain()
            except Exception as exc:  # noqa: BLE001 - a closed connection has nothing left
                log.debug("drain failed", extra={"fields": {"source": self.source.name, "error": str(exc)}})
        self._subs.clear()

    async def close(self) -> None:
        if self.nc is not None and not self.nc.is_closed:
            await self.nc.close()
