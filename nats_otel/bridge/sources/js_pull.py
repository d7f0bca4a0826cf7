"""Pull requests to a JetStream durable consumer, their replies read into one buffer.

nats-py's `PullSubscription.fetch` waits for each message with its own task and timer,
which cost more than converting it; here one subscription on an inbox takes every reply
and `fetch` wakes once per batch. Messages a lingering request delivers after `fetch`
returned stay in the buffer for the next one (they count against max_ack_pending
meanwhile).

On a `direct.DirectClient` the inbox is a direct subscription: each reply is handed over
inside nats-py's parser as its subject, ack subject, raw header block and payload, and
becomes the core's raw message at once (headers parsed as core mode parses them,
`headers.parse_headers`) beside a bare nats-py `Msg` that only settles it (ack, nak, term,
and the delivery's metadata, all read from the ack subject). nats-py's own path (a header
dict, a `Msg`, a queue and a task per message: a large part of a JetStream
bridge's event loop at a moderate rate, docs/scale-out.md) is the fallback where the
installed nats-py cannot be served directly, and gives the same deliveries.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import deque
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg

from nats_otel.bridge.sources import direct
from nats_otel.bridge.sources.connection import raw_from_msg
from nats_otel.bridge.sources.headers import HeaderReader, SubjectTexts
from nats_otel.bridge.sources.stamp import CURRENT as _STAMP
from nats_otel.core.decode import NO_RAW_HEADERS, RawTraceMessage

__all__ = ["Pulled", "Puller"]

#: A delivery as `fetch` returns it: nats-py's message (to settle it) and the core's input.
Pulled = tuple[Msg, RawTraceMessage]

log = logging.getLogger("nats_otel.jetstream")


class Puller:
    """Pull requests to the durable consumer `stream`/`durable`, answered on one inbox.
    `malformed`: counts a delivery whose header block did not all parse (the rest is kept;
    `headers.HeaderReader`)."""

    def __init__(self, nc: Client, stream: str, durable: str, malformed: Any) -> None:
        self.nc = nc
        self.subject = f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{durable}"
        self.inbox = nc.new_inbox()
        self.buffer: deque[Pulled] = deque()
        # Why the durable answered that it is not there (None while it is): an operator
        # deleted it, or nothing serves its pull subject. Pulling again never recovers it.
        self.consumer_gone: str | None = None
        self._headers = HeaderReader(malformed, log, {"stream": stream})
        self._subjects = SubjectTexts()  # each subject's text made once
        self._wake = asyncio.Event()
        self._want = 1
        self._sub: Any = None
        # How long after a request's expiry its end (408) is still awaited: the way back, and
        # the connection's read interval (`read_pacing`: a small read waits for the next tick).
        # Awaited less, a round stops waiting before its own end is read, and that end is read
        # during the next round, where it may end that round early.
        self._expiry_margin = 0.05 + getattr(nc, "read_interval", 0.0)

    @property
    def direct(self) -> bool:
        """Whether the replies are served directly (else by nats-py's callback path)."""
        return isinstance(self.nc, direct.DirectClient)

    async def start(self, pending_limit: int) -> None:
        if isinstance(self.nc, direct.DirectClient):
            self._sub = await self.nc.subscribe_direct(self.inbox, self._on_frame)
        else:
            self._sub = await self.nc.subscribe(self.inbox, cb=self._on_msg, pending_msgs_limit=pending_limit)

    def _on_frame(self, subject: bytes, reply: bytes | None, header_block: bytes | None, payload: bytes) -> None:
        """A reply, served directly (inside nats-py's parser: never awaits, never raises)."""
        headers = self._headers(header_block) if header_block else NO_RAW_HEADERS
        status = headers.get("Status")
        if status is None and reply:
            text = self._subjects.get(subject) or self._subjects.add(subject)
            msg = Msg(self.nc, text, reply.decode(errors="replace"), payload)
            self._delivered((msg, RawTraceMessage(text, headers, payload, _STAMP[0])))
        else:
            self._ended(status[0] if status else None, (headers.get("Description") or [""])[0])

    async def _on_msg(self, msg: Msg) -> None:
        """A reply, by nats-py's callback path (the fallback)."""
        status = msg.headers.get("Status") if msg.headers else None
        if status is None and msg.reply:
            self._delivered((msg, raw_from_msg(msg)))
        else:
            self._ended(status, (msg.headers or {}).get("Description", ""))

    def _delivered(self, pulled: Pulled) -> None:
        self.buffer.append(pulled)
        if len(self.buffer) >= self._want:
            self._wake.set()

    def _ended(self, status: str | None, description: str) -> None:
        """A status reply: 100 is a heartbeat; 404 no messages, 408 expired, 409 limits: this
        request is over; 503 or a deleted consumer: the durable is gone."""
        if status == "100":
            return
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

    async def fetch(self, batch: int, timeout: float, linger: float = 0.0) -> list[Pulled]:
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
                expires_s = max(timeout - self._expiry_margin, 0.01)
                await self._round({"batch": batch, "expires": int(expires_s * 1e9)}, 1, expires_s + self._expiry_margin)
                open_request = True  # it goes on delivering up to `batch` until it expires
        if linger > 0 and 0 < len(self.buffer) < batch:
            if open_request:
                await self._wait(batch, linger)
            else:
                expires_s = max(linger, 0.01)
                rest = {"batch": batch - len(self.buffer), "expires": int(expires_s * 1e9)}
                await self._round(rest, batch, expires_s + self._expiry_margin)
        out: list[Pulled] = []
        while self.buffer and len(out) < batch:
            out.append(self.buffer.popleft())
        return out
