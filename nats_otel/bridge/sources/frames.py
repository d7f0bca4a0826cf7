"""The complete MSG/HMSG frames at the head of a NATS read buffer, served in one pass.

nats-py's parser (`nats/protocol/parser.py`) matches each frame with a regular expression,
copies its payload twice, and deletes it from the front of its buffer: a move of the whole
rest of the buffer per message. For the bridge's direct subscriptions (`direct.py`) that
was ~1.7 µs of the receive path per trace message. `scan` reads every complete frame of a
direct subscription at the head of the buffer, hands each to its handler, and the caller
deletes them all at once.

It serves only what nats-py would read the same way: `MSG <subject> <sid> [reply] <size>`
and `HMSG <subject> <sid> [reply] <header size> <size>` lines whose fields are separated by
spaces (one or more: nats-server writes the trace messages it publishes itself as
`MSG <subject> <sid>  <size>`, two spaces, an empty reply, 2.11 to 2.15 alike), with decimal
sizes, for a sid that has a handler. Anything else (another
sid, PING, PONG, INFO, +OK, -ERR, a line it does not recognise) stops the scan, and
nats-py's parser, which stays the judge of the protocol, takes it from there
(`direct.DirectParser`).

`scan` here is the reference; `_frames.pyx` is its compiled twin, chosen at import unless
NATS_OTEL_NO_EXTENSIONS is set (`core.accel`), tested against it in
tests/bridge/test_frames.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nats_otel.core import accel

__all__ = ["IMPLEMENTATION", "MORE", "OTHER", "delivery_sink", "python_scan", "scan"]

#: The scan stopped at an incomplete frame, or at the end: wait for more bytes.
MORE = 0
#: The scan stopped at a frame it does not serve: nats-py's parser takes it.
OTHER = 1

_MAX_DIGITS = 18  # sizes and sids beyond this are left to nats-py (none is real)


def _number(token: bytes) -> int:
    """A decimal field as nats-py's `\\d+` reads it, or -1."""
    return int(token) if token.isdigit() and len(token) <= _MAX_DIGITS else -1


def python_scan(buf: bytearray, handlers: dict[int, Callable[[bytes, bytes | None, bytes | None, bytes], None]]
                ) -> tuple[int, int, int, Any]:
    """Serve the complete frames at the head of `buf` whose sid has a handler.

    Each is handed to `handlers[sid](subject, reply or None, header block or None, payload)`
    (the reply: a JetStream delivery's, its ack subject). Returns
    (bytes consumed, messages served, payload bytes served, why it stopped): `MORE`,
    `OTHER`, or the exception a handler raised (the frame it was given is consumed and
    counted, as nats-py counts a message whose callback fails).
    """
    pos, end, served, size = 0, len(buf), 0, 0
    while pos < end:
        eol = buf.find(b"\r\n", pos)
        if eol < 0:
            return pos, served, size, MORE
        if buf.startswith(b"MSG ", pos):
            line, fields = bytes(buf[pos + 4:eol]), (3, 4)
        elif buf.startswith(b"HMSG ", pos):
            line, fields = bytes(buf[pos + 5:eol]), (4, 5)
        else:
            return pos, served, size, OTHER
        tokens = [token for token in line.split(b" ") if token]
        # Fields separated by runs of spaces, no other whitespace, none after the last field:
        # what nats-py's pattern reads alike (its `\s+`). nats-server writes two spaces
        # for the trace messages it publishes itself (an empty reply).
        if (len(tokens) not in fields or line.endswith(b" ")
                or b"".join(tokens) != b"".join(line.split())):
            return pos, served, size, OTHER
        sid, total = _number(tokens[1]), _number(tokens[-1])
        header_size = _number(tokens[-2]) if fields[0] == 4 else 0
        handler = handlers.get(sid)
        if handler is None or total < 0 or not 0 <= header_size <= total:
            return pos, served, size, OTHER
        start = eol + 2
        stop = start + total
        if stop + 2 > end:
            return pos, served, size, MORE
        payload = bytes(buf[start + header_size:stop])
        pos = stop + 2  # nats-py skips the two bytes after the payload without looking
        served += 1
        size += len(payload)
        try:
            handler(tokens[0], tokens[2] if len(tokens) == fields[1] else None,
                    bytes(buf[start:start + header_size]) if header_size else None, payload)
        except Exception as exc:  # noqa: BLE001 - returned: the caller reports it as nats-py does
            return pos, served, size, exc
    return pos, served, size, MORE


scan = python_scan
_compiled: Any = accel.compiled("nats_otel.bridge.sources._frames")
if _compiled is not None:
    assert (_compiled.MORE, _compiled.OTHER) == (MORE, OTHER)
    scan = _compiled.scan

#: "compiled" or "python": which scanner this process runs (logged when a source subscribes).
IMPLEMENTATION = "python" if _compiled is None else "compiled"


def delivery_sink() -> Any:
    """The compiled scanner's `DeliverySink` class (a core source's handler, served without a
    Python call), or None where the scanner is the Python one."""
    return None if _compiled is None else _compiled.DeliverySink
