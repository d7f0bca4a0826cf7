"""The shipped OTLP receivers, fed by the real OpenTelemetry SDK exporters."""

from __future__ import annotations

import gzip
import json
import threading
import time
import urllib.error
import urllib.request

import grpc
import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
    OTLPSpanExporter as GrpcSpanExporter,
)
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as HttpSpanExporter,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc import TraceServiceStub
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from nats_otel.devkit.receivers import OTLPGrpcReceiver, OTLPHttpReceiver

pytestmark = pytest.mark.integration

_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def make_spans(*names: str) -> list[ReadableSpan]:
    """Finished SDK spans (a parent and children) from a real TracerProvider."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "receiver-test"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("nats_otel.tests")
    with tracer.start_as_current_span(names[0]):
        for name in names[1:]:
            with tracer.start_as_current_span(name):
                pass
    provider.shutdown()
    return list(memory.get_finished_spans())


def service_name(resource) -> str:
    return next(a.value.string_value for a in resource.attributes if a.key == "service.name")


# --------------------------------------------------------------------------- gRPC


def test_grpc_receiver_records_sdk_export() -> None:
    spans = make_spans("parent", "child-1", "child-2")
    with OTLPGrpcReceiver() as rx:
        exporter = GrpcSpanExporter(endpoint=rx.endpoint, insecure=True, timeout=5,
                                    headers={"x-tenant": "t1"})
        assert exporter.export(spans) is SpanExportResult.SUCCESS
        got = rx.wait_for_spans(3, timeout=5)
        exporter.shutdown()

    assert rx.span_count == 3 and rx.request_count == 1
    assert sorted(s.name for _, s in got) == ["child-1", "child-2", "parent"]
    assert {service_name(r) for r, _ in got} == {"receiver-test"}
    by_name = {s.name: s for _, s in got}
    assert by_name["child-1"].parent_span_id == by_name["parent"].span_id
    assert len({s.trace_id for _, s in got}) == 1
    assert rx.received[0].headers["x-tenant"] == "t1"
    assert isinstance(rx.requests[0], ExportTraceServiceRequest)


def test_grpc_receiver_outage_and_restart_on_same_port() -> None:
    spans = make_spans("one")
    rx = OTLPGrpcReceiver().start()
    try:
        port = rx.port
        # Short timeout: a failing export gives up after its first attempt.
        short = GrpcSpanExporter(endpoint=rx.endpoint, insecure=True, timeout=1)
        # gRPC shares connections (subchannels) between channels to the same target, so
        # `steady` would inherit the reconnect backoff that `short` runs into while the
        # receiver is down and need 1-3 s more after the restart. A private pool keeps
        # this test about the receiver.
        steady = GrpcSpanExporter(endpoint=rx.endpoint, insecure=True, timeout=5,
                                  channel_options=(("grpc.use_local_subchannel_pool", 1),))

        rx.unavailable, rx.retry_after = True, 0.01
        with grpc.insecure_channel(f"{rx.host}:{rx.port}") as channel, pytest.raises(grpc.RpcError) as err:
            TraceServiceStub(channel).Export(ExportTraceServiceRequest(), timeout=5)
        assert err.value.code() is grpc.StatusCode.UNAVAILABLE
        assert short.export(spans) is SpanExportResult.FAILURE
        assert rx.span_count == 0 and rx.rejected_count > 2  # the stub's call + SDK retries

        rx.unavailable = False
        assert steady.export(spans) is SpanExportResult.SUCCESS
        assert rx.span_count == 1

        rx.stop()
        assert short.export(spans) is SpanExportResult.FAILURE
        rx.start()
        assert rx.port == port
        # The exporter configured before the restart reaches the receiver again.
        assert steady.export(spans) is SpanExportResult.SUCCESS
        rx.wait_for_spans(2, timeout=5)
        short.shutdown()
        steady.shutdown()
    finally:
        rx.stop()


def _end_outage_after(rx, rejected: int) -> threading.Thread:
    """Ends `rx`'s outage once it has refused `rejected` requests (a count, not a time)."""
    def watch() -> None:
        while rx.rejected_count < rejected:
            time.sleep(0.005)
        rx.unavailable = False

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    return watcher


@pytest.mark.parametrize("transport", ["grpc", "http"])
def test_suggested_retry_delay_is_honoured(transport: str) -> None:
    """With ``retry_after`` the SDK retries at the suggested pace and gets through once the
    outage ends. Counted in attempts, not seconds: the outage lasts three refusals, and
    within its 5 s timeout the SDK's own backoff (1 s, 2 s, then 4 s: more than is left)
    makes three attempts at most, so a fourth that succeeds came from the hint."""
    spans = make_spans("one")
    receiver = OTLPGrpcReceiver() if transport == "grpc" else OTLPHttpReceiver()
    with receiver as rx:
        exporter = (GrpcSpanExporter(endpoint=rx.endpoint, insecure=True, timeout=5)
                    if transport == "grpc" else HttpSpanExporter(endpoint=rx.endpoint, timeout=5))
        rx.unavailable, rx.retry_after = True, 0.1
        watcher = _end_outage_after(rx, 3)
        assert exporter.export(spans) is SpanExportResult.SUCCESS
        watcher.join()
        exporter.shutdown()
    # 3, or one or two more when the watcher was slower than the 0.1 s hint; 6 tries in all.
    assert 3 <= rx.rejected_count <= 5 and rx.span_count == 1


def test_wait_for_spans_times_out_with_count() -> None:
    with OTLPGrpcReceiver() as rx, pytest.raises(TimeoutError, match="0 of 1 spans"):
        rx.wait_for_spans(1, timeout=0.2)


# --------------------------------------------------------------------------- HTTP


@pytest.mark.parametrize("compression", [Compression.NoCompression, Compression.Gzip])
def test_http_receiver_records_sdk_export(compression: Compression) -> None:
    spans = make_spans("parent", "child")
    with OTLPHttpReceiver() as rx:
        assert rx.endpoint.endswith("/v1/traces")
        exporter = HttpSpanExporter(endpoint=rx.endpoint, timeout=5, compression=compression,
                                    headers={"x-tenant": "t2"})
        assert exporter.export(spans) is SpanExportResult.SUCCESS
        got = rx.wait_for_spans(2, timeout=5)
        exporter.shutdown()

    assert sorted(s.name for _, s in got) == ["child", "parent"]
    headers = rx.received[0].headers
    assert headers["content-type"] == "application/x-protobuf"
    assert headers["x-tenant"] == "t2"
    if compression is Compression.Gzip:
        assert headers["content-encoding"] == "gzip"


def test_http_receiver_outage_and_restart_on_same_port() -> None:
    spans = make_spans("one")
    rx = OTLPHttpReceiver().start()
    try:
        port = rx.port
        exporter = HttpSpanExporter(endpoint=rx.endpoint, timeout=1)
        rx.unavailable, rx.retry_after = True, 0.01
        assert exporter.export(spans) is SpanExportResult.FAILURE
        assert rx.rejected_count > 1 and rx.span_count == 0

        rx.unavailable = False
        assert exporter.export(spans) is SpanExportResult.SUCCESS

        # The exporter's session keeps its connection alive; stop() must cut it too.
        rx.stop()
        assert exporter.export(spans) is SpanExportResult.FAILURE
        rx.start()
        assert rx.port == port
        assert exporter.export(spans) is SpanExportResult.SUCCESS
        assert rx.span_count == 2
        exporter.shutdown()
    finally:
        rx.stop()


def _post(url: str, body: bytes, headers: dict[str, str]) -> int:
    req = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with _NO_PROXY.open(req, timeout=5) as resp:
            return resp.status
    except urllib.error.HTTPError as e:
        return e.code


def test_http_receiver_json_and_errors() -> None:
    trace_id = "5b8efff798038103d269b633813fc60c"
    doc = {"resourceSpans": [{"resource": {}, "scopeSpans": [{"spans": [
        {"traceId": trace_id, "spanId": "eee19b7ec3c1b174", "name": "json-span",
         "startTimeUnixNano": "1", "endTimeUnixNano": "2"}]}]}]}
    with OTLPHttpReceiver() as rx:
        ok = _post(rx.endpoint, gzip.compress(json.dumps(doc).encode()),
                   {"Content-Type": "application/json", "Content-Encoding": "gzip"})
        assert ok == 200
        (_, span), = rx.spans()
        assert span.name == "json-span" and span.trace_id.hex() == trace_id

        assert _post(rx.endpoint, b"\xff\xff", {"Content-Type": "application/x-protobuf"}) == 400
        assert _post(rx.endpoint, b"x", {"Content-Type": "text/plain"}) == 415
        base = rx.endpoint.removesuffix("/v1/traces")
        assert _post(base + "/v1/logs", b"", {"Content-Type": "application/x-protobuf"}) == 404
        assert rx.request_count == 1
