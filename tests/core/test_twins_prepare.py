"""The compiled `prepare` (`_prepare.pyx`) against the pure reference
(`pipeline.python_prepare`): an equal `Prepared` (message, trace context, identity,
arrival, issues, size), or the same error with the same reason and text, on the whole
corpus, on fuzzed payloads, and on the header variants that decide which path a message
takes (encodings, name case, repeated names, broken or missing traceparents, ad-hoc
destinations, hop headers). As in test_twins.py the twin is imported directly, whichever
core the process chose; both CI runs of tests/core run these.
"""

from __future__ import annotations

import gzip
from types import ModuleType

import cramjam
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nats_otel.core import accel, choice, pipeline
from nats_otel.core.decode import DecodeError, DecodeLimits, RawTraceMessage
from tests.core import factories as f
from tests.core.test_fuzz_decode import LIMITS, payloads
from tests.core.test_twins import _twin


@pytest.fixture(scope="module")
def twin() -> ModuleType:
    module = _twin("_prepare")
    pipeline.configure_prepare(module)  # as pipeline.py does (not done when NATS_OTEL_NO_EXTENSIONS is set)
    return module


def outcome(prepare, raw: RawTraceMessage, limits: DecodeLimits = DecodeLimits()):
    try:
        return prepare(raw, limits)
    except DecodeError as exc:
        return type(exc), exc.reason, exc.detail
    except Exception as exc:  # noqa: BLE001 - compared, not hidden: a raw no receiver builds (a name not a str)
        return type(exc), str(exc)


def test_the_process_runs_the_prepare_it_was_asked_for():
    assert (pipeline.prepare is pipeline.python_prepare) == accel.NO_EXTENSIONS, choice.unavailable()


def test_the_corpus_prepares_alike(twin, corpus_raws):
    prepared = 0
    for raw in corpus_raws:
        ours = outcome(twin.prepare, raw)
        assert ours == outcome(pipeline.python_prepare, raw)
        prepared += isinstance(ours, pipeline.Prepared)
    assert prepared > 100
    assert twin.prepare(corpus_raws[0]) == pipeline.python_prepare(corpus_raws[0])  # default limits


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(raw=payloads())
def test_fuzzed_payloads_prepare_alike(twin, raw):
    assert outcome(twin.prepare, raw, LIMITS) == outcome(pipeline.python_prepare, raw, LIMITS)


TP = f.TRACEPARENT
HEADERS = [
    {"traceparent": [TP]}, {"TraceParent": [TP], "traceparent": ["00-bad"]}, {"traceparent": [TP.upper()]},
    {"traceparent": ["00-bad"], "Nats-Trace-Dest": ["trace.x"]}, {"traceparent": ["00-bad"]},
    {"Nats-Trace-Dest": ["trace.x"]}, {"Nats-Trace-Dest": ["trace disabled"]}, {},
    {"traceparent": [], "Traceparent": [TP]}, {"traceparent": [TP, "other"], "tracestate": ["k=v"]},
    {"traceparent": ["ff-" + TP[3:]]}, {"traceparent": [TP[:-2] + "00"]},
    {"traceparent": [TP], "Nats-Trace-Hop": ["h1"]}, {"traceparent": [TP], "nats-trace-hop": ["h1", "h2"]},
]
ENCODINGS = [None, "identity", "Identity ", "", "gzip", "GZIP", "snappy", "br"]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(headers=st.sampled_from(HEADERS), encoding=st.sampled_from(ENCODINGS),
       kind=st.sampled_from([0, 1, 2, 4, 6]), subject=st.sampled_from(["trace.a", None]),
       cid=st.sampled_from([5, 2**63, 2**64 - 1]),
       encoding_name=st.sampled_from(["Content-Encoding", "content-encoding"]))
def test_header_variants_prepare_alike(twin, headers, encoding, kind, subject, cid, encoding_name):
    doc = f.message(f.ingress(kind=kind, cid=cid), f.egress(kind=1, hop="h9", name="n2"), headers=headers)
    data = orjson.dumps(doc) if cid < 2**63 else _dumps(doc)
    if encoding and encoding.strip().lower() == "gzip":
        data = gzip.compress(data)
    elif encoding == "snappy":
        data = bytes(cramjam.snappy.compress(data))
    raw = RawTraceMessage(subject, {encoding_name: [encoding]} if encoding is not None else {}, data)
    assert outcome(twin.prepare, raw) == outcome(pipeline.python_prepare, raw)


def _dumps(doc) -> bytes:
    import json  # orjson refuses ints over 63 bits: the server's uint64s need the standard library

    return json.dumps(doc, separators=(",", ":")).encode()


# --- the compiled path's own work: one pass over the headers, the identity in C ---------------
# Header names in any case (ASCII or not: "İ" lowers to two characters), repeated spellings,
# empty value lists (first_values skips them, body_size does not), hop headers of any size.
_NAMES = st.sampled_from(["traceparent", "TraceParent", "TRACEPARENT", "tracestate", "Nats-Trace-Hop",
                          "nats-trace-hop", "NATS-TRACE-HOP", "Nats-Trace-Dest", "X-İd", "x-i̇d", "Accept-Encoding",
                          "Content-Encoding", "é"])
_VALUES = st.sampled_from([TP, TP.upper(), "00-bad", "h1", "trace disabled", "trace.x", "", "é" * 3, "k=v"])
_U64 = st.sampled_from([0, 1, 5, 2**32, 2**63, 2**64 - 1, 2**64])
_STAMPS = st.sampled_from(["2026-11-22T02:16:30.000000100Z", "1970-01-01T00:00:00Z", "2554-07-21T23:34:33.709551615Z",
                           "2554-07-21T23:34:33.709551616Z", "2026-11-22T02:16:30+01:00", "1969-12-31T23:59:59Z"])


@st.composite
def numbered_messages(draw) -> RawTraceMessage:
    """Valid-looking trace messages whose headers, server id and numbers vary at the edges."""
    import json  # orjson refuses ints over 63 bits and lone surrogates

    headers = draw(st.dictionaries(_NAMES, st.lists(_VALUES, max_size=3), max_size=5))
    first = {**f.ingress(kind=draw(st.sampled_from([0, 1, 2, 4])), cid=draw(_U64)), "ts": draw(_STAMPS)}
    doc = f.message(first, f.egress(kind=1, hop="h9", name="n2", cid=draw(_U64)), headers=headers,
                    server_id=draw(st.sampled_from(["NDJ", "é-id", "\ud800", "", "x" * 60])))
    doc["request"]["msgsize"] = draw(_U64)
    doc["hops"] = draw(_U64)
    return RawTraceMessage(draw(st.sampled_from(["trace.a", None])), {}, json.dumps(doc).encode())


@settings(max_examples=800, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=numbered_messages())
def test_headers_ids_and_uint64_edges_prepare_alike(twin, raw):
    assert outcome(twin.prepare, raw) == outcome(pipeline.python_prepare, raw)


def _refuse(raw, limits):
    raise AssertionError("handed to the reference")


def test_the_edges_do_reach_the_compiled_path(twin):
    # The cases above must not all be decided by the reference: these are prepared in C.
    doc = f.message(f.ingress(kind=1, cid=2**64 - 1), headers={"Nats-Trace-Hop": ["h1", "h2"], "X-İd": ["é"],
                                                                 "TraceParent": [TP], "traceparent": ["00-bad"]},
                    server_id="é-id")
    raw = RawTraceMessage("trace.a", {}, _dumps(doc))
    compressed = RawTraceMessage("trace.a", {"content-ENCODING": ["Gzip "]}, gzip.compress(_dumps(doc)))
    adhoc = RawTraceMessage(None, {}, orjson.dumps(f.message(f.ingress(), headers={"Nats-Trace-Dest": ["d"],
                                                                                     "traceparent": ["00-x"]})))
    pipeline.configure_prepare(twin, reference=_refuse)
    try:
        prepared, unpacked, correlated = twin.prepare(raw), twin.prepare(compressed), twin.prepare(adhoc)
    finally:
        pipeline.configure_prepare(twin)
    assert prepared == pipeline.python_prepare(raw)
    assert unpacked == pipeline.python_prepare(compressed) and unpacked.msg == prepared.msg
    assert correlated == pipeline.python_prepare(adhoc) and correlated.issues == pipeline._BAD_TRACEPARENT
    assert prepared.msg.header_index == {"nats-trace-hop": "h1", "x-i̇d": "é", "traceparent": TP}
    assert prepared.size == 100 - 2 * (len("Nats-Trace-Hop") + 2 + 4)
    assert prepared.ident == b"\x00\x00\x00\x05" + "é-id".encode() + b"\x00\x00\x00\x13" \
        + str(prepared.msg.ingress.ts_ns).encode() + b"\x00\x00\x00\x14" + str(2**64 - 1).encode()
    assert prepared.arrival is not None and prepared.arrival[0][1] == "h1"


ODD_RAWS = [
    RawTraceMessage("trace.a", {"Content-Encoding": ["gzip"]}, b"not gzip"),  # corrupt: the reference's error
    RawTraceMessage("trace.a", {"content-encoding": []}, orjson.dumps(f.message(f.ingress()))),  # no value
    RawTraceMessage("trace.a", {}, b" " * (DecodeLimits().max_payload_bytes + 1)),  # over the limit
    RawTraceMessage("trace.a", {1: ["x"]}, orjson.dumps(f.message(f.ingress()))),  # type: ignore[dict-item]
    RawTraceMessage("trace.a", {}, bytearray(orjson.dumps(f.message(f.ingress())))),  # type: ignore[arg-type]
    RawTraceMessage(None, {}, orjson.dumps(f.message(f.ingress(), headers={"Nats-Trace-Dest": ["d"]}))),
    RawTraceMessage(None, {}, orjson.dumps(f.message(f.ingress(), headers={"traceparent": ["00-bad"]}))),
    RawTraceMessage(None, {}, orjson.dumps(f.message(f.ingress(), f.ingress()))),  # a second ingress
]


@pytest.mark.parametrize("raw", ODD_RAWS)
def test_odd_raws_prepare_alike(twin, raw):
    assert outcome(twin.prepare, raw) == outcome(pipeline.python_prepare, raw)
    assert outcome(twin.prepare, raw, DecodeLimits(max_events=1)) == outcome(pipeline.python_prepare, raw,
                                                                             DecodeLimits(max_events=1))


def test_the_decode_and_context_hooks_check_alike():
    from types import SimpleNamespace

    from nats_otel.core import ids, model
    from nats_otel.core.model import check_uint64

    hooks, ids_twin = _twin("_model"), _twin("_ids")
    hooks.configure(model.parse_rfc3339_ns, model._timestamp, check_uint64)  # as model.py does
    for value in (0, 2**64 - 1, 2**64, 2**70):
        for hook, name in ((hooks.request_post_init, "msgsize"), (hooks.document_post_init, "hops")):
            expected = None
            try:
                check_uint64(name, value)
            except ValueError as exc:
                expected = str(exc)
            try:
                hook(SimpleNamespace(**{name: value}))
                got = None
            except ValueError as exc:
                got = str(exc)
            assert got == expected
    ctx = ids.TraceContext(b"\x01" * 16, b"\x02" * 8, id_fields=b"given")
    ids_twin.context_post_init(ctx)
    assert ctx.id_fields == b"given"
    ctx = ids.TraceContext(b"\x01" * 16, b"\x02" * 8)
    assert ctx.id_fields == ids.python_context_fields(b"\x01" * 16, b"\x02" * 8)
