"""One export request cut into requests a backend takes (`otlp.max_request_bytes`).

OTLP receivers bound the size of one request: the OpenTelemetry Collector, Jaeger and Tempo
refuse a gRPC message over 4 MiB by default (`RESOURCE_EXHAUSTED`, which an exporter must
retry), and HTTP receivers bound a body too. One batch's request can be much larger: a
batch of `batch.max_messages` trace messages, each with up to `limits.max_events` events
(a fan-out to thousands of subscribers is one trace message with thousands of egress
spans). Sent whole, such a request is refused at every retry: in core mode the batch's
spans are lost, in JetStream mode the batch is redelivered and refused again forever.

So a request over the bound is cut at its own seams, on the wire (no decode): whole
`ResourceSpans` first, packed in order into requests up to the bound; a `ResourceSpans`
alone over it is cut between its `ScopeSpans`, and a `ScopeSpans` between its spans, each
piece keeping its resource and scope (and every other field of theirs). Every span goes out
once, in its order. A single span over the bound goes in a request of its own: nothing
smaller carries it, and the backend decides (a refusal is counted as any other).

The messages (opentelemetry-proto, `trace/v1`): ExportTraceServiceRequest {1: ResourceSpans
resource_spans}; ResourceSpans {1: resource, 2: ScopeSpans scope_spans, 3: schema_url};
ScopeSpans {1: scope, 2: Span spans, 3: schema_url}.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["split_request"]

_RESOURCE_SPANS = 1  # ExportTraceServiceRequest.resource_spans
_SCOPE_SPANS = 2  # ResourceSpans.scope_spans
_SPANS = 2  # ScopeSpans.spans
# A field around a piece adds its tag (one byte for these numbers) and its length (at most
# five bytes up to 4 GiB): a piece's body is cut to the bound less this.
_WRAPPING = 6


def split_request(request: bytes, max_bytes: int) -> list[bytes]:
    """`request` (a serialized ExportTraceServiceRequest) as requests of at most `max_bytes`
    each where its spans allow, the same spans in the same order; `[request]` when it fits."""
    if len(request) <= max_bytes:
        return [request]
    return [b"".join(part) for part in _cut(request, _RESOURCE_SPANS, max_bytes, _cut_resource_spans)]


def _cut_resource_spans(body: bytes, max_bytes: int) -> list[list[bytes]]:
    return _cut(body, _SCOPE_SPANS, max_bytes, _cut_scope_spans)


def _cut_scope_spans(body: bytes, max_bytes: int) -> list[list[bytes]]:
    return _cut(body, _SPANS, max_bytes, None)


# How a piece too large alone is cut: its body and the bound for each part's body.
_Cutter = Callable[[bytes, int], "list[list[bytes]]"]


def _cut(body: bytes, repeated: int, max_bytes: int, cut_child: _Cutter | None) -> list[list[bytes]]:
    """The message `body` as parts (lists of encoded fields) of at most `max_bytes` each where
    possible: every field but the `repeated` one in each part, the repeated field's entries
    shared out in order (an entry too large alone is cut by `cut_child`, when given)."""
    fields = _fields(body)
    kept = [encoded for number, encoded, _ in fields if number != repeated]
    base = _kept_size(kept)
    entries: list[bytes] = []
    for number, encoded, value in fields:
        if number != repeated:
            continue
        if cut_child is not None and base + len(encoded) > max_bytes:
            pieces = cut_child(value, max_bytes - base - _WRAPPING)
            entries += [_field(repeated, b"".join(piece)) for piece in pieces]
        else:
            entries.append(encoded)
    parts: list[list[bytes]] = []
    part: list[bytes] = []
    size = base
    for entry in entries:
        if part and size + len(entry) > max_bytes:
            parts.append(kept + part)
            part, size = [], base
        part.append(entry)
        size += len(entry)
    if part or not parts:
        parts.append(kept + part)
    return parts


def _kept_size(kept: list[bytes]) -> int:
    return sum(len(field) for field in kept)


def _fields(body: bytes) -> list[tuple[int, bytes, bytes]]:
    """Each field of a serialized message: (number, its whole encoding, its value's bytes for
    a length-delimited field, else b"")."""
    out: list[tuple[int, bytes, bytes]] = []
    at, end = 0, len(body)
    while at < end:
        start = at
        key, at = _varint(body, at)
        number, wire = key >> 3, key & 7
        value = b""
        if wire == 0:
            _, at = _varint(body, at)
        elif wire == 1:
            at += 8
        elif wire == 2:
            length, at = _varint(body, at)
            value = body[at:at + length]
            at += length
        elif wire == 5:
            at += 4
        else:
            raise ValueError(f"export request: wire type {wire} at byte {start} (not a serialized OTLP request)")
        if at > end:
            raise ValueError(f"export request: field {number} at byte {start} runs past the end")
        out.append((number, body[start:at], value))
    return out


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(data) or shift > 63:
            raise ValueError("export request: a varint runs past the end")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7


def _field(number: int, value: bytes) -> bytes:
    """A length-delimited field."""
    return _encode_varint(number << 3 | 2) + _encode_varint(len(value)) + value


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
