"""Map and encode in one step: one trace message's spans as encoded protobuf, without
span records (the bridge's OTLP path, where nothing else looks at the spans).

`python_map_encode` is the reference: `mapping.map_message`, then each span as
`otlp_wire` writes it. `_mapping.pyx` is its compiled twin (chosen when built, and when
`span_layout` finds mapping.py's layout to be the one it writes). `encode_request` puts
the messages' encoded spans into one `ExportTraceServiceRequest`: the same bytes as
`encode.to_protobuf_bytes` of all their span records (`python_encode_request` is its
reference, `_otlp_wire.encode_encoded_request` its compiled twin).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from nats_otel.core import accel
from nats_otel.core.ids import TraceContext, event_span_id, server_span_id
from nats_otel.core.mapping import (
    _NOT_FAILURES,
    HEADER_ATTRIBUTE_PREFIX,
    SCOPE_NAME,
    SCOPE_VERSION,
    MappingOptions,
    Placement,
    map_message,
)
from nats_otel.core.model import (
    _KIND_LABELS,
    FORWARDING_KINDS,
    Egress,
    Ingress,
    JetStreamEvent,
    ServerInfo,
    ServiceImport,
    StreamExport,
    SubjectMapping,
    TraceMessage,
)
from nats_otel.core.otlp_wire import _field_bytes, _resource, _span, encode_scope
from nats_otel.core.records import Resource

__all__ = ["IMPLEMENTATION", "EncodedSpans", "encode_request", "map_encode", "python_encode_request",
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


def configure_map_encode(module: Any) -> None:
    """Hand the compiled twin (`_mapping`) what it takes from the Python core: the layouts,
    the reference, the functions and tables mapping.py uses, the types it reads (here, and in
    the tests that compare the twins). Raises `LayoutChanged` or TypeError when the twin
    would not write what the reference does."""
    from nats_otel.core.mapping import server_resource
    from nats_otel.core.span_layout import ROLES, layouts

    module.configure(layouts(), ROLES, python_map_encode, server_resource, server_span_id, event_span_id,
                     HEADER_ATTRIBUTE_PREFIX, _NOT_FAILURES, _KIND_LABELS, FORWARDING_KINDS,
                     (Egress, SubjectMapping, StreamExport, ServiceImport, JetStreamEvent),
                     (TraceMessage, Ingress, TraceContext, Placement, ServerInfo))


def _compiled_map_encode() -> Any:
    from nats_otel.core.span_layout import LayoutChanged

    compiled = accel.configured("_mapping", configure_map_encode, (LayoutChanged,))
    return None if compiled is None else compiled.map_encode


def _compiled_encode_request() -> Any:
    def configure(module: Any) -> None:
        module.configure_encoded(python_encode_request, _SCOPE, EncodedSpans)

    compiled = accel.configured("_otlp_wire", configure)
    return None if compiled is None else compiled.encode_encoded_request


_compiled = _compiled_map_encode()
#: `python_map_encode`, compiled when built: what the bridge's OTLP path calls.
map_encode = python_map_encode if _compiled is None else _compiled
IMPLEMENTATION = "python" if _compiled is None else "compiled"
_compiled_request = _compiled_encode_request()
#: `python_encode_request`, compiled when built (`_otlp_wire`): one request per batch.
encode_request = python_encode_request if _compiled_request is None else _compiled_request
