"""Direct dispatch: core-mode subscriptions served without nats-py's per-message objects.

nats-py's parser hands every MSG/HMSG to `Client._process_msg(sid, subject, reply, data,
headers)`, which builds a header dict and a `Msg`, queues it on the subscription, and a task
per subscription awaits the queue and then the callback. For the bridge's trace
subscriptions all of that is overhead: `DirectClient` calls a plain function with the
subject, the raw header block and the payload instead, and returns. Every other sid
(JetStream, requests, inboxes) goes to nats-py unchanged.

A direct subscription is made with nats-py's own `subscribe` (no callback), so nats-py
keeps it in its table, resends its SUB under the same sid after a reconnect, and `drain`
works: UNSUB, then a flush; the messages read before the PONG were handed over
synchronously, in order, before the flush returns. nats-py's per-subscription pending
limits do not apply (nothing waits in its queue): the caller's own bound does.

The frames themselves are read by `DirectParser`: the complete frames of direct
subscriptions at the head of the read buffer are served in one pass by `frames.scan`, and
whatever else arrives (PING, INFO, other sids, anything odd) by nats-py's own parser.

`_process_msg` and the parser's state are private. `UNSUPPORTED` says why the installed
nats-py cannot be served this way (None when it can); the caller then subscribes with a
callback as before. `PARSER_UNSUPPORTED` says why its parser cannot be fronted by
`DirectParser` (then nats-py parses every frame and `_process_msg` still dispatches them).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from typing import Any, NamedTuple

from nats.aio import transport as nats_transport
from nats.aio.client import Client
from nats.aio.subscription import Subscription
from nats.protocol import parser as nats_parser

from nats_otel.bridge.sources import frames, stamp
from nats_otel.bridge.sources.headers import parse_headers
from nats_otel.bridge.sources.read_pacing import ReadPacer

__all__ = ["PARSER_UNSUPPORTED", "READ_UNSUPPORTED", "UNSUPPORTED", "DirectClient", "DirectHandler", "DirectParser",
           "Plain", "direct_unsupported", "parser_unsupported", "read_unsupported", "subscribe_plain"]

#: Called with (subject, reply or None, raw header block or None, payload); must not block or raise.
DirectHandler = Callable[[bytes, "bytes | None", "bytes | None", bytes], None]

_EXPECTED = ["self", "sid", "subject", "reply", "data", "headers"]


def direct_unsupported(client_class: type = Client) -> str | None:
    """Why `client_class` cannot be dispatched directly, or None if it can: its parser must
    await `_process_msg` with the parameters this module overrides."""
    method = getattr(client_class, "_process_msg", None)
    if method is None:
        return "nats-py's Client has no _process_msg"
    if not inspect.iscoroutinefunction(method):
        return "nats-py's Client._process_msg is not a coroutine function"
    params = list(inspect.signature(method).parameters)
    if params != _EXPECTED:
        return f"nats-py's Client._process_msg takes {params}, expected {_EXPECTED}"
    for name in ("subscribe", "_remove_sub"):
        if not callable(getattr(client_class, name, None)):
            return f"nats-py's Client has no {name}"
    return None


UNSUPPORTED = direct_unsupported()


def parser_unsupported(parser_class: type = nats_parser.Parser) -> str | None:
    """Why nats-py's parser cannot be fronted by `DirectParser`, or None if it can: it must
    keep its bytes in `buf` (a bytearray), its state in `state`/`needed`/`header_needed`,
    and parse what is in `buf` when `parse` is awaited."""
    if not inspect.iscoroutinefunction(getattr(parser_class, "parse", None)):
        return "nats-py's Parser.parse is not a coroutine function"
    try:
        probe = parser_class(None)
    except Exception as exc:  # noqa: BLE001 - any surprise means: leave nats-py's parser alone
        return f"nats-py's Parser cannot be built: {exc}"
    if not isinstance(getattr(probe, "buf", None), bytearray):
        return "nats-py's Parser keeps no bytearray `buf`"
    if getattr(probe, "state", None) != getattr(nats_parser, "AWAITING_CONTROL_LINE", object()):
        return "nats-py's Parser has no AWAITING_CONTROL_LINE state"
    if not all(isinstance(getattr(probe, name, None), int) for name in ("needed", "header_needed")):
        return "nats-py's Parser keeps no `needed`/`header_needed` counts"
    return None


PARSER_UNSUPPORTED = parser_unsupported()
_CONTROL_LINE = getattr(nats_parser, "AWAITING_CONTROL_LINE", 1)
_CRLF_SIZE = 2


class DirectParser(nats_parser.Parser):
    """nats-py's parser with `frames.scan` in front: the complete frames of direct
    subscriptions at the head of the buffer are served in one pass and deleted at once;
    everything else is parsed by nats-py, which stays the judge of the protocol."""

    def __init__(self, nc: DirectClient) -> None:
        super().__init__(nc)
        self._client = nc
        self._served_reader: Any = None  # the connection's reader whose reads `serve_read` takes first
        self._reports: set[asyncio.Task[None]] = set()  # handler failures reported from `serve_read`
        self.reads_served = 0  # reads served in the socket's callback (the rest: nats-py's read task)
        self.pacer: ReadPacer | None = None  # the current connection's (`read_pacing`)

    async def parse(self, data: bytes = b"") -> None:
        client = self._client
        stamp.refresh()  # the messages of one read share its receive time (stamp.py)
        if self._served_reader is not (reader := _stream_reader(client)) and READ_UNSUPPORTED is None:
            self._serve_reads_of(reader)  # the first read of each connection (a reconnect makes a new one)
        if self.state != _CONTROL_LINE:
            # nats-py is inside a frame (it read the line, waits for the payload): give it
            # exactly what the frame still needs, then scan what follows.
            # (A header size over the frame's size makes nats-py read past the frame: then
            # it reads all of it, as it would alone.)
            missing = self.needed + _CRLF_SIZE - len(self.buf)
            if missing > len(data) or self.header_needed > self.needed:
                return await super().parse(data)
            await super().parse(data[:missing])
            data = data[missing:]
            if self.state != _CONTROL_LINE:
                return await super().parse(data)
        buf = self.buf
        buf.extend(data)
        while buf:
            stop = self._serve(buf)
            if stop == frames.MORE:
                return
            if stop != frames.OTHER:  # a handler failed: report it as nats-py does, read on
                await client._error_cb(stop)
                continue
            # A frame the scan does not serve: nats-py parses the rest of this read.
            return await super().parse()

    def _serve(self, buf: bytearray) -> Any:
        """`frames.scan` the head of `buf`, delete what it served, count it; why it stopped."""
        used, served, size, stop = frames.scan(buf, self._client._direct)
        if used:
            del buf[:used]  # one move per read, not one per message
        if served:
            stats = self._client.stats
            stats["in_msgs"] += served
            stats["in_bytes"] += size
        return stop

    # -- reads served in the socket's callback ------------------------------------------------

    def _serve_reads_of(self, reader: Any) -> None:
        """Serve each read of `reader` as it comes (`serve_read`), not in nats-py's read task.

        nats-py reads in a task: each socket read wakes the task's future, and the task runs
        in the loop's next turn to copy the bytes out and parse them. A bridge in a group of
        eight reads its share, its peers' forwards and their heartbeats in many small reads,
        and that second step was the larger part of each (`docs/scale-out.md`, fourth round).
        The StreamReader's `feed_data` (what the transport calls with each read) is wrapped,
        for this connection only; a small read pauses the connection until the next tick
        of `DirectClient.read_interval` (`read_pacing`)."""
        self._served_reader = reader
        if not _reader_servable(reader):
            return
        feed = reader.feed_data
        client = self._client
        pacer = self.pacer = ReadPacer(client.read_interval, reader)

        def feed_data(data: bytes) -> None:
            pacer.after_read(len(data))  # a small read: the next waits for the next tick
            # Only when nothing of an earlier read waits for nats-py (its task parked in
            # `read`, its parser between frames, its reader's buffer empty): then this read
            # is the next in order. Else nats-py's path.
            if (reader._waiter is None or reader._buffer or self.state != _CONTROL_LINE
                    or _stream_reader(client) is not reader or client.is_closed or client.is_reconnecting):
                return feed(data)
            rest = self.serve_read(data)
            if rest:
                feed(rest)

        reader.feed_data = feed_data

    def serve_read(self, data: bytes) -> bytes:
        """Serve the complete direct frames at the head of the buffer and one read, in the
        socket's callback. An incomplete frame stays in the buffer for the next read; from a
        frame of nats-py's on, all is returned, for nats-py's read task to parse."""
        stamp.refresh()
        buf = self.buf
        buf.extend(data)
        self.reads_served += 1
        while buf:
            stop = self._serve(buf)
            if stop == frames.MORE:
                return b""
            if stop == frames.OTHER:
                rest = bytes(buf)
                buf.clear()
                return rest
            report = asyncio.ensure_future(self._client._error_cb(stop))  # a handler failed, as `parse` does
            self._reports.add(report)
            report.add_done_callback(self._reports.discard)
        return b""


def _stream_reader(client: Client) -> Any:
    """The asyncio StreamReader of `client`'s connection (TCP or TLS), or None (a websocket)."""
    reader = getattr(getattr(client, "_transport", None), "_io_reader", None)
    return reader if isinstance(reader, asyncio.StreamReader) else None


def read_unsupported(transport_class: type = nats_transport.TcpTransport) -> str | None:
    """Why reads cannot be served in the socket's callback (`DirectParser.serve_read`), or None:
    nats-py's TCP transport must keep its asyncio StreamReader in `_io_reader` (the reader
    itself is checked as it is met: `_reader_servable`)."""
    try:
        probe = transport_class()
    except Exception as exc:  # noqa: BLE001 - any surprise means: leave nats-py's reads alone
        return f"nats-py's TcpTransport cannot be built: {exc}"
    if "_io_reader" not in vars(probe):
        return "nats-py's TcpTransport keeps no `_io_reader`"
    return None


def _reader_servable(reader: Any) -> bool:
    """asyncio's StreamReader keeps `_waiter` (set exactly while a task waits in `read`) and
    its unread bytes in `_buffer`: what `serve_read`'s guard reads."""
    return hasattr(reader, "_waiter") and isinstance(getattr(reader, "_buffer", None), bytearray)


READ_UNSUPPORTED = PARSER_UNSUPPORTED or read_unsupported()


async def flush_in_order(nc: Client, timeout: int = 10) -> None:
    """`nc.flush()` whose PONG comes after everything published before it.

    nats-py (2.16) writes a flush's PING straight to the socket (`Client._send_ping`), ahead
    of what it still holds in its own buffer for its flusher task: the PONG can then come
    before the server has read those publishes, and a close right after loses them when the
    server, writing to the closed socket, drops the connection with the input it has not
    read ("Write Error"; 1 round in 200 of 60 publishes, a flush and a close, against a real
    server here: issue 48's session 33). So the buffer goes to the socket first, as
    nats-py's own flush does when its flusher task is gone, and the PING after it: nothing
    awaits in between, so nothing else writes in between. Where nats-py does not hold its
    buffer so, its flush as it is."""
    pending = getattr(nc, "_pending", None)
    transport = getattr(nc, "_transport", None)
    if isinstance(pending, list) and pending and transport is not None and nc.is_connected:
        transport.writelines(pending[:])
        nc._pending = []
        nc._pending_data_size = 0
    await Client.flush(nc, timeout)


class DirectClient(Client):
    """A nats-py `Client` whose direct subscriptions skip `Msg`, queue and task; with a
    `read_interval`, its connection is read at most that often while reads are small
    (`read_pacing`; reads served in the socket's callback only, `READ_UNSUPPORTED`)."""

    def __init__(self, read_interval: float = 0.0) -> None:
        super().__init__()
        self._direct: dict[int, DirectHandler] = {}
        self.read_interval = read_interval  # `read_pacing`: 0 reads as data comes
        if PARSER_UNSUPPORTED is None:
            self._ps = DirectParser(self)

    async def subscribe_direct(self, subject: str, handler: DirectHandler, queue: str = "") -> Subscription:
        """Subscribe `subject` (in `queue`, if any); each message calls `handler` at once."""
        # `subscribe` takes the next sid before its first await: registering it first means
        # no message of this subscription can reach nats-py's path.
        sid = self._sid + 1
        self._direct[sid] = handler
        try:
            sub = await self.subscribe(subject, queue=queue)
        except BaseException:
            self._direct.pop(sid, None)
            raise
        if sub._id != sid:  # nats-py changed how it numbers: move the registration
            self._direct[sub._id] = self._direct.pop(sid)
        return sub

    async def flush(self, timeout: int = 10) -> None:
        """nats-py's flush, its PING behind what was published before it (`flush_in_order`)."""
        await flush_in_order(self, timeout)

    def _remove_sub(self, sid: int, max_msgs: int = 0) -> None:
        self._direct.pop(sid, None)
        super()._remove_sub(sid, max_msgs)

    async def _process_msg(self, sid: int, subject: bytes, reply: bytes, data: bytes,
                           headers: bytes | None) -> None:
        handler = self._direct.get(sid)
        if handler is None:
            return await super()._process_msg(sid, subject, reply, data, headers)  # type: ignore[arg-type]
        stamp.refresh()  # nats-py's parser dispatches one message at a time here
        stats = self.stats
        stats["in_msgs"] += 1
        stats["in_bytes"] += len(data)
        try:
            handler(subject, reply or None, headers, data)
        except Exception as exc:  # noqa: BLE001 - as nats-py does for a failing callback: report, keep reading
            await self._error_cb(exc)


class Plain(NamedTuple):
    """A message of the bridges' own talk (the exchange's heartbeats and evidence, the answers
    to forwards) as `subscribe_plain` hands it over: what those read of nats-py's `Msg`."""

    subject: str
    headers: dict[str, str] | None  # one value a name, the first, as nats-py keeps one
    data: bytes


async def subscribe_plain(nc: Client, subject: str, on_message: Callable[[Any], object],
                          pending_msgs_limit: int) -> Subscription:
    """Subscribe `subject`; each message calls `on_message` (never awaited: it must not
    block). On a `DirectClient` it is served directly, as a `Plain`; else by nats-py's
    callback path, as its `Msg` (with the same three attributes), `pending_msgs_limit`
    bounding its queue. Messages that carry no trace: their header blocks are short."""
    if isinstance(nc, DirectClient):
        def on_frame(subject_bytes: bytes, _reply: bytes | None, block: bytes | None, data: bytes) -> None:
            headers = {name: values[0] for name, values in parse_headers(block)[0].items()} if block else None
            on_message(Plain(subject_bytes.decode(errors="replace"), headers, data))

        return await nc.subscribe_direct(subject, on_frame)

    async def on_msg(msg: Any) -> None:
        on_message(msg)

    return await nc.subscribe(subject, cb=on_msg, pending_msgs_limit=pending_msgs_limit)
