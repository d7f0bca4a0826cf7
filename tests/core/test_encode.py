"""encode: the direct protobuf writer equals the generated classes; OTLP/JSON parses."""

from __future__ import annotations

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from nats_otel.core.encode import to_otlp_json_line, to_protobuf, to_protobuf_bytes
from nats_otel.core.pipeline import Converted
from nats_otel.core.records import Resource, SpanRecord
from tests.checks import flatten, parse_otlp_json_lines


def test_fast_writer_is_byte_identical_to_generated_classes(core, corpus_raws):
    spans = [s for r in core.convert_batch(corpus_raws) if isinstance(r, Converted) for s in r.spans]
    for start in range(0, len(spans), 37):
        batch = spans[start : start + 37]
        assert to_protobuf_bytes(batch) == to_protobuf(batch).SerializeToString()


def test_odd_values_encode_alike():
    resource = Resource((("service.name", "x"), ("big", 2**62), ("neg", -5), ("f", 1.5), ("arr", ("a", "b"))))
    span = SpanRecord(
        trace_id=b"\x01" * 16, span_id=b"\x02" * 8, parent_span_id=b"", name="é" * 200, kind=1,
        start_ns=1, end_ns=2**63, resource=resource, attributes=(("ok", True), ("no", False), ("empty", "")),
        status_code=2, status_message="m" * 300, trace_state="k=v",
    )
    data = to_protobuf_bytes([span])
    assert data == to_protobuf([span]).SerializeToString()
    parsed = flatten(ExportTraceServiceRequest.FromString(data))[0]
    assert parsed.name == "é" * 200 and parsed.end_ns == 2**63 and parsed.resource["neg"] == -5
    json_span = parse_otlp_json_lines(to_otlp_json_line([span]))[0]
    assert json_span == parsed


def test_copied_headers_are_encoded_but_not_cached():
    # A traceparent differs on every message: caching it would fill the pair cache with
    # entries never hit again (and evict those that are).
    from nats_otel.core import otlp_wire

    resource = Resource((("service.name", "x"),))
    spans = [
        SpanRecord(b"\x01" * 16, i.to_bytes(8, "big"), b"", "s", 5, 1, 2, resource,
                   (("messaging.system", "nats"), ("messaging.nats.header.traceparent", (f"00-{i:032x}-{i:016x}-01",))))
        for i in range(1, 2001)
    ]
    otlp_wire._pair_caches[9].clear()
    # The pure-Python writer's cache (tests/core/test_twins.py checks the compiled one's).
    from nats_otel.core.encode import _SCOPE

    data = otlp_wire.python_encode_request(spans, _SCOPE)
    assert data == to_protobuf(spans).SerializeToString()
    assert list(otlp_wire._pair_caches[9]) == [("messaging.system", "nats")]


def test_resource_pickled_in_another_process_hashes_like_one_made_here():
    # Resource caches its hash; str hashes differ between processes (the Spark backfill
    # ships spans to executors), so the cached value must not travel with the pickle.
    import os
    import pickle
    import subprocess
    import sys

    attributes = (("service.name", "nats-server"), ("messaging.nats.server.name", "n1"))
    code = ("import pickle, sys; from nats_otel.core.records import Resource; "
            f"sys.stdout.buffer.write(pickle.dumps(Resource({attributes!r})))")
    data = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                          env={**os.environ, "PYTHONHASHSEED": "12345"}).stdout
    shipped, local = pickle.loads(data), Resource(attributes)
    assert hash(shipped) == hash(local) and {local: 1}[shipped] == 1
