"""A JetStream source's stream (created if allowed) and durable consumer, set up at start-up
once JetStream answers.

A bridge started together with its servers (a Kubernetes pod, `docker compose up`) is
connected before JetStream can answer: no responders until the JetStream API's interest
reaches its server, no answer at all (each request's 5 s timeout) until the cluster's meta
group has elected a leader, 503 while JetStream is unavailable. Those answers are retried
for `jetstream.startup_wait` seconds, each retry logged with its reason; then the bridge
stops (exit 2) with the message it used to stop with at once, saying how long it waited.
Any other answer (the stream missing and not to be created, a refused configuration) is
fatal at once: waiting would not change it.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time

import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, StorageType, StreamConfig

from nats_otel.bridge.settings import JetStreamSettings, NatsSource
from nats_otel.bridge.sources.connection import unless_stopped
from nats_otel.bridge.sources.link import Link, doubling_wait

__all__ = ["JetStreamSetupError", "ensure_stream_and_durable", "not_answering", "set_up_when_answering"]

log = logging.getLogger("nats_otel.jetstream")

# The pace of the retries: the first soon (a meta leader is often elected a second or two
# after the servers start), then doubling to one every 2 s, so that a long wait logs a line
# every 2 s rather than one per attempt of a tight loop.
_FIRST_RETRY_S = 0.25
_MAX_RETRY_S = 2.0


class JetStreamSetupError(RuntimeError):
    """The stream or consumer cannot be used as configured: fatal."""


async def ensure_stream_and_durable(js: JetStreamContext, source: NatsSource, settings: JetStreamSettings) -> None:
    """The stream (created if allowed) and the durable consumer."""
    s = settings
    try:
        await js.stream_info(s.stream)
    except nats.js.errors.NotFoundError:
        if not s.create_stream:
            raise JetStreamSetupError(
                f"stream {s.stream!r} not found in source {source.name!r}'s account; "
                "create it or pass --create-stream") from None
        await js.add_stream(StreamConfig(
            name=s.stream, subjects=list(source.subjects), storage=StorageType.FILE, max_age=s.stream_max_age,
        ))
        log.info("stream created", extra={"fields": {"stream": s.stream, "subjects": source.subjects}})
    config = ConsumerConfig(
        durable_name=s.durable, ack_policy=AckPolicy.EXPLICIT, deliver_policy=DeliverPolicy.ALL,
        ack_wait=s.ack_wait, max_ack_pending=s.max_ack_pending, max_deliver=-1,
    )
    try:
        await js.add_consumer(s.stream, config)
    except nats.js.errors.BadRequestError as exc:
        # An existing durable with another config: use it as it is, but say so.
        log.warning("durable consumer exists with a different config; using it",
                    extra={"fields": {"durable": s.durable, "error": str(exc)}})


def _no_responders(exc: BaseException) -> bool:
    # nats-py turns "no responders" to a JetStream API request into a bare 503 (no code).
    return isinstance(exc, nats.errors.NoRespondersError) or (
        isinstance(exc, nats.js.errors.ServiceUnavailableError) and exc.code is None and not exc.description)


def not_answering(exc: BaseException) -> str | None:
    """Why JetStream has not answered yet, when `exc` says that it may still: None for an
    answer that waiting does not change."""
    if _no_responders(exc):
        return "no responders: nothing serves the JetStream API in this account (yet)"
    if isinstance(exc, (nats.errors.TimeoutError, TimeoutError)):
        return "no answer in time (no JetStream meta leader yet?)"
    if isinstance(exc, nats.js.errors.ServiceUnavailableError):
        return f"unavailable: {exc.description}"
    return None


def _setup_error(exc: BaseException, source: NatsSource, settings: JetStreamSettings) -> BaseException:
    """What a failed setup stops the bridge with (other errors propagate as they are)."""
    if _no_responders(exc) or isinstance(exc, (nats.errors.TimeoutError, TimeoutError)):
        return JetStreamSetupError(
            f"source {source.name!r}: JetStream does not answer in this account (not enabled for it?)")
    if isinstance(exc, nats.js.errors.APIError):
        return JetStreamSetupError(
            f"source {source.name!r}: cannot set up stream {settings.stream!r} / durable "
            f"{settings.durable!r}: {exc.description or exc}")
    return exc


async def set_up_when_answering(nc: Client, source: NatsSource, settings: JetStreamSettings, link: Link,
                                stopping: asyncio.Event) -> bool:
    """Ensure the stream and the durable, retrying while JetStream does not answer yet, for
    `settings.startup_wait` seconds. True once set up; False if `stopping` came first.
    Raises `JetStreamSetupError` at once for an answer that waiting does not change, and
    after the wait for one that it might."""
    started = time.monotonic()
    rng = random.Random()
    attempts = 0
    while True:
        attempts += 1
        attempt = await unless_stopped(ensure_stream_and_durable(nc.jetstream(), source, settings), stopping)
        if attempt is None:
            return False
        error = attempt.exception()
        waited = time.monotonic() - started
        if error is None:
            link.waiting = None
            if attempts > 1:
                log.info("JetStream answers", extra={"fields": {
                    "source": source.name, "attempts": attempts, "waited": round(waited, 1)}})
            return True
        reason = not_answering(error)
        if reason is None:
            raise _setup_error(error, source, settings)
        if waited >= settings.startup_wait:
            raise JetStreamSetupError(f"{_setup_error(error, source, settings)}; waited {waited:.1f}s for it "
                                      f"(jetstream.startup_wait {settings.startup_wait:g}s)")
        # The last attempt is made at the end of the wait, not after it.
        retry_in = min(doubling_wait(attempts, _FIRST_RETRY_S, _MAX_RETRY_S, rng), settings.startup_wait - waited)
        link.waiting = (f"waiting for JetStream: {reason} ({attempts} attempts in {waited:.1f}s of "
                        f"{settings.startup_wait:g}s)")
        log.warning("JetStream does not answer yet; waiting", extra={"fields": {
            "source": source.name, "url": link.url, "reason": reason, "error": f"{type(error).__name__}: {error}",
            "attempts": attempts, "waited": round(waited, 1), "retry_in": round(retry_in, 2),
            "startup_wait": settings.startup_wait}})
        try:
            await asyncio.wait_for(stopping.wait(), retry_in)
            return False
        except TimeoutError:
            pass
