"""A direct protobuf writer for OTLP trace export requests (the hot path of `encode`).

Building one upb message per attribute dominated the encoding profile. Span attributes
repeat a lot (`messaging.system=nats`, connection kinds, accounts, resources), so each
encoded (key, value) pair and each encoded resource is cached: a span is mostly a join of
cached bytes. The output is ordinary protobuf: `ExportTraceServiceRequest.FromString`
reads it, and a test checks it equals what the generated classes serialize.

Field numbers are those of opentelemetry-proto (trace/v1, common/v1, resource/v1).

This file is the reference; the kernel's wire stage (`_stage_wire.pxi`, `encode_spans`) is
its compiled counterpart (same bytes, written into one C buffer), which `engine` chooses.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence

from nats_otel.core.mapping import HEADER_ATTRIBUTE_PREFIX
from nats_otel.core.records import Attributes, AttrValue, Resource, SpanRecord

__all__ = ["encode_export_request", "encode_request", "group_by_resource", "python_encode_request"]

_CACHE_LIMIT = 65_536
# (key, value) -> encoded KeyValue entry, one cache per parent field number (9 in a Span,
# 1 in a Resource): the pair itself is the key, no tuple is built per look-up.
_pair_caches: dict[int, dict[tuple[str, AttrValue], bytes]] = {1: {}, 9: {}}
# Copied message headers (a traceparent above all) differ on every message: caching them
# only filled the cache (~20 MB per process at 65k entries) and evicted the pairs that repeat.
_UNCACHED_PREFIX = HEADER_ATTRIBUTE_PREFIX
_resource_cache: dict[Resource, bytes] = {}
_pack_times = struct.Struct("<BQBQ").pack  # start (field 7) and end (field 8), fixed64 each
_pack_double = struct.Struct("<d").pack


def _varint(value: int) -> bytes:
    if value < 0:
        value += 1 << 64  # int64 negatives: two's complement, 10 bytes
    if value < 0x80:
        return bytes((value,))
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field_bytes(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2); all our field numbers fit one tag byte."""
    size = len(payload)
    if size < 0x80:
        return bytes((number << 3 | 2, size)) + payload
    return bytes((number << 3 | 2,)) + _varint(size) + payload


def _any_value(value: AttrValue) -> bytes:
    # bool before int: bool is an int subclass.
    if isinstance(value, bool):
        return b"\x10" + (b"\x01" if value else b"\x00")
    if isinstance(value, int):
        return b"\x18" + _varint(value)
    if isinstance(value, float):
        return b"\x21" + _pack_double(value)
    if isinstance(value, tuple):
        return _field_bytes(5, b"".join(_field_bytes(1, _any_value(item)) for item in value))
    return _field_bytes(1, str(value).encode("utf-8", "surrogatepass"))


def _key_value(number: int, key: str, value: AttrValue) -> bytes:
    """One KeyValue as an entry (tag included) of repeated field `number` of its parent."""
    return _field_bytes(
        number, _field_bytes(1, key.encode("utf-8", "surrogatepass")) + _field_bytes(2, _any_value(value))
    )


def _attributes(number: int, attributes: Attributes) -> bytes:
    cache = _pair_caches[number]
    get = cache.get
    parts = [get(pair) for pair in attributes]
    if None in parts:
        for index, pair in enumerate(attributes):
            if parts[index] is None:
                encoded = parts[index] = _key_value(number, *pair)
                if pair[0].startswith(_UNCACHED_PREFIX):
                    continue
                if len(cache) >= _CACHE_LIMIT:
                    cache.clear()  # subjects and names are unbounded: keep memory bounded
                cache[pair] = encoded
    return b"".join(parts)  # type: ignore[arg-type]


def _resource(resource: Resource) -> bytes:
    encoded = _resource_cache.get(resource)
    if encoded is None:
        if len(_resource_cache) >= 4096:
            _resource_cache.clear()
        encoded = _resource_cache[resource] = _field_bytes(1, _attributes(1, resource.attributes))
    return encoded


# Span.kind (field 6) values and the tag of an 8-byte parent span id (field 4), pre-encoded.
_KIND_FIELD = {kind: b"\x30" + bytes((kind,)) for kind in range(6)}
_PARENT_TAG = b"\x22\x08"  # field 4, 8 bytes


def _span(span: SpanRecord) -> bytes:
    trace_id, span_id, parent, name, kind, start_ns, end_ns, _, attributes, code, message, state = span
    parts = [b"\x0a\x10", trace_id, b"\x12\x08", span_id]
    if state:
        parts.append(_field_bytes(3, state.encode()))
    if parent:
        parts.append(_PARENT_TAG + parent if len(parent) == 8 else _field_bytes(4, parent))
    parts.append(_field_bytes(5, name.encode("utf-8", "surrogatepass")))
    parts.append(_KIND_FIELD.get(kind) or b"\x30" + _varint(kind))
    parts.append(_pack_times(0x39, start_ns, 0x41, end_ns))
    parts.append(_attributes(9, attributes))
    if code or message:
        status = b""
        if message:
            status += _field_bytes(2, message.encode("utf-8", "surrogatepass"))
        if code:
            status += b"\x18" + _varint(code)
        parts.append(_field_bytes(15, status))
    return b"".join(parts)


def encode_export_request(groups: Sequence[tuple[Resource, Sequence[SpanRecord]]], scope: bytes) -> bytes:
    """Serialized `ExportTraceServiceRequest` for spans grouped by resource.

    `scope` is the encoded InstrumentationScope message (name, version).
    """
    scope_field = _field_bytes(1, scope)
    out = []
    for resource, spans in groups:
        scope_spans = scope_field + b"".join([_field_bytes(2, _span(span)) for span in spans])
        out.append(_field_bytes(1, _resource(resource) + _field_bytes(2, scope_spans)))
    return b"".join(out)


def encode_scope(name: str, version: str) -> bytes:
    """An encoded InstrumentationScope."""
    return _field_bytes(1, name.encode()) + _field_bytes(2, version.encode())


def group_by_resource(spans: Iterable[SpanRecord]) -> list[tuple[Resource, list[SpanRecord]]]:
    """Spans grouped by resource, in order of first appearance (deterministic output)."""
    groups: dict[Resource, list[SpanRecord]] = {}
    for span in spans:
        groups.setdefault(span.resource, []).append(span)
    return list(groups.items())


def python_encode_request(spans: Iterable[SpanRecord], scope: bytes) -> bytes:
    """Serialized `ExportTraceServiceRequest` of spans (grouped by resource): the reference."""
    return encode_export_request(group_by_resource(spans), scope)


# The reference of the kernel's `encode_spans` (`_stage_wire.pxi`), which hands odd values,
# odd spans and resources back to `_key_value`, `_span` and `_resource` here.
encode_request = python_encode_request
