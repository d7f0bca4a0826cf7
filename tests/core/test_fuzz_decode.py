"""Fuzz decode + map + encode (CI-sized; `bench/fuzz_decode.py` runs 100k+ of the same kinds).

Every generated payload must give spans that encode, or a `Rejected` with a known reason
label and a detail, within a bound on the work it makes (Python calls, counted: the same on
every machine): never an exception, never a hang.
"""

from __future__ import annotations

import gzip
import json
from typing import Any

import cramjam
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nats_otel.bridge.settings import load_settings
from nats_otel.core.decode import DecodeLimits, RawTraceMessage
from nats_otel.core.encode import to_otlp_json_line, to_protobuf_bytes
from nats_otel.core.linking import LinkSettings
from nats_otel.core.pipeline import Converted, Rejected
from tests.core.factories import TRACEPARENT, egress, ingress, message
from tests.work import python_calls

LIMITS = DecodeLimits(max_payload_bytes=64 * 1024, max_decompressed_bytes=128 * 1024, max_events=200)
REASONS = {"bad_compression", "too_large", "bad_json", "bad_schema"}
# The most Python functions and builtins one conversion may call: a fixed part and a part per
# byte of payload. Both twins call 50-500 for every payload generated here (up to 13 KB); a
# loop in Python over a payload's bytes (or its hop id's characters) would call one or more
# per byte, and over its events quadratically.
CALLS_BASE = 2_000
CALLS_PER_BYTE = 0.25

json_leaf = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=30),
)
json_value = st.recursive(json_leaf, lambda inner: st.lists(inner, max_size=4)
                          | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)
odd_hop = (st.sampled_from(["1..2", "", ".", "1.", "a", "1" * 5000, "1." * 500 + "1", "\u0661", "-1", "0"])
           | st.text(max_size=20))
event_type = st.sampled_from(["in", "sm", "se", "si", "js", "eg", "zz", ""]) | json_value


@st.composite
def documents(draw) -> dict:
    """A valid-looking trace message with some fields replaced by odd values."""
    events = [ingress(), egress(t=300, kind=1, name="s2", hop="1"), egress(t=400)]
    events += [draw(st.dictionaries(st.sampled_from(["type", "ts", "kind", "hop", "name", "stream"]), json_value,
                                    max_size=4)) for _ in range(draw(st.integers(0, 3)))]
    for event in events[1:]:
        if draw(st.booleans()):
            event["type"] = draw(event_type)
    doc = message(*events, hops=draw(st.integers(0, 3)),
                  headers={"traceparent": [TRACEPARENT], "Nats-Trace-Hop": [draw(odd_hop)]})
    # Overwrite a few fields anywhere with values of the wrong type or size.
    for _ in range(draw(st.integers(0, 3))):
        section = draw(st.sampled_from(["server", "request", "events", "top"]))
        value = draw(json_value | st.integers(min_value=2**63, max_value=2**80))
        if section == "top":
            doc[draw(st.sampled_from(["server", "request", "hops", "events", "x"]))] = value
        elif section == "events" and isinstance(doc.get("events"), list) and doc["events"]:
            doc["events"][draw(st.integers(0, len(doc["events"]) - 1))] = value
        elif isinstance(doc.get(section), dict):
            doc[section][draw(st.sampled_from(["name", "id", "header", "msgsize", "ver", "tags", "x"]))] = value
    return doc


def _encode(doc: dict) -> bytes:
    # The standard library writes ints over 64 bits, which orjson refuses: we want those.
    return json.dumps(doc, separators=(",", ":")).encode()


@st.composite
def payloads(draw) -> RawTraceMessage:
    data = _encode(draw(documents()))
    encoding = draw(st.sampled_from([None, "identity", "gzip", "snappy", "br"]))
    if encoding == "gzip":
        data = gzip.compress(data)
    elif encoding == "snappy":
        data = bytes(cramjam.snappy.compress(data))
    damage = draw(st.sampled_from(["none", "truncate", "flip", "bad_utf8", "deep", "pad", "garbage"]))
    if damage == "truncate":
        data = data[: draw(st.integers(0, max(0, len(data) - 1)))]
    elif damage == "flip" and data:
        i = draw(st.integers(0, len(data) - 1))
        data = data[:i] + bytes([data[i] ^ draw(st.integers(1, 255))]) + data[i + 1:]
    elif damage == "bad_utf8":
        i = draw(st.integers(0, len(data)))
        data = data[:i] + draw(st.sampled_from([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\x80"])) + data[i:]
    elif damage == "deep":
        depth = draw(st.sampled_from([100, 1000, 3000]))
        data = data[:-1] + b',"deep":' + b"[" * depth + b"]" * depth + b"}"
    elif damage == "pad":
        data = b" " * (LIMITS.max_payload_bytes + 1) + data
    elif damage == "garbage":
        data = draw(st.binary(max_size=300))
    headers = {"Content-Encoding": [encoding]} if encoding else {}
    return RawTraceMessage(draw(st.sampled_from(["trace.a", "trace.b"])), headers, data)


def check(converter: Any, raw: RawTraceMessage) -> Converted | Rejected:
    # The work a payload makes, counted (not timed: a slow or loaded machine takes longer
    # for the same work).
    result, calls = python_calls(converter.convert, raw)
    assert calls <= CALLS_BASE + CALLS_PER_BYTE * len(raw.payload), f"{calls} calls: {raw.payload[:200]!r}"
    if isinstance(result, Converted):
        assert result.spans
        assert to_protobuf_bytes(result.spans)
        json.loads(to_otlp_json_line(result.spans))
    else:
        assert result.reason in REASONS, result
        assert result.detail
    return result


# One converter per implementation, kept across examples: its window fills as in a bridge.
CONVERTERS: dict[str, Any] = {}


def converter_of(core) -> Any:
    return CONVERTERS.setdefault(core.IMPLEMENTATION, core.Converter(limits=LIMITS, link=LinkSettings(capacity=1000)))


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(payloads())
def test_fuzzed_payloads_convert_or_are_rejected_with_a_reason(core, raw: RawTraceMessage) -> None:
    check(converter_of(core), raw)


@settings(max_examples=200, deadline=None)
@given(odd_hop, odd_hop)
def test_odd_hop_ids_still_give_spans(core, hop: str, upstream: str) -> None:
    doc = message(ingress(), egress(t=300, kind=1, name="s2", hop=hop),
                  headers={"traceparent": [TRACEPARENT], "Nats-Trace-Hop": [upstream]})
    result = check(converter_of(core), RawTraceMessage("trace.a", {}, _encode(doc)))
    assert isinstance(result, Converted) and len(result.spans) == 2


@pytest.mark.parametrize(("raw", "reason"), [
    # Regression (found by bench/fuzz_decode.py): an event whose "type" is a list or an object
    # raised TypeError (unhashable) out of `convert` instead of being kept aside as unknown.
    (RawTraceMessage("t", {}, _encode(message(ingress(), {"type": ["eg"], "ts": "x"}))), None),
    (RawTraceMessage("t", {}, _encode(message(ingress(), {"type": {"a": 1}})))  , None),
    (RawTraceMessage("t", {"Content-Encoding": ["gzip"]}, gzip.compress(b"{}", mtime=0)[:-6]), "bad_compression"),
    (RawTraceMessage("t", {"Content-Encoding": ["gzip"]},
                     gzip.compress(b" " * (LIMITS.max_decompressed_bytes + 1), mtime=0)), "too_large"),
    (RawTraceMessage("t", {"Content-Encoding": ["snappy"]}, b"\xff\x06\x00\x00sNaPpY\x01garbage"), "bad_compression"),
    (RawTraceMessage("t", {}, _encode(message(ingress(), *[egress()] * LIMITS.max_events))), "too_large"),
    (RawTraceMessage("t", {}, b'{"server":{"name":"\xff"}}'), "bad_json"),
    (RawTraceMessage("t", {}, _encode(message(ingress(msgsize=1)) | {"hops": 2**64})), "bad_schema"),
])
def test_table_of_hostile_inputs(core, raw: RawTraceMessage, reason: str | None) -> None:
    result = check(core.Converter(limits=LIMITS), raw)
    if reason is None:
        assert isinstance(result, Converted)
        assert any(i.startswith("unknown_event:") for i in result.issues), result.issues
    else:
        assert isinstance(result, Rejected) and result.reason == reason


def test_size_limits_come_from_the_settings() -> None:
    """`limits:` in the bridge settings reaches the bridge's Converter (also via env vars)."""
    from nats_otel.bridge.processor import Processor

    settings = load_settings(env={"NATS_OTEL_LIMITS__MAX_PAYLOAD_BYTES": "2048"}, overrides={
        "sources": [{"subjects": ["trace.a"]}], "output": "/dev/null", "export_otlp": False,
        "limits": {"max_events": 3}})
    processor = Processor(settings, [])
    assert processor.converter.limits == DecodeLimits(max_payload_bytes=2048, max_events=3)
    big = RawTraceMessage("t", {}, b" " * 2049 + _encode(message(ingress())))
    many = RawTraceMessage("t", {}, _encode(message(ingress(), egress(), egress(), egress())))
    fine = RawTraceMessage("t", {}, _encode(message(ingress(), egress(), egress())))
    outcome = processor.process([big, many, fine], None)
    assert [getattr(r, "reason", "ok") for r in outcome.results] == ["too_large", "too_large", "ok"]
    processor.close()
