"""Span records -> OTLP: protobuf `ExportTraceServiceRequest`, and OTLP/JSON lines.

Pure. The protobuf messages are built directly (no SDK span objects: they cost 3x more,
DESIGN §9). The JSON follows the OTLP/JSON rules (protobuf JSON mapping with hex ids,
integer enums, 64-bit integers as strings): one request per line is the OTel Collector
file exporter's format, readable by its `otlpjsonfile` receiver.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import orjson
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource as ResourceProto
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, Status

from nats_otel.core.engine import encode_spans
from nats_otel.core.mapping import SCOPE_NAME, SCOPE_VERSION
from nats_otel.core.otlp_wire import encode_scope, group_by_resource
from nats_otel.core.records import Attributes, AttrValue, SpanRecord

__all__ = [
    "group_by_resource",
    "split_by_trace",
    "to_otlp_json",
    "to_otlp_json_line",
    "to_protobuf",
    "to_protobuf_bytes",
]

_SCOPE = encode_scope(SCOPE_NAME, SCOPE_VERSION)


# --- protobuf ----------------------------------------------------------------------------


def to_protobuf_bytes(spans: Sequence[SpanRecord]) -> bytes:
    """The serialized OTLP export request holding the spans: what exporters send (fast path)."""
    return encode_spans(spans, _SCOPE)


def to_protobuf(spans: Sequence[SpanRecord]) -> ExportTraceServiceRequest:
    """One OTLP export request holding the spans, as generated protobuf classes."""
    request = ExportTraceServiceRequest()
    for resource, group in group_by_resource(spans):
        resource_spans = ResourceSpans(resource=ResourceProto(attributes=_pb_attributes(resource.attributes)))
        scope_spans = ScopeSpans(scope=InstrumentationScope(name=SCOPE_NAME, version=SCOPE_VERSION))
        scope_spans.spans.extend(_pb_span(span) for span in group)
        resource_spans.scope_spans.append(scope_spans)
        request.resource_spans.append(resource_spans)
    return request


def _pb_span(span: SpanRecord) -> Span:
    pb = Span(
        trace_id=span.trace_id,
        span_id=span.span_id,
        name=span.name,
        kind=Span.SpanKind.ValueType(span.kind),
        start_time_unix_nano=span.start_ns,
        end_time_unix_nano=span.end_ns,
        attributes=_pb_attributes(span.attributes),
    )
    if span.parent_span_id:
        pb.parent_span_id = span.parent_span_id
    if span.trace_state:
        pb.trace_state = span.trace_state
    if span.status_code:
        pb.status.CopyFrom(Status(code=Status.StatusCode.ValueType(span.status_code), message=span.status_message))
    return pb


def _pb_attributes(attributes: Attributes) -> list[KeyValue]:
    return [KeyValue(key=key, value=_pb_value(value)) for key, value in attributes]


def _pb_value(value: AttrValue) -> AnyValue:
    # bool before int: bool is an int subclass.
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    if isinstance(value, float):
        return AnyValue(double_value=value)
    if isinstance(value, tuple):
        pb = AnyValue()
        pb.array_value.values.extend(_pb_value(item) for item in value)
        return pb
    return AnyValue(string_value=str(value))


# --- OTLP/JSON ---------------------------------------------------------------------------


def to_otlp_json(spans: Sequence[SpanRecord]) -> dict[str, Any]:
    """The OTLP/JSON document of one export request."""
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": _json_attributes(resource.attributes)},
                "scopeSpans": [
                    {
                        "scope": {"name": SCOPE_NAME, "version": SCOPE_VERSION},
                        "spans": [_json_span(span) for span in group],
                    }
                ],
            }
            for resource, group in group_by_resource(spans)
        ]
    }


def to_otlp_json_line(spans: Sequence[SpanRecord]) -> bytes:
    """One line (with its newline) of the Collector file-exporter format."""
    return orjson.dumps(to_otlp_json(spans)) + b"\n"


def _json_span(span: SpanRecord) -> dict[str, Any]:
    doc: dict[str, Any] = {"traceId": span.trace_id.hex(), "spanId": span.span_id.hex()}
    if span.trace_state:
        doc["traceState"] = span.trace_state
    if span.parent_span_id:
        doc["parentSpanId"] = span.parent_span_id.hex()
    doc["name"] = span.name
    doc["kind"] = span.kind
    doc["startTimeUnixNano"] = str(span.start_ns)
    doc["endTimeUnixNano"] = str(span.end_ns)
    doc["attributes"] = _json_attributes(span.attributes)
    status: dict[str, Any] = {}
    if span.status_code:
        status["code"] = span.status_code
    if span.status_message:
        status["message"] = span.status_message
    doc["status"] = status
    return doc


def _json_attributes(attributes: Attributes) -> list[dict[str, Any]]:
    return [{"key": key, "value": _json_value(value)} for key, value in attributes]


def _json_value(value: AttrValue) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    if isinstance(value, tuple):
        return {"arrayValue": {"values": [_json_value(item) for item in value]}}
    return {"stringValue": str(value)}


def split_by_trace(spans: Iterable[SpanRecord]) -> list[list[SpanRecord]]:
    """Spans grouped into traces, sorted by trace id, spans by (start, end, span id); a
    trace of more than `MAX_SPANS_PER_REQUEST` spans in several consecutive groups.

    Whatever the input order, the result is the same: `convert` writes one request per
    group from it, so shuffled input gives byte-identical output. The bound keeps a
    request (and what a writer holds) small however many messages share one traceparent.
    """
    traces: dict[bytes, list[SpanRecord]] = {}
    for span in spans:
        traces.setdefault(span.trace_id, []).append(span)
    out: list[list[SpanRecord]] = []
    for trace_id in sorted(traces):
        ordered = sorted(traces[trace_id], key=lambda s: (s.start_ns, s.end_ns, s.span_id))
        out.extend(ordered[i : i + MAX_SPANS_PER_REQUEST] for i in range(0, len(ordered), MAX_SPANS_PER_REQUEST))
    return out


#: Spans in one OTLP/JSON request of `convert`, the backfill and the bridge's file output
#: (~2 MB of JSON: under gRPC's default 4 MiB message limit if it is sent on).
MAX_SPANS_PER_REQUEST = 2000
