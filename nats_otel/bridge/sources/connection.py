"""One NATS connection per configured source: auth, TLS, (re)connect with backoff, metrics.

nats-py's own first connect retries forever at a fixed pace, and its error callback learns
neither which URL failed nor that an attempt is over. So the first connection is made here,
one attempt (one URL) at a time: the error callback ends the attempt by raising
`_AttemptFailed` out of `Client.connect`; the next URL is tried at once, and after each round
over the URLs the wait grows to a cap with jitter (`link.next_wait`). Once connected, nats-py reconnects by itself; its
`reconnect_to_server_handler` (nats-py 2.16+) picks the server and the same growing wait.
Every failure is logged with the URL (no credentials) and what it is, and kept in the
source's `Link` for `/readyz` and the give-up timer.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import random
import ssl
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import nats
from nats.aio.client import Client

from nats_otel.bridge.settings import NatsSettings, NatsSource
from nats_otel.bridge.sources import direct as direct_dispatch
from nats_otel.bridge.sources.link import Link, classify, next_wait
from nats_otel.bridge.sources.stamp import received_at
from nats_otel.bridge.telemetry import Metrics
from nats_otel.core.decode import NO_RAW_HEADERS, RawTraceMessage

__all__ = ["connect_source", "raw_from_msg", "received_at", "unless_stopped"]

log = logging.getLogger("nats_otel.nats")
T = TypeVar("T")


def raw_from_msg(msg: Any) -> RawTraceMessage:
    """A nats-py message as the core's input (nats-py keeps one value per header name)."""
    headers = {name: [value] for name, value in msg.headers.items()} if msg.headers else NO_RAW_HEADERS
    return RawTraceMessage(msg.subject, headers, msg.data, received_at())


def _tls_context(source: NatsSource) -> ssl.SSLContext | None:
    if not source.tls.enabled:
        return None
    context = ssl.create_default_context(cafile=str(source.tls.ca) if source.tls.ca else None)
    if source.tls.cert and source.tls.key:
        context.load_cert_chain(str(source.tls.cert), str(source.tls.key))
    return context


def _auth_options(source: NatsSource) -> dict[str, Any]:
    options: dict[str, Any] = {}
    if source.creds:
        options["user_credentials"] = str(source.creds)
    if source.nkey_seed:
        options["nkeys_seed"] = str(source.nkey_seed)
    if source.user is not None:
        options["user"], options["password"] = source.user, source.password
    if source.token is not None:
        options["token"] = source.token
    return options


# Older nats-py has no reconnect handler: it then waits a fixed `reconnect_wait_initial`.
_HAS_RECONNECT_HANDLER = "reconnect_to_server_handler" in inspect.signature(Client.connect).parameters


class _AttemptFailed(Exception):
    """Raised from the error callback to end nats-py's connect after one failed attempt.
    Deliberately not an OSError or nats error: `Client.connect` catches those and retries."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


class _Callbacks:
    """The callbacks of one client: during its first connect they end the attempt at the
    first error; afterwards they keep the link, the metric and the log up to date."""

    def __init__(self, link: Link, settings: NatsSettings, metrics: Metrics, stopping: asyncio.Event,
                 on_error: Callable[[Exception], None] | None, rng: random.Random) -> None:
        self.link = link
        self.settings = settings
        self.gauge = metrics.connected.labels(link.name)
        self.reconnects = metrics.reconnects.labels(link.name)
        self.stopping = stopping
        self.on_error = on_error
        self.rng = rng
        self.client: Client | None = None
        self.connecting = True    # the first connect: any error ends the attempt
        self.discarded = False    # a failed attempt's client being closed: stay quiet
        self._turn = 0

    def connected_now(self) -> None:
        """The first connect succeeded: from now on errors are the connection's, not the attempt's."""
        self.connecting = False
        url = self.client.connected_url.geturl() if self.client and self.client.connected_url else None
        self.link.up(url)
        self.gauge.set(1)
        log.info("NATS connected", extra={"fields": {"source": self.link.name, "url": self.link.url}})

    async def error(self, exc: Exception) -> None:
        if self.connecting:
            raise _AttemptFailed(exc)
        if self.discarded:
            return
        if self.on_error is not None:
            self.on_error(exc)
        if isinstance(exc, nats.errors.SlowConsumerError):
            return  # counted by the source, one per message: a log line each would flood
        if self.client is not None and self.client.is_reconnecting:
            pool = len(self.client.servers)
            wait = (next_wait(self.link.failures + 1, pool, self.settings, self.rng) if _HAS_RECONNECT_HANDLER
                    else self.settings.reconnect_wait_initial)  # nats-py's own fixed wait
            self.link.failed(exc, wait)
            log_failure(self.link, "NATS reconnect failed")
            return
        kind, reason = classify(exc)
        log.warning("NATS error", extra={"fields": {"source": self.link.name, "url": self.link.url,
                                                    "kind": kind, "reason": reason,
                                                    "error": f"{type(exc).__name__}: {exc}"}})

    def choose(self, servers: list[Any], _info: dict[str, Any]) -> tuple[Any, float]:
        """nats-py asks before each reconnect attempt: the next server in turn, and the wait
        (none right after the loss, then the growing backoff). Never raises: nats-py would
        call it again at once."""
        server = servers[self._turn % len(servers)] if servers else None
        self._turn += 1
        if server is not None:
            try:
                self.link.attempting(server.uri.geturl())
            except (AttributeError, ValueError):
                pass  # an odd URL is only not logged; the attempt still happens
        return server, (self.link.retry_in or 0.0) if self.link.failures else 0.0

    async def disconnected(self) -> None:
        if self.connecting or self.discarded:
            return
        self.link.down()
        self.gauge.set(0)
        # Our own drain/close disconnects too: that is not worth a warning.
        level = logging.INFO if self.stopping.is_set() else logging.WARNING
        log.log(level, "NATS disconnected", extra={"fields": {"source": self.link.name, "url": self.link.url}})

    async def reconnected(self) -> None:
        url = self.client.connected_url.geturl() if self.client and self.client.connected_url else None
        self.link.up(url)
        self.gauge.set(1)
        self.reconnects.inc()
        log.info("NATS reconnected", extra={"fields": {"source": self.link.name, "url": self.link.url}})

    async def closed(self) -> None:
        if self.connecting or self.discarded or self.stopping.is_set():
            return
        # nats-py closes for good on some server errors (an authorization violation reported
        # mid-session): no reconnect follows. Say so; `nats.give_up_after` ends the bridge.
        self.link.down()
        self.gauge.set(0)
        last = self.client.last_error if self.client is not None else None
        self.link.kind, self.link.reason = classify(last) if last else ("closed", "connection closed")
        self.link.reason = f"closed for good by the client after: {self.link.reason}"
        self.link.retry_in = None
        log.error("NATS connection closed; it will not reconnect", extra={"fields": {
            "source": self.link.name, "url": self.link.url, "kind": self.link.kind, "reason": self.link.reason}})


def log_failure(link: Link, message: str) -> None:
    """One line per failed attempt: where, what (authorization called so), when next."""
    fields = {"source": link.name, "url": link.url, "kind": link.kind, "reason": link.reason,
              "error": link.error, "failures": link.failures, "retry_in": round(link.retry_in or 0.0, 2)}
    # A refused login is a configuration problem until someone fixes it: an error, not a blip.
    log.log(logging.ERROR if link.kind == "authorization" else logging.WARNING, message,
            extra={"fields": fields})


async def _discard(client: Client) -> None:
    """Close a client whose first connect failed (its socket may be open after an auth error)."""
    try:
        await client.close()
    except Exception as exc:  # noqa: BLE001 - half-made client: nothing more to release
        log.debug("closing a failed connection attempt failed", extra={"fields": {"error": str(exc)}})


async def unless_stopped(work: Awaitable[T], stopping: asyncio.Event) -> asyncio.Future[T] | None:
    """Run `work` until it is done (its future, to read its result or exception) or until
    `stopping` is set (then it is cancelled: None), so that a SIGTERM never waits for a
    connection attempt or a request to time out."""
    attempt = asyncio.ensure_future(work)
    stop_wait = asyncio.ensure_future(stopping.wait())
    await asyncio.wait({attempt, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
    stop_wait.cancel()
    if attempt.done():
        return attempt
    attempt.cancel()
    await asyncio.gather(attempt, return_exceptions=True)
    return None


async def connect_source(
    source: NatsSource,
    settings: NatsSettings,
    link: Link,
    metrics: Metrics,
    stopping: asyncio.Event,
    on_error: Callable[[Exception], None] | None = None,
    direct: bool = False,
) -> Client | None:
    """Connect, one attempt at a time with a growing wait, until connected or `stopping` is
    set (then None). `link` follows every attempt; reconnects are nats-py's afterwards.
    `direct`: a `DirectClient` (when the installed nats-py allows it), for core mode."""
    rng = random.Random()
    urls = list(source.urls)
    attempt_no = 0
    while not stopping.is_set():
        first = attempt_no % len(urls)
        attempt_no += 1
        # The URL tried first rotates; the others stay in the pool for later reconnects.
        ordered = urls[first:] + urls[:first]
        link.attempting(ordered[0])
        callbacks = _Callbacks(link, settings, metrics, stopping, on_error, rng)
        direct_ok = direct and direct_dispatch.UNSUPPORTED is None
        client = callbacks.client = (direct_dispatch.DirectClient(settings.read_interval) if direct_ok
                                     else Client())
        options: dict[str, Any] = {
            "servers": ordered,
            "dont_randomize": True,
            "name": f"nats-otel-bridge:{source.name}",
            "error_cb": callbacks.error,
            "disconnected_cb": callbacks.disconnected,
            "reconnected_cb": callbacks.reconnected,
            "closed_cb": callbacks.closed,
            "allow_reconnect": True,
            "max_reconnect_attempts": -1,
            "connect_timeout": settings.connect_timeout,
            "tls": _tls_context(source),
            **_auth_options(source),
        }
        if _HAS_RECONNECT_HANDLER:
            options["reconnect_to_server_handler"] = callbacks.choose
            options["reconnect_time_wait"] = 0  # the handler's wait is the only one
        else:
            options["reconnect_time_wait"] = settings.reconnect_wait_initial
        attempt = await unless_stopped(client.connect(**options), stopping)
        if attempt is None:
            callbacks.discarded = True
            await _discard(client)
            return None
        error = attempt.exception()
        if error is None:
            callbacks.connected_now()
            return client
        callbacks.discarded = True
        await _discard(client)
        link.failed(error.error if isinstance(error, _AttemptFailed) else error,
                    next_wait(link.failures + 1, len(urls), settings, rng))
        log_failure(link, "NATS connect failed")
        try:
            await asyncio.wait_for(stopping.wait(), link.retry_in or 0.0)
        except TimeoutError:
            pass
    return None
