"""One NATS connection per configured source: auth, TLS, reconnect, connection metrics."""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import nats
from nats.aio.client import Client

from nats_otel.bridge.settings import NatsSource
from nats_otel.bridge.telemetry import Metrics
from nats_otel.core.decode import RawTraceMessage

__all__ = ["connect_source", "raw_from_msg"]

log = logging.getLogger("nats_otel.nats")


def raw_from_msg(msg: Any) -> RawTraceMessage:
    """A nats-py message as the core's input (nats-py keeps one value per header name)."""
    headers = {name: [value] for name, value in msg.headers.items()} if msg.headers else {}
    return RawTraceMessage(msg.subject, headers, msg.data, _received_at())


_last_stamp: list[Any] = [0, ""]


def _received_at() -> str:
    """Now as RFC 3339 (UTC, microseconds), formatted at most once per millisecond: at tens
    of thousands of messages per second the formatting was a visible part of the receive path."""
    now_us = time.time_ns() // 1000
    if now_us // 1000 != _last_stamp[0]:
        _last_stamp[0] = now_us // 1000
        _last_stamp[1] = datetime.fromtimestamp(now_us / 1e6, UTC).isoformat().replace("+00:00", "Z")
    return _last_stamp[1]


def _tls_context(source: NatsSource) -> ssl.SSLContext | None:
    if not source.tls.enabled:
        return None
    context = ssl.create_default_context(cafile=str(source.tls.ca) if source.tls.ca else None)
    if source.tls.cert and source.tls.key:
        context.load_cert_chain(str(source.tls.cert), str(source.tls.key))
    return context


async def connect_source(
    source: NatsSource,
    metrics: Metrics,
    stopping: asyncio.Event,
    on_error: Callable[[Exception], None] | None = None,
    max_backoff: float = 10.0,
) -> Client | None:
    """Connect, retrying with backoff until connected or `stopping` is set (then None).

    After the first connect, nats-py reconnects by itself, forever; the callbacks keep the
    `nats_otel_nats_connected` gauge and the logs up to date.
    """
    label = source.name

    async def error_cb(exc: Exception) -> None:
        if on_error is not None:
            on_error(exc)
        if not isinstance(exc, nats.errors.SlowConsumerError):
            log.warning("NATS error", extra={"fields": {"source": label, "error": str(exc)}})

    async def disconnected_cb() -> None:
        metrics.connected.labels(label).set(0)
        # Our own drain/close disconnects too: that is not worth a warning.
        level = logging.INFO if stopping.is_set() else logging.WARNING
        log.log(level, "NATS disconnected", extra={"fields": {"source": label}})

    async def reconnected_cb() -> None:
        metrics.connected.labels(label).set(1)
        log.info("NATS reconnected", extra={"fields": {"source": label}})

    options: dict[str, Any] = {
        "servers": source.urls,
        "name": f"nats-otel-bridge:{label}",
        "error_cb": error_cb,
        "disconnected_cb": disconnected_cb,
        "reconnected_cb": reconnected_cb,
        "allow_reconnect": True,
        "max_reconnect_attempts": -1,
        "reconnect_time_wait": 1,
        "connect_timeout": 5,
        "tls": _tls_context(source),
    }
    if source.creds:
        options["user_credentials"] = str(source.creds)
    if source.nkey_seed:
        options["nkeys_seed"] = str(source.nkey_seed)
    if source.user is not None:
        options["user"], options["password"] = source.user, source.password
    if source.token is not None:
        options["token"] = source.token
    backoff = 0.5
    while not stopping.is_set():
        # nats-py retries a refused first connect (e.g. an authorization violation) inside
        # `connect` itself, forever with max_reconnect_attempts=-1: race it against the stop
        # flag, or SIGTERM could never end a bridge that cannot get in.
        attempt = asyncio.ensure_future(nats.connect(**options))
        stop_wait = asyncio.ensure_future(stopping.wait())
        await asyncio.wait({attempt, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
        stop_wait.cancel()
        if not attempt.done():
            attempt.cancel()
            await asyncio.gather(attempt, return_exceptions=True)
            return None
        try:
            nc = attempt.result()
        except Exception as exc:  # noqa: BLE001 - any connect failure: retry with backoff
            log.warning("NATS connect failed, retrying", extra={"fields": {
                "source": label, "error": f"{type(exc).__name__}: {exc}", "retry_in": backoff}})
            try:
                await asyncio.wait_for(stopping.wait(), backoff)
            except TimeoutError:
                pass
            backoff = min(backoff * 2, max_backoff)
            continue
        metrics.connected.labels(label).set(1)
        server = f"{nc.connected_url.hostname}:{nc.connected_url.port}" if nc.connected_url else None
        log.info("NATS connected", extra={"fields": {"source": label, "server": server}})
        return nc
    return None
