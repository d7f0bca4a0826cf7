"""decode: compression, JSON, schema, timestamps, typed errors (table-driven)."""

from __future__ import annotations

import gzip
import json

import cramjam
import orjson
import pytest

from nats_otel.core.decode import (
    CompressionError,
    DecodeLimits,
    JSONError,
    RecordError,
    SchemaError,
    TooLargeError,
    decode,
    decompress,
    from_document,
    parse_archive_line,
)
from nats_otel.core.ids import TraceContextError, parse_traceparent, trace_context
from nats_otel.core.timestamps import parse_rfc3339_ns
from tests.core.factories import PARENT_ID, TRACE_ID, egress, ingress, message, raw

DOC = message(ingress(), egress())
PLAIN = orjson.dumps(DOC)


@pytest.mark.parametrize(
    "payload, encoding",
    [
        (PLAIN, None),
        (PLAIN, "identity"),
        (gzip.compress(PLAIN, mtime=0), "gzip"),
        (bytes(cramjam.snappy.compress(PLAIN)), "snappy"),
        (bytes(cramjam.snappy.compress(PLAIN)), "Snappy"),
    ],
)
def test_content_encodings(payload, encoding):
    headers = {"Content-Encoding": [encoding]} if encoding else {}
    msg = decode(raw(payload, headers=headers))
    assert msg.server.name == "s1" and len(msg.events) == 1


@pytest.mark.parametrize(
    "payload, headers, error, fragment",
    [
        (b"\x1f\x8b garbage", {"Content-Encoding": ["gzip"]}, CompressionError, "gzip"),
        (gzip.compress(PLAIN, mtime=0)[:-12], {"Content-Encoding": ["gzip"]}, CompressionError, "truncated"),
        (b"not snappy at all", {"Content-Encoding": ["snappy"]}, CompressionError, "snappy"),
        (PLAIN, {"Content-Encoding": ["br"]}, CompressionError, "unsupported"),
        (b"{not json", {}, JSONError, "not JSON"),
        (b"\xff\xfe\xfa", {}, JSONError, "not JSON"),
        (b"[1, 2]", {}, SchemaError, "not an object"),
        (orjson.dumps({"events": [ingress()]}), {}, SchemaError, "'server'"),
        (orjson.dumps({"server": {"name": "x", "id": "y"}, "events": []}), {}, SchemaError, "'events'"),
        (orjson.dumps(message(egress())), {}, SchemaError, "ingress"),
        (orjson.dumps(message(ingress(t=0) | {"ts": "yesterday"})), {}, SchemaError, "RFC 3339"),
        (orjson.dumps(message(ingress() | {"kind": "router"})), {}, SchemaError, "kind"),
        (orjson.dumps(message(ingress()) | {"hops": -1}), {}, SchemaError, "hops"),
    ],
)
def test_decode_errors_are_typed_with_reason(payload, headers, error, fragment):
    with pytest.raises(error) as info:
        decode(raw(payload, headers=headers))
    assert fragment in str(info.value)
    assert info.value.reason in {"bad_compression", "bad_json", "bad_schema"}


def test_gzip_bomb_is_bounded():
    bomb = gzip.compress(b" " * (4 * 1024 * 1024))
    with pytest.raises(TooLargeError):
        decode(raw(bomb, headers={"Content-Encoding": ["gzip"]}), DecodeLimits(max_decompressed_bytes=1024 * 1024))


def test_oversized_payload_rejected_before_parsing():
    with pytest.raises(TooLargeError) as info:
        decode(raw(PLAIN), DecodeLimits(max_payload_bytes=10))
    assert info.value.reason == "too_large"


def test_unknown_and_malformed_events_are_kept_aside():
    doc = message(ingress(), {"type": "xx", "ts": "2026-11-22T02:16:30Z", "new": 1}, {"type": "eg", "ts": 5}, egress())
    msg = decode(raw(doc))
    assert len(msg.events) == 1
    assert [u["position"] for u in msg.unknown_events] == [1, 2]
    assert msg.unknown_events[0]["problem"] == "unknown type"


@pytest.mark.parametrize(
    "text, ns",
    [
        ("2026-11-22T02:16:30.32693Z", 1795313790_326930000),
        ("2026-11-22T02:16:30.123456789Z", 1795313790_123456789),
        ("2026-11-22T02:16:30.12345Z", 1795313790_123450000),
        ("2026-11-22T02:16:30Z", 1795313790_000000000),
        ("2026-11-22T03:16:30.000000001+01:00", 1795313790_000000001),
        ("2026-11-21T21:16:30.5-05:00", 1795313790_500000000),
    ],
)
def test_nanosecond_timestamps(text, ns):
    assert parse_rfc3339_ns(text) == ns


@pytest.mark.parametrize(
    "text", ["", "2026-11-22", "2026-13-22T02:16:30Z", "2026-11-22T02:16:30.1234567890Z", "x" * 100])
def test_bad_timestamps(text):
    with pytest.raises(ValueError):
        parse_rfc3339_ns(text)


@pytest.mark.parametrize("name", ["traceparent", "TraceParent", "TRACEPARENT"])
def test_traceparent_found_whatever_the_case(name):
    msg = decode(raw(message(ingress(), headers={name: [f"00-{TRACE_ID}-{PARENT_ID}-01"], "TraceState": ["k=v"]})))
    ctx = trace_context(msg, "trace.a")
    assert ctx.trace_id.hex() == TRACE_ID and ctx.parent_span_id.hex() == PARENT_ID and ctx.trace_state == "k=v"


@pytest.mark.parametrize(
    "value",
    [
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
        "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
        "zz-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    ],
)
def test_malformed_traceparent(value):
    with pytest.raises(TraceContextError) as info:
        parse_traceparent(value)
    assert info.value.reason == "bad_traceparent"


def test_malformed_traceparent_without_adhoc_dest_is_an_error():
    msg = decode(raw(message(ingress(), headers={"traceparent": ["nonsense"]})))
    with pytest.raises(TraceContextError):
        trace_context(msg, None)


def test_adhoc_trace_correlates_by_arrival_subject():
    headers = {"Nats-Trace-Dest": ["_R_.rewritten"], "Nats-Trace-Hop": ["1"]}
    downstream = decode(raw(message(ingress(kind=1), headers=headers)))
    origin = decode(raw(message(ingress(), headers={"Nats-Trace-Dest": ["my.trace"]})))
    a, b = trace_context(origin, "my.trace"), trace_context(downstream, "my.trace")
    assert a.trace_id == b.trace_id and a.parent_span_id == b"" and a.adhoc_key == "my.trace"
    assert trace_context(origin, "other").trace_id != a.trace_id


@pytest.mark.parametrize(
    "line, fragment",
    [
        (b"{broken", "not JSON"),
        (b"[]", "not an object"),
        (b'{"subject": "x"}', "neither"),
        (b'{"payload_b64": "***"}', "base64"),
        (b'{"payload_b64": "e30=", "headers": {"a": "b"}}', "headers"),
    ],
)
def test_bad_archive_lines(line, fragment):
    with pytest.raises(RecordError) as info:
        parse_archive_line(line)
    assert fragment in str(info.value)


def test_bare_trace_message_line_is_accepted():
    parsed = parse_archive_line(PLAIN)
    assert parsed.subject is None and decode(parsed).ingress.subject == "orders.new"


@pytest.mark.parametrize("stamp", ["1969-12-31T23:59:59.999Z", "9999-12-31T23:59:59Z", "2600-01-01T00:00:00Z"])
def test_timestamps_otlp_cannot_carry_are_schema_errors(stamp):
    # found by the fuzz test: such a time crashed the protobuf encoder
    with pytest.raises(SchemaError) as info:
        decode(raw(message(ingress() | {"ts": stamp})))
    assert "1970 to 2554" in str(info.value)


def test_fast_and_slow_paths_agree_on_the_whole_corpus(corpus_raws):
    # decode() tries one msgspec pass over the bytes; from_document() is the path that
    # isolates bad events. On every real message both must give the same TraceMessage.
    for item in corpus_raws:
        data = decompress(item.payload, item.header("Content-Encoding"), DecodeLimits())
        assert decode(item) == from_document(orjson.loads(data))


def _big_msgsize() -> dict:
    doc = message(ingress())
    doc["request"]["msgsize"] = 2**64
    return doc


@pytest.mark.parametrize(
    "doc",
    [
        message(ingress() | {"cid": 2**64}),
        message(ingress()) | {"hops": 2**64},
        _big_msgsize(),
        message(ingress()) | {"server": {"name": "s1", "id": "x", "seq": 2**64}},
    ],
)
def test_numbers_over_a_uint64_are_schema_errors(doc):
    # msgspec bounds stop at int64; a larger number would corrupt the protobuf varint.
    with pytest.raises(SchemaError):
        decode(raw(_dumps(doc)))


def test_an_egress_over_a_uint64_is_kept_aside_not_mapped():
    msg = decode(raw(_dumps(message(ingress(), egress() | {"cid": 2**64}, egress()))))
    assert len(msg.events) == 1 and msg.unknown_events[0]["position"] == 1
    assert "cid" in msg.unknown_events[0]["problem"]


def _dumps(doc) -> bytes:
    # orjson refuses integers over 64 bits; the standard library writes them as a server could.
    return json.dumps(doc).encode()
