"""Map and encode in one step: one trace message's spans as encoded protobuf, without
span records (the bridge's OTLP path, where nothing else looks at the spans).

`python_map_encode` is the reference: `mapping.map_message`, then each span as
`otlp_wire` writes it; the kernel's mapping stage (`_stage_map.pxi`) is its compiled
counterpart (`engine.map_encode`). `encode_request` puts the messages' encoded spans into
one `ExportTraceServiceRequest`: the same bytes as `encode.to_protobuf_bytes` of all their
span records (`python_encode_request` is the reference of the kernel's `encode_request`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from nats_otel.core.mapping import (
    SCOPE_NAME,
    SCOPE_VERSION,
    MappingOptions,
    Placement,
    map_message,
)
from nats_otel.core.model import (
    TraceMessage,
)
from nats_otel.core.otlp_wire import _field_bytes, _resource, _span, encode_scope
from nats_otel.core.records import Resource

__all__ = ["EncodedSpans", "encode_request", "map_encode", "python_encode_request",
           "python_map_encode"]


class EncodedSpans(NamedTuple):
    """The spans of one trace message: their resource, and the encoded `ScopeSpans.spans` entries."""

    resource: Resource
    data: bytes
    span_count: int


def python_map_encode(msg: TraceMessage, ctx: Any, placement: Placement,
                      options: MappingOptions) -> tuple[Resource, bytes, int, list[str]]:
    """(resource, encoded spans, span count, issues): `map_message`, each span encoded."""
    result = map_message(msg, ctx, placement, options)
    data = b"".join([_field_bytes(2, _span(span)) for span in result.spans])
    return result.spans[0].resource, data, len(result.spans), result.issues


_SCOPE = encode_scope(SCOPE_NAME, SCOPE_VERSION)
_SCOPE_FIELD = _field_bytes(1, _SCOPE)


def python_encode_request(items: Sequence[EncodedSpans]) -> bytes:
    """One serialized `ExportTraceServiceRequest` of the messages' spans, grouped by
    resource in order of first appearance: the bytes `encode.to_protobuf_bytes` gives for
    all their span records. The reference of `_otlp_wire.encode_encoded_request`."""
    groups: dict[Resource, list[bytes]] = {}
    for item in items:
        groups.setdefault(item.resource, []).append(item.data)
    scope_field = _SCOPE_FIELD
    return b"".join(
        _field_bytes(1, _resource(resource) + _field_bytes(2, scope_field + b"".join(parts)))
        for resource, parts in groups.items()
    )


# The references of the kernel's `map_encode` and `encode_request` (`_stage_map.pxi`,
# `_stage_wire.pxi`), which hand what they do not take to these.
map_encode = python_map_encode
encode_request = python_encode_request
