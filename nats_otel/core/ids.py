"""Trace context of a trace message, and the deterministic span id scheme (v2).

Every span id is a hash of the trace context and of the report's `identity` (server id,
ingress time, ingress connection), so a replay, a redelivery and the Spark backfill all
produce the same ids without shared state, and two different messages never share one:
not when a producer span publishes many messages under one traceparent, not when an
ad-hoc destination is reused, not across server restarts (a restarted server has a new
id). Which upstream egress a downstream server span hangs under is decided from evidence
in `linking`, not computed from the hop id (which many messages share).
"""

from __future__ import annotations

import binascii
import hashlib
import re

from msgspec import Struct

from nats_otel.core.decode import DecodeError
from nats_otel.core.model import FORWARDING_KINDS, TraceMessage, first_values

__all__ = [
    "ID_SCHEME",
    "TraceContext",
    "TraceContextError",
    "adhoc_trace_id",
    "context_id",
    "event_span_id",
    "identity",
    "parse_traceparent",
    "server_span_id",
    "server_span_id_of",
    "trace_context",
    "upstream_hop",
]

# Bumping this changes every id; it is part of every hash input.
ID_SCHEME = b"nats-otel/ids/v2"

_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?\Z")
TRACE_DISABLED = "trace disabled"  # what servers write into Nats-Trace-Dest to disable it


class TraceContextError(DecodeError):
    """No usable trace context: malformed `traceparent` and no ad-hoc trace destination."""

    reason = "bad_traceparent"


class TraceContext(Struct, frozen=True, gc=False):
    """Where the spans of one trace message belong.

    `id_fields` are the trace id and the parent span id as every span id of this context
    hashes them (`_fields` of their hex: a length and the digits, each); the two ids are
    read back from them (`trace_id`, `parent_span_id`), not kept beside them: a context is
    held through the live bridge's link window, and the two `bytes` were ~90 bytes and two
    blocks a message that only the placement, after the window, reads (docs/performance.md,
    session 52). Make one from the ids with `TraceContext.of`.

    `parent_span_id` is the application's span that published the message (empty for
    ad-hoc traces, whose origin span is a root). `adhoc_key` is set for ad-hoc traces: the
    subject the trace messages arrived on, from which the trace id is derived. A msgspec
    `Struct` (built in C, one per message).
    """

    id_fields: bytes
    trace_state: str = ""
    sampled: bool = True
    adhoc_key: str | None = None

    @classmethod
    def of(cls, trace_id: bytes, parent_span_id: bytes, trace_state: str = "", sampled: bool = True,
           adhoc_key: str | None = None) -> TraceContext:
        """The context of these ids (`parent_span_id` empty: none, a root)."""
        return cls(_context_fields(trace_id, parent_span_id), trace_state, sampled, adhoc_key)

    @property
    def trace_id(self) -> bytes:
        return context_id(self.id_fields, parent=False)

    @property
    def parent_span_id(self) -> bytes:
        return context_id(self.id_fields, parent=True)


def context_id(id_fields: bytes, parent: bool) -> bytes:
    """The trace id, or with `parent` the parent span id, of a context's `id_fields`: the
    first or second hex field `_fields` wrote, read back. The reference of the kernel's
    `_context_id`."""
    start, end = 4, 4 + int.from_bytes(id_fields[:4], "big")
    if parent:
        start = end + 4
        end = start + int.from_bytes(id_fields[start - 4:start], "big")
    return binascii.unhexlify(id_fields[start:end])


def parse_traceparent(value: str) -> tuple[bytes, bytes, int]:
    """(trace id, parent span id, flags) of a W3C traceparent; `TraceContextError` if invalid.

    Hex is accepted in either case (nats-server only checks the flags), output is bytes.
    """
    match = _TRACEPARENT.match(value.strip().lower()) if isinstance(value, str) else None
    if match is None:
        raise TraceContextError(f"malformed traceparent {value!r:.80}")
    version, trace_hex, parent_hex, flags_hex, rest = match.groups()
    if version == "ff" or (version == "00" and rest):
        raise TraceContextError(f"unsupported traceparent version in {value!r:.80}")
    if trace_hex == "0" * 32 or parent_hex == "0" * 16:
        raise TraceContextError(f"all-zero id in traceparent {value!r:.80}")
    return bytes.fromhex(trace_hex), bytes.fromhex(parent_hex), int(flags_hex, 16)


def trace_context(msg: TraceMessage, arrival_subject: str | None) -> TraceContext:
    """The trace context this message was traced for: its traceparent, else its ad-hoc destination.

    `arrival_subject` is the subject the trace message was received on: ad-hoc traces are
    correlated by it, because service imports rewrite the `Nats-Trace-Dest` header on the
    way. An ad-hoc context's `trace_id` names the group of messages traced to that
    destination; each traced message gets a trace of its own (`adhoc_trace_id`).
    """
    index = first_values(msg.headers)
    traceparent = index.get("traceparent")
    trace_state = index.get("tracestate") or ""
    dest = index.get("nats-trace-dest")
    adhoc_key = arrival_subject or (dest if dest and dest != TRACE_DISABLED else None)
    if traceparent is not None:
        try:
            trace_id, parent_id, flags = parse_traceparent(traceparent)
        except TraceContextError:
            if adhoc_key is None:
                raise
            # The server traced it for its Nats-Trace-Dest; the broken traceparent is
            # reported by the caller and the message is correlated as an ad-hoc trace.
        else:
            return TraceContext(_context_fields(trace_id, parent_id), trace_state, bool(flags & 1))
    if adhoc_key is None:
        raise TraceContextError("no traceparent and no ad-hoc trace destination")
    return TraceContext(_context_fields(_trace_id(_hash(b"adhoc-group", adhoc_key)), b""), trace_state, True, adhoc_key)


def adhoc_trace_id(ctx: TraceContext, origin: bytes) -> bytes:
    """The trace id of one message traced ad hoc: its group and its origin report's identity."""
    return _trace_id(hashlib.blake2b(_role(b"adhoc-trace") + ctx.id_fields + origin, digest_size=16).digest())


def identity(msg: TraceMessage) -> bytes:
    """What tells one server's report about one message from every other report.

    The server id (new at every start, so restarts never collide), the ingress time in
    nanoseconds and the ingress connection id (one connection's messages are read one
    after the other, so never at the same nanosecond). A redelivered trace message has the
    same identity, hence the same span ids.
    """
    ingress = msg.ingress
    return _fields(msg.server.id, str(ingress.ts_ns), str(ingress.cid))


def upstream_hop(msg: TraceMessage) -> str:
    """The hop id this server was reached by, or "" for the origin server.

    Only messages that came in from a route, gateway or leafnode have one; a client that
    republishes a delivered message with its headers carries a stale `Nats-Trace-Hop`,
    which the server ignores, and so do we.
    """
    if msg.ingress.kind in FORWARDING_KINDS:
        return msg.header("Nats-Trace-Hop") or ""
    return ""


def server_span_id(ctx: TraceContext, ident: bytes) -> bytes:
    """Id of the span of one server's handling of the message."""
    return _span_id(b"server", ctx, ident)


def server_span_id_of(id_fields: bytes, ident: bytes) -> bytes:
    """`server_span_id` of the context whose `id_fields` these are: for what keeps the two
    instead of the id (a `network.NetworkSample`: hashed only when an exemplar shows it)."""
    return _digest(_ROLE_PREFIX[b"server"] + id_fields + ident)


def event_span_id(ctx: TraceContext, ident: bytes, position: int) -> bytes:
    """Id of the span of the event at `position` (1-based) in one server's report."""
    return _span_id(b"event", ctx, ident, _POSITIONS[position] if position < 256 else _fields(str(position)))


def _span_id(role: bytes, ctx: TraceContext, *encoded: bytes) -> bytes:
    # Same bytes as _hash(role, trace hex, parent hex, *fields), with the prefixes reused.
    return _digest(_ROLE_PREFIX[role] + ctx.id_fields + b"".join(encoded))


def _digest(data: bytes) -> bytes:
    digest = hashlib.blake2b(data, digest_size=16).digest()[:8]
    # An all-zero span id is invalid in OTLP; astronomically unlikely, but never emit one.
    return digest if any(digest) else b"\x00" * 7 + b"\x01"


def _trace_id(digest: bytes) -> bytes:
    return digest[:16] if any(digest[:16]) else b"\x00" * 15 + b"\x01"


def _fields(*fields: str) -> bytes:
    # Length-prefixed fields: ("1", "23") and ("12", "3") can never hash alike.
    parts = []
    for field_text in fields:
        data = field_text.encode("utf-8", "surrogatepass")
        parts.append(len(data).to_bytes(4, "big"))
        parts.append(data)
    return b"".join(parts)


def _context_fields(trace_id: bytes, parent_span_id: bytes) -> bytes:
    return _fields(trace_id.hex(), parent_span_id.hex())


def _role(role: bytes) -> bytes:
    return ID_SCHEME + len(role).to_bytes(4, "big") + role


_ROLE_PREFIX = {role: _role(role) for role in (b"server", b"event")}
_POSITIONS = [_fields(str(position)) for position in range(256)]


def _hash(role: bytes, *fields: str) -> bytes:
    return hashlib.blake2b(_role(role) + _fields(*fields), digest_size=16).digest()
