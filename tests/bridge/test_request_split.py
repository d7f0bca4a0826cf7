"""Export requests over `otlp.max_request_bytes` go out in parts a receiver takes
(export/request_split.py): every span once, in order, with its resource and scope; and the
live exporters against real receivers that refuse what is over their bound, as gRPC
receivers refuse a message over 4 MiB by default."""

from __future__ import annotations

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

from nats_otel.bridge.export.otlp import GrpcExporter, HttpExporter, in_parts
from nats_otel.bridge.export.request_split import split_request
from nats_otel.bridge.export.result import ExportResult
from nats_otel.bridge.settings import OtlpSettings
from nats_otel.core import engine
from nats_otel.devkit.receivers import OTLPGrpcReceiver, OTLPHttpReceiver
from tests.core.factories import egress, ingress, message, raw

GRPC_DEFAULT_LIMIT = 4 * 1024 * 1024  # what a gRPC receiver takes unless told otherwise


def _span(i: int, size: int = 40) -> Span:
    return Span(trace_id=i.to_bytes(16, "big"), span_id=(i + 1).to_bytes(8, "big"), name=f"s{i}" + "x" * size)


def _request(resources: list[tuple[str, list[list[Span]]]]) -> bytes:
    """A request: per resource (its name, its scopes' spans)."""
    request = ExportTraceServiceRequest()
    for name, scopes in resources:
        service = KeyValue(key="service.name", value=AnyValue(string_value=name))
        rs = ResourceSpans(resource=Resource(attributes=[service]), schema_url="https://opentelemetry.io/schemas/1.26.0")
        for at, spans in enumerate(scopes):
            rs.scope_spans.append(ScopeSpans(scope=InstrumentationScope(name=f"scope{at}", version="1"),
                                             spans=spans, schema_url="scope-schema"))
        request.resource_spans.append(rs)
    return request.SerializeToString()


def _flat(requests: list[bytes]) -> list[tuple[bytes, bytes, str, bytes]]:
    """Every span of the requests in order, with its resource, scope and the schema URLs."""
    out = []
    for data in requests:
        parsed = ExportTraceServiceRequest.FromString(data)
        for rs in parsed.resource_spans:
            for ss in rs.scope_spans:
                for span in ss.spans:
                    out.append((rs.resource.SerializeToString() + rs.schema_url.encode(),
                                ss.scope.SerializeToString(), ss.schema_url, span.SerializeToString()))
    return out


def test_a_request_that_fits_is_sent_as_it_is():
    request = _request([("a", [[_span(i) for i in range(10)]])])
    assert split_request(request, len(request)) == [request]


@pytest.mark.parametrize("max_bytes", [300, 1000, 5000])
def test_whole_resources_are_packed_in_order_each_part_under_the_bound(max_bytes):
    request = _request([(f"svc{r}", [[_span(r * 100 + i) for i in range(r % 4 + 1)]]) for r in range(40)])
    parts = split_request(request, max_bytes)
    assert len(parts) > 1
    assert all(len(part) <= max_bytes for part in parts)
    assert _flat(parts) == _flat([request])


@pytest.mark.parametrize("max_bytes", [400, 2000, 20_000])
def test_one_resource_over_the_bound_is_cut_between_scopes_and_spans_keeping_both(max_bytes):
    scopes = [[_span(s * 1000 + i) for i in range(300)] for s in range(3)]
    request = _request([("big", scopes), ("small", [[_span(9999)]])])
    parts = split_request(request, max_bytes)
    assert all(len(part) <= max_bytes for part in parts)
    assert _flat(parts) == _flat([request])  # resource, scope and schema URLs in every part
    assert len(parts) >= len(request) // max_bytes


def test_a_span_larger_than_the_bound_goes_alone():
    request = _request([("a", [[_span(1), _span(2, size=5000), _span(3)]])])
    parts = split_request(request, 2000)
    assert _flat(parts) == _flat([request])
    sizes = sorted(len(part) for part in parts)
    assert sizes[-1] > 2000 and all(size <= 2000 for size in sizes[:-1])
    assert len(ExportTraceServiceRequest.FromString(max(parts, key=len)).resource_spans[0].scope_spans[0].spans) == 1


def test_bytes_that_are_not_a_request_are_a_clear_error():
    with pytest.raises(ValueError, match="export request"):
        split_request(b"\x0a\xff\xff\xff\x7f" + b"x" * 100, 50)
    with pytest.raises(ValueError, match="wire type"):
        split_request(b"\x0f" * 100, 50)


def test_bytes_that_cannot_be_cut_go_whole_and_the_backend_decides():
    sent: list[bytes] = []
    junk = b"\x0f" * 100
    result = in_parts(junk, 50, lambda part: sent.append(part) or ExportResult(False, error="refused"))
    assert sent == [junk] and not result.ok and result.error == "refused"


def _fan_out_request(messages: int, subscribers: int) -> tuple[bytes, int]:
    """The request the bridge sends (its converter, `encode_results`) for trace messages
    each delivered to `subscribers` clients: a span per egress, the heavy messages of a big
    fan-out; and its span count."""
    raws = []
    for m in range(messages):
        doc = message(ingress(t=100), *[egress(t=200 + i, name=f"sub{i}") for i in range(subscribers)],
                      headers={"traceparent": [f"00-{m + 1:032x}-{m + 1:016x}-01"]})
        raws.append(raw(doc))
    converter = engine.Converter()
    observed = converter.observe_held(raws, 0.0)
    results = converter.convert_many(raws, 10.0, True, observed)
    return engine.encode_results(results)


def test_the_bridges_request_of_fan_out_messages_is_cut_into_whole_spans():
    request, spans = _fan_out_request(4, 3000)
    parts = split_request(request, 1_000_000)
    assert len(parts) >= 2 and all(len(part) <= 1_000_000 for part in parts)
    assert len(_flat(parts)) == spans == 4 * 3001
    assert _flat(parts) == _flat([request])


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_a_batch_over_the_receivers_bound_is_delivered_in_parts(protocol):
    request, spans = _fan_out_request(6, 4000)
    assert len(request) > 2 * GRPC_DEFAULT_LIMIT
    if protocol == "grpc":
        receiver = OTLPGrpcReceiver(max_receive_bytes=GRPC_DEFAULT_LIMIT)
    else:
        receiver = OTLPHttpReceiver(max_body_bytes=GRPC_DEFAULT_LIMIT)
    with receiver as rx:
        exporter_class = GrpcExporter if protocol == "grpc" else HttpExporter

        # Whole, the receiver refuses it (retried until given up): what the parts prevent.
        whole = exporter_class(OtlpSettings(endpoint=rx.endpoint, protocol=protocol, timeout=10,
                                            retry_max_elapsed=0, max_request_bytes=64 << 20))
        try:
            refused = whole.export_bytes(request)
        finally:
            whole.close()
        assert not refused.ok and rx.span_count == 0
        assert ("RESOURCE_EXHAUSTED" in refused.error) if protocol == "grpc" else ("413" in refused.error)

        exporter = exporter_class(OtlpSettings(endpoint=rx.endpoint, protocol=protocol, timeout=10))
        try:
            result = exporter.export_bytes(request)
        finally:
            exporter.close()
        assert result.ok, result.error
        assert result.attempts == rx.request_count >= 3
        assert rx.span_count == spans
        assert all(r.ByteSize() <= 4_000_000 for r in rx.requests)
        got = [(s.trace_id, s.span_id) for r in rx.requests for rs in r.resource_spans for ss in rs.scope_spans
               for s in ss.spans]
        sent = [(s.trace_id, s.span_id) for rs in ExportTraceServiceRequest.FromString(request).resource_spans
                for ss in rs.scope_spans for s in ss.spans]
        assert sorted(got) == sorted(sent) and len(set(got)) == len(got)
