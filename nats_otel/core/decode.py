"""Bytes and headers of a received trace message -> `TraceMessage`.

Pure: no I/O, no clock, no logging. Failures are `DecodeError`s whose `reason` is a short,
stable label (used as a metric label by callers) and whose message says what was wrong.
"""

from __future__ import annotations

import base64
import binascii
import zlib
from dataclasses import dataclass
from typing import Any, Union

import cramjam
import msgspec
import orjson

from nats_otel.core import accel
from nats_otel.core.model import (
    EVENT_MODELS,
    Egress,
    Ingress,
    JetStreamEvent,
    ServerReport,
    ServiceImport,
    StreamExport,
    SubjectMapping,
    TraceHeaders,
    TraceMessage,
    UInt64,
    check_uint64,
)

__all__ = [
    "NO_RAW_HEADERS",
    "DecodeError",
    "DecodeLimits",
    "RawTraceMessage",
    "decode",
    "decompress",
    "parse_archive_line",
]


class DecodeError(ValueError):
    """A trace message that cannot be decoded. `reason` is a stable label for metrics."""

    reason = "decode_error"

    def __init__(self, detail: str, *, reason: str | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        if reason is not None:
            self.reason = reason


class RecordError(DecodeError):
    """An archive line that is not an archive record nor a bare trace message."""

    reason = "bad_record"


class CompressionError(DecodeError):
    """Payload compressed with an unknown encoding, or corrupt."""

    reason = "bad_compression"


class TooLargeError(DecodeError):
    """Payload (compressed or not) over the configured limit."""

    reason = "too_large"


class JSONError(DecodeError):
    """Payload is not JSON (or not UTF-8)."""

    reason = "bad_json"


class SchemaError(DecodeError):
    """JSON that is not a `MsgTraceEvent`: missing server, events or ingress; wrong types."""

    reason = "bad_schema"


@dataclass(frozen=True, slots=True)
class DecodeLimits:
    """Bounds that keep a hostile or broken payload from costing unbounded memory or time."""

    max_payload_bytes: int = 8 * 1024 * 1024
    max_decompressed_bytes: int = 16 * 1024 * 1024
    max_events: int = 10_000


class RawTraceMessage(msgspec.Struct, frozen=True, gc=False):
    """A trace message as received: the subject it arrived on, its headers, its raw payload.

    `subject` is None only for bare `MsgTraceEvent` archive lines, which lack it. A msgspec
    `Struct` (built in C: one per message received), positional or keyword, picklable. (The
    bridge in core mode replaces `payload` once it observed the message, which nothing reads
    again: `bridge/observed_batches.RELEASED`.)
    """

    subject: str | None
    headers: dict[str, list[str]] = {}
    payload: bytes = b""
    received_at: str | None = None

    def header(self, name: str) -> str | None:
        """First value of a header of the trace message itself, case-insensitively."""
        lowered = name.lower()
        for key, values in self.headers.items():
            if key.lower() == lowered and values:
                return values[0]
        return None


#: The headers of a trace message that has none (nearly every one: servers add
#: `Content-Encoding` only when they compress), shared: the live bridge's receive hands this
#: one dict to them all, where a new `{}` each was 64 bytes held a message through the link
#: window (docs/performance.md, session 52). Never written: nothing writes a raw message's
#: headers (a `RawTraceMessage` is frozen; what reads its headers only reads them).
NO_RAW_HEADERS: dict[str, list[str]] = {}


def parse_archive_line(line: bytes | str) -> RawTraceMessage:
    """One JSON Lines archive record (DESIGN §5), or a bare `MsgTraceEvent` line."""
    try:
        record = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise RecordError(f"archive line is not JSON: {exc}") from None
    if not isinstance(record, dict):
        raise RecordError(f"archive line is a JSON {type(record).__name__}, not an object")
    if "payload_b64" not in record:
        if "events" in record and "server" in record:
            # A bare trace message: re-serialise it, it goes through the same decode.
            return RawTraceMessage(subject=None, payload=orjson.dumps(record))
        raise RecordError("archive record has neither 'payload_b64' nor 'server'/'events'")
    payload_b64 = record["payload_b64"]
    subject = record.get("subject")
    headers = record.get("headers") or {}
    if not isinstance(payload_b64, str):
        raise RecordError("'payload_b64' is not a string")
    if subject is not None and not isinstance(subject, str):
        raise RecordError("'subject' is not a string")
    if not isinstance(headers, dict) or not all(
        isinstance(k, str) and isinstance(v, list) and all(isinstance(x, str) for x in v)
        for k, v in headers.items()
    ):
        raise RecordError("'headers' is not an object of name -> list of strings")
    try:
        payload = base64.b64decode(payload_b64, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise RecordError(f"'payload_b64' is not base64: {exc}") from None
    received_at = record.get("received_at") or record.get("captured_at")
    return RawTraceMessage(
        subject=subject,
        headers=headers,
        payload=payload,
        received_at=received_at if isinstance(received_at, str) else None,
    )


def decompress(payload: bytes, content_encoding: str | None, limits: DecodeLimits) -> bytes:
    """Undo the trace message's `Content-Encoding`: absent/identity, gzip, or framed snappy."""
    if len(payload) > limits.max_payload_bytes:
        raise TooLargeError(f"payload of {len(payload)} bytes over {limits.max_payload_bytes}")
    encoding = (content_encoding or "identity").strip().lower()
    if encoding in ("", "identity"):
        return payload
    if encoding == "gzip":
        return _gunzip(payload, limits.max_decompressed_bytes)
    if encoding == "snappy":
        try:
            data = bytes(cramjam.snappy.decompress(payload))
        except cramjam.DecompressionError as exc:
            raise CompressionError(f"corrupt snappy (framed) payload: {exc}") from None
        if len(data) > limits.max_decompressed_bytes:
            raise TooLargeError(f"decompressed payload over {limits.max_decompressed_bytes}")
        return data
    raise CompressionError(f"unsupported Content-Encoding {content_encoding!r:.40}")


def _gunzip(payload: bytes, limit: int) -> bytes:
    # A bounded decompressor: a small gzip bomb must not allocate gigabytes.
    inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    try:
        data = inflater.decompress(payload, limit + 1)
    except zlib.error as exc:
        raise CompressionError(f"corrupt gzip payload: {exc}") from None
    if len(data) > limit:
        raise TooLargeError(f"decompressed payload over {limit} bytes")
    if not inflater.eof:
        raise CompressionError("truncated gzip payload")
    return data


def decode(raw: RawTraceMessage, limits: DecodeLimits = DecodeLimits()) -> TraceMessage:
    """Decode a received trace message into a `TraceMessage`, or raise `DecodeError`."""
    data = decompress(raw.payload, raw.header("Content-Encoding"), limits)
    fast = _decode_fast(data, limits)
    if fast is not None:
        return fast
    try:
        document = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise JSONError(f"payload is not JSON: {exc}") from None
    return from_document(document, limits)


def from_document(document: Any, limits: DecodeLimits = DecodeLimits()) -> TraceMessage:
    """Validate an already parsed JSON document as a `MsgTraceEvent`."""
    if not isinstance(document, dict):
        raise SchemaError(f"trace message is a JSON {type(document).__name__}, not an object")
    server_doc = document.get("server")
    events_doc = document.get("events")
    if not isinstance(server_doc, dict):
        raise SchemaError("trace message has no 'server' object")
    if not isinstance(events_doc, list) or not events_doc:
        raise SchemaError("trace message has no 'events' list")
    if len(events_doc) > limits.max_events:
        raise TooLargeError(f"{len(events_doc)} events, over the limit of {limits.max_events}")
    request = document.get("request") or {}
    if not isinstance(request, dict):
        raise SchemaError("'request' is not an object")
    headers = TraceHeaders.of(_headers(request.get("header")))
    msg_size = request.get("msgsize", 0)
    hops = document.get("hops", 0)
    if not _is_int(msg_size) or not _is_int(hops) or hops < 0 or msg_size < 0:
        raise SchemaError("'request.msgsize' and 'hops' must be non-negative integers")
    first = events_doc[0]
    if not isinstance(first, dict) or first.get("type") != "in":
        raise SchemaError("the first event is not an ingress ('in') event")
    try:
        server = msgspec.convert(server_doc, ServerReport)
    except msgspec.ValidationError as exc:
        raise SchemaError(f"server: {exc}") from None
    try:
        ingress = msgspec.convert(first, Ingress)
    except msgspec.ValidationError as exc:
        raise SchemaError(f"events[0]: {exc}") from None
    events = []
    unknown = []
    for position, event_doc in enumerate(events_doc[1:], start=1):
        kind = event_doc.get("type") if isinstance(event_doc, dict) else None
        # Only a string can name a type: a list or object here must not reach the dict lookup.
        model = EVENT_MODELS.get(kind) if isinstance(kind, str) else None
        if model is None:
            # Unknown types (newer servers) and malformed entries are kept aside, raw, with
            # their position; mapping reports them as issues and maps the rest.
            unknown.append({"position": position, "event": event_doc, "problem": "unknown type"})
            continue
        try:
            events.append(msgspec.convert(event_doc, model))
        except msgspec.ValidationError as exc:
            unknown.append({"position": position, "event": event_doc, "problem": str(exc)})
    return TraceMessage(
        server=server.info(),
        headers=headers,
        msg_size=msg_size,
        hops=hops,
        ingress=ingress,
        events=tuple(events),
        unknown_events=tuple(unknown),
        seq=server.seq,
    )


# --- fast path ------------------------------------------------------------------------
# One msgspec call parses and validates the whole document from bytes. It accepts exactly
# what `from_document` accepts when all is well; anything unusual (an event of a type this
# version does not know, a malformed event, an ingress out of place, headers given as
# strings) fails it, and the slow path, which isolates bad events and words the errors,
# decides.


# Their `__post_init__` hooks (the reference; `_primitives.pyx` holds the compiled twins,
# chosen before the classes are made, as in `model`).
def _request_post_init(self: Any) -> None:
    check_uint64("msgsize", self.msgsize)


def _document_post_init(self: Any) -> None:
    check_uint64("hops", self.hops)


_primitives: Any = accel.compiled("_primitives")
if _primitives is not None:
    _request_post_init, _document_post_init = _primitives.request_post_init, _primitives.document_post_init


# Short-lived (one per decoded message) and without cycles: not tracked by the GC.
class _Request(msgspec.Struct, frozen=True, gc=False):
    header: dict[str, list[str]] = {}
    msgsize: UInt64 = 0

    __post_init__ = _request_post_init  # type: ignore[misc]  # a module function (compiled when built) as the hook


class _Document(msgspec.Struct, frozen=True, gc=False):
    server: ServerReport
    events: list[Union[Ingress, SubjectMapping, StreamExport, ServiceImport, JetStreamEvent, Egress]]  # noqa: UP007
    request: _Request = _Request()
    hops: UInt64 = 0

    __post_init__ = _document_post_init  # type: ignore[misc]  # a module function (compiled when built) as the hook


_DOCUMENT = msgspec.json.Decoder(_Document)


def _decode_fast(data: bytes, limits: DecodeLimits) -> TraceMessage | None:
    try:
        doc = _DOCUMENT.decode(data)
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
        # (ValidationError is a DecodeError; bad UTF-8 and deep nesting raise their own.)
        return None
    events = doc.events
    if not events or len(events) > limits.max_events or type(events[0]) is not Ingress:
        return None
    for event in events[1:]:
        if type(event) is Ingress:
            return None
    headers = TraceHeaders.of(doc.request.header)
    server = doc.server
    return TraceMessage(server.info(), headers, doc.request.msgsize, doc.hops, events[0],
                        tuple(events[1:]), (), server.seq)  # type: ignore[arg-type]  # no Ingress left (checked above)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value < 2**64


def _headers(value: Any) -> dict[str, list[str]]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise SchemaError("'request.header' is not an object")
    headers: dict[str, list[str]] = {}
    for name, values in value.items():
        if isinstance(values, str):
            values = [values]
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise SchemaError(f"header {name!r:.60} is not a list of strings")
        headers[name] = values
    return headers
