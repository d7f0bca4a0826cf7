"""The state of one source's NATS connection, as logs, `/readyz` and the give-up timer see it.

What a failure is called lives here (`classify`): the same words in the log, in `/readyz`
and in the docs. URLs are shown without their user information, never with credentials.
"""

from __future__ import annotations

import asyncio
import errno
import random
import socket
import ssl
import time
from urllib.parse import urlsplit, urlunsplit

import nats.errors

from nats_otel.bridge.settings import NatsSettings

__all__ = ["Link", "backoff", "classify", "doubling_wait", "next_wait", "redact_url"]


def redact_url(url: str) -> str:
    """`nats://user:secret@host:4222` -> `nats://host:4222` (a token URL loses its token too)."""
    parts = urlsplit(url if "://" in url else f"nats://{url}")
    host = parts.hostname or ""
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


# Text the server sends in `-ERR` (nats-server's auth errors) -> what it is called here.
_AUTH_ERRORS = (
    ("authorization violation",
     "authorization violation: the server refused the credentials (user/password, token, nkey or creds)"),
    ("authentication expired", "authorization: the credentials have expired"),
    ("authentication revoked", "authorization: the credentials were revoked"),
    ("account authentication expired", "authorization: the account's credentials have expired"),
)


def classify(exc: BaseException) -> tuple[str, str]:
    """(kind, reason) of a connection failure. Kinds: refused, unreachable, timeout, tls,
    authorization, closed, error."""
    text = str(exc)
    lowered = text.lower()
    for needle, reason in _AUTH_ERRORS:
        if needle in lowered:
            return "authorization", reason
    # asyncio reports several addresses tried (localhost: ::1 and 127.0.0.1) as one OSError.
    if isinstance(exc, ConnectionRefusedError) or f"[errno {errno.ECONNREFUSED}]" in lowered:
        return "refused", "connection refused (nothing listens there?)"
    if isinstance(exc, socket.gaierror):
        return "unreachable", f"host name not resolved: {exc.strerror or text}"
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError, nats.errors.TimeoutError)):
        return "timeout", "no answer in time"
    if isinstance(exc, ssl.SSLError):
        return "tls", f"TLS: {getattr(exc, 'reason', None) or text}"
    if isinstance(exc, nats.errors.UnexpectedEOF):
        return "closed", "the server closed the connection"
    if isinstance(exc, nats.errors.StaleConnectionError):
        return "closed", "the server stopped answering pings"
    if isinstance(exc, OSError):
        return "unreachable", exc.strerror or text or type(exc).__name__
    return "error", f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def backoff(failures: int, settings: NatsSettings, rng: random.Random) -> float:
    """Seconds to wait after `failures` failed attempts in a row: 0 before the first retry of
    a connection just lost, then `reconnect_wait_initial` doubling to `reconnect_wait_max`,
    each drawn from [half, all] of that: bridges cut off together do not come back together."""
    return doubling_wait(failures, settings.reconnect_wait_initial, settings.reconnect_wait_max, rng)


def doubling_wait(failures: int, initial: float, cap: float, rng: random.Random) -> float:
    """0 before any failure, then `initial` doubling with each failure in a row up to `cap`,
    drawn from [half, all] of that."""
    if failures <= 0:
        return 0.0
    ceiling = min(initial * 2 ** min(failures - 1, 30), cap)
    return rng.uniform(ceiling / 2, ceiling)


def next_wait(failures: int, pool: int, settings: NatsSettings, rng: random.Random) -> float:
    """The wait after `failures` failed attempts in a row over a pool of `pool` servers: the
    next server of a round is tried at once; the wait (`backoff`) comes after each round."""
    pool = max(pool, 1)
    return backoff(failures // pool, settings, rng) if failures % pool == 0 else 0.0


class Link:
    """One source's connection state. Updated on the event loop by the connection's callbacks."""

    def __init__(self, name: str, urls: list[str]) -> None:
        self.name = name
        self.urls = [redact_url(u) for u in urls]
        self.connected = False
        self.url: str | None = None        # the server connected to, or last tried
        self.kind: str | None = None       # of the last failure (None after a connect)
        self.reason: str | None = None
        self.error: str | None = None      # the failure as raised, for the log
        self.failures = 0                  # attempts failed in a row
        self.downs = 0                     # connections lost: what was in flight then may be lost
        self.retry_in: float | None = None
        self.down_since = time.monotonic()
        self.ever_connected = False
        # Connected, yet the source is not ready: what it waits for (JetStream to answer).
        self.waiting: str | None = None

    def attempting(self, url: str) -> None:
        self.url = redact_url(url)

    def failed(self, exc: BaseException, retry_in: float | None) -> None:
        self.kind, self.reason = classify(exc)
        self.error = f"{type(exc).__name__}: {exc}"
        self.failures += 1
        self.retry_in = retry_in

    def up(self, url: str | None) -> None:
        if url is not None:
            self.url = redact_url(url)
        self.connected, self.ever_connected = True, True
        self.kind = self.reason = self.error = self.retry_in = None
        self.failures = 0

    def down(self) -> None:
        if self.connected:
            self.connected = False
            self.downs += 1
            self.down_since = time.monotonic()

    def down_for(self) -> float:
        """Seconds since the connection was lost (or since start-up, if never made)."""
        return 0.0 if self.connected else time.monotonic() - self.down_since

    def describe(self) -> str:
        """Why the source is not connected (or not ready), for `/readyz` (no credentials)."""
        where = self.url or ", ".join(self.urls)
        if self.connected and self.waiting:
            return f"NATS source {self.name!r}: connected to {where}, {self.waiting}"
        state = "reconnecting to" if self.ever_connected else "connecting to"
        if self.reason is None:
            return f"NATS source {self.name!r}: {state} {where}"
        retry = f", next attempt in {self.retry_in:.1f}s" if self.retry_in is not None else ""
        return (f"NATS source {self.name!r}: not connected: {where}: {self.reason} "
                f"({self.failures} failed attempts in a row{retry})")
