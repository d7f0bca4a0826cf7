"""The compiled kernel's `prepare` (`_kernel.prepare`: `_stage_prepare.pxi`) against the
pure reference (`pipeline.python_prepare`): an equal `Prepared` (message, trace context,
identity, arrival, issues, size), or the same error with the same reason and text, on the
whole corpus, on fuzzed payloads, and on the header variants that decide which path a
message takes (encodings, name case, repeated names, broken or missing traceparents,
ad-hoc destinations, hop headers); which messages the kernel hands to the reference
(`handed_to_reference`); and the decoding hooks of the leaf of primitives against the
pure ones. As in test_twins.py, the compiled modules come from the `kernel` and
`primitives` fixtures (skipped under NATS_OTEL_NO_EXTENSIONS=1) and are compared with the
reference in one process.
"""

from __future__ import annotations

import gzip

import cramjam
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nats_otel.core import pipeline
from nats_otel.core.decode import DecodeError, DecodeLimits, RawTraceMessage
from nats_otel.core.shapes import shape_digest
from tests.core import factories as f
from tests.core.test_fuzz_decode import LIMITS, payloads


def outcome(prepare, raw: RawTraceMessage, limits: DecodeLimits = DecodeLimits()):
    try:
        return prepare(raw, limits)
    except DecodeError as exc:
        return type(exc), exc.reason, exc.detail
    except Exception as exc:  # noqa: BLE001 - compared, not hidden: a raw no receiver builds (a name not a str)
        return type(exc), str(exc)


def handed(kernel, prepare, *args) -> tuple[object, int]:
    """`outcome(prepare, *args)`, and how many messages the kernel's prepare handed to the
    reference meanwhile."""
    before = kernel.handed_to_reference()["prepare"]
    result = outcome(prepare, *args)
    return result, kernel.handed_to_reference()["prepare"] - before


def test_the_corpus_prepares_alike(kernel, corpus_raws):
    prepared = 0
    before = kernel.handed_to_reference()["prepare"]
    for raw in corpus_raws:
        ours = outcome(kernel.prepare, raw)
        assert ours == outcome(pipeline.python_prepare, raw)
        prepared += isinstance(ours, pipeline.Prepared)
    assert prepared > 100
    assert kernel.handed_to_reference()["prepare"] == before  # the common case: all prepared by the kernel
    assert kernel.prepare(corpus_raws[0]) == pipeline.python_prepare(corpus_raws[0])  # default limits


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(raw=payloads())
def test_fuzzed_payloads_prepare_alike(kernel, raw):
    assert outcome(kernel.prepare, raw, LIMITS) == outcome(pipeline.python_prepare, raw, LIMITS)


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
def test_header_variants_prepare_alike(kernel, headers, encoding, kind, subject, cid, encoding_name):
    doc = f.message(f.ingress(kind=kind, cid=cid), f.egress(kind=1, hop="h9", name="n2"), headers=headers)
    data = orjson.dumps(doc) if cid < 2**63 else _dumps(doc)
    if encoding and encoding.strip().lower() == "gzip":
        data = gzip.compress(data)
    elif encoding == "snappy":
        data = bytes(cramjam.snappy.compress(data))
    raw = RawTraceMessage(subject, {encoding_name: [encoding]} if encoding is not None else {}, data)
    assert outcome(kernel.prepare, raw) == outcome(pipeline.python_prepare, raw)


def _dumps(doc) -> bytes:
    import json  # orjson refuses ints over 63 bits: the server's uint64s need the standard library

    return json.dumps(doc, separators=(",", ":")).encode()


# --- the compiled path's own work: one pass over the headers, the identity in C ---------------
# Header names in any case (ASCII or not: "İ" lowers to two characters), repeated spellings,
# empty value lists (first_values skips them, body_size does not), hop headers of any size.
_NAMES = st.sampled_from(["traceparent", "TraceParent", "TRACEPARENT", "tracestate", "TraceState", "Nats-Trace-Hop",
                          "nats-trace-hop", "NATS-TRACE-HOP", "Nats-Trace-Dest", "nats-trace-dest", "X-İd", "x-i̇d",
                          "Accept-Encoding", "Content-Encoding", "é"])
_VALUES = st.sampled_from([TP, TP.upper(), "00-bad", "h1", "trace disabled", "trace.x", "", "é" * 3, "k=v"])
# Every count of decimal digits, at its edges (the identity's digits are made two at a time).
_U64 = st.sampled_from([0, 1, 5, 9, 10, 11, 99, 100, 101, 999, 1000, 10**9 - 1, 10**9, 2**32, 10**18 - 1, 10**18,
                        2**63, 10**19 - 1, 10**19, 2**64 - 1, 2**64])
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
def test_headers_ids_and_uint64_edges_prepare_alike(kernel, raw):
    assert outcome(kernel.prepare, raw) == outcome(pipeline.python_prepare, raw)


def test_the_edges_do_reach_the_compiled_path(kernel):
    # The cases above must not all be decided by the reference: these are prepared in C.
    doc = f.message(f.ingress(kind=1, cid=2**64 - 1), headers={"Nats-Trace-Hop": ["h1", "h2"], "X-İd": ["é"],
                                                                 "TraceParent": [TP], "traceparent": ["00-bad"]},
                    server_id="é-id")
    raw = RawTraceMessage("trace.a", {}, _dumps(doc))
    compressed = RawTraceMessage("trace.a", {"content-ENCODING": ["Gzip "]}, gzip.compress(_dumps(doc)))
    adhoc = RawTraceMessage(None, {}, orjson.dumps(f.message(f.ingress(), headers={"Nats-Trace-Dest": ["d"],
                                                                                     "traceparent": ["00-x"]})))
    (prepared, by_reference), (unpacked, by_reference_unpacked), (correlated, by_reference_correlated) = (
        handed(kernel, kernel.prepare, one) for one in (raw, compressed, adhoc))
    assert (by_reference, by_reference_unpacked, by_reference_correlated) == (0, 0, 0)  # none handed over
    assert isinstance(prepared, pipeline.Prepared) and isinstance(unpacked, pipeline.Prepared)
    assert isinstance(correlated, pipeline.Prepared)
    assert prepared == pipeline.python_prepare(raw)
    assert unpacked == pipeline.python_prepare(compressed) and unpacked.msg == prepared.msg
    assert correlated == pipeline.python_prepare(adhoc) and correlated.issues == pipeline._BAD_TRACEPARENT
    assert [prepared.msg.header(name) for name in ("NATS-TRACE-HOP", "x-i̇d", "traceparent", "tracestate")] == [
        "h1", "é", TP, None]
    # The hop headers taken out of the size, the message's own header (X-İd) as a digest.
    assert prepared.size == shape_digest(100 - 2 * (len("Nats-Trace-Hop") + 2 + 4), [("X-İd".lower(), ["é"])])
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
def test_odd_raws_prepare_alike(kernel, raw):
    assert outcome(kernel.prepare, raw) == outcome(pipeline.python_prepare, raw)
    assert outcome(kernel.prepare, raw, DecodeLimits(max_events=1)) == outcome(pipeline.python_prepare, raw,
                                                                               DecodeLimits(max_events=1))


@pytest.mark.parametrize("limit", [-5, 0, "exact", "one under", 2**63, 2**70, 1e9])
def test_the_payload_limit_applies_alike_at_its_edges(kernel, limit):
    # The kernel compares a payload's size with an int limit in C (clamped to a size), and
    # with anything else as Python does: the same message over or within the limit.
    raw = RawTraceMessage("trace.a", {}, orjson.dumps(f.message(f.ingress(), f.egress())))
    size = len(raw.payload)
    value = size if limit == "exact" else size - 1 if limit == "one under" else limit
    limits = DecodeLimits(max_payload_bytes=value)  # type: ignore[arg-type]  # a float, as a user may write
    ours = outcome(kernel.prepare, raw, limits)
    assert ours == outcome(pipeline.python_prepare, raw, limits)
    within = value >= size
    assert isinstance(ours, pipeline.Prepared) == within, ours
    kernel.prepare(raw, DecodeLimits())  # the next limits read again, not these kept


# Raws the kernel does not take: each is handed whole to the reference (counted once).
HANDED_RAWS = [
    RawTraceMessage("trace.a", {"Content-Encoding": ["gzip"]}, b"not gzip"),  # decompress refuses it
    RawTraceMessage("trace.a", {1: ["x"]}, orjson.dumps(f.message(f.ingress()))),  # type: ignore[dict-item]
    RawTraceMessage("trace.a", {}, bytearray(orjson.dumps(f.message(f.ingress())))),  # type: ignore[arg-type]
    RawTraceMessage("trace.a", {}, b"{not json"),  # the fast decode refuses it
    "not a raw message",  # type: ignore[list-item]
]


@pytest.mark.parametrize("raw", HANDED_RAWS)
def test_what_the_kernel_does_not_take_is_the_references(kernel, raw):
    assert handed(kernel, kernel.prepare, raw, DecodeLimits()) == (outcome(pipeline.python_prepare, raw), 1)


def _checked(hook, record) -> object:
    """What a hook leaves in `record` (the fields it sets), or its error's text."""
    try:
        hook(record)
    except ValueError as exc:
        return str(exc)
    return {name: getattr(record, name) for name in record.__struct_fields__}


def test_the_decode_hooks_check_alike(primitives):
    from types import SimpleNamespace

    import msgspec

    from nats_otel.core import model
    from nats_otel.core.model import check_uint64

    for value in (0, 2**64 - 1, 2**64, 2**70):
        for hook, name in ((primitives.request_post_init, "msgsize"), (primitives.document_post_init, "hops")):
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

    # The events' and the server's hooks: times as `model._timestamp` reads them (or its
    # error), their texts not kept, numbers as `check_uint64` checks them. The server's
    # `time` is neither read nor checked: left as it came.
    class Stamped(msgspec.Struct):
        ts: str
        cid: int = 0
        seq: int = 0
        time: str | None = None
        ts_ns: int = -1

    def expected(ts: str, cid: int, seq: int, time: str | None, fields: tuple[str, ...]) -> object:
        record = Stamped(ts, cid, seq, time)
        try:
            for name in fields:
                if name == "ts":
                    record.ts_ns, record.ts = model._timestamp(ts), ""
                elif name in ("cid", "seq"):
                    check_uint64(name, getattr(record, name))
        except ValueError as exc:
            return str(exc)
        return {name: getattr(record, name) for name in record.__struct_fields__}

    hooks = [(primitives.event_post_init, ("ts",)), (primitives.connection_post_init, ("cid", "ts")),
             (primitives.server_post_init, ("seq",))]
    stamps = ["2026-11-22T02:16:30.123456789Z", "1969-12-31T23:59:59Z", "2554-07-21T23:34:33.709551616Z", "nope"]
    for ts in stamps:
        for number in (5, 2**64):
            for time in (None, *stamps):
                for hook, fields in hooks:
                    assert _checked(hook, Stamped(ts, number, number, time)) == expected(
                        ts, number, number, time, fields), (hook, ts, number, time)


# --- the compiled path's look-asides: a kind's bit, a lowered name kept by its name object ---


@pytest.mark.parametrize("kind", [*range(70), 2**62, 2**63])
def test_every_connection_kind_prepares_alike(kernel, kind):
    # The kernel tests a forwarding kind as a bit below 64 and asks the set above it: an
    # arrival (a hop to link) for exactly the kinds `FORWARDING_KINDS` names.
    doc = f.message(f.ingress(kind=kind), headers={"traceparent": [TP], "Nats-Trace-Hop": ["h1"]})
    raw = RawTraceMessage("trace.a", {}, _dumps(doc))
    ours = outcome(kernel.prepare, raw)
    assert ours == outcome(pipeline.python_prepare, raw)
    if isinstance(ours, pipeline.Prepared):
        assert (ours.arrival is not None) == (kind in {1, 2, 4})


def test_many_capitalized_names_prepare_alike_again_and_again(kernel):
    # More capitalized names than the kernel keeps lowered (64 slots), each met several times
    # in an order that replaces slots between meetings, and names too long for the parse's
    # name cache (a new object each message): every message prepared as the reference does.
    names = [f"X-Hdr-{i}" for i in range(300)] + [f"X-Long-{'A' * 70}-{i}" for i in range(3)]
    for round_number in range(3):
        for at, name in enumerate(names[round_number::2] + names[::-3]):
            doc = f.message(f.ingress(kind=1), headers={"traceparent": [TP], name: [f"v{at}"],
                                                        "Nats-Trace-Hop": ["h1"]})
            raw = RawTraceMessage("trace.a", {}, orjson.dumps(doc))
            ours = outcome(kernel.prepare, raw)
            assert isinstance(ours, pipeline.Prepared)
            assert ours == outcome(pipeline.python_prepare, raw)
            assert ours.msg.header(name.lower()) == f"v{at}"
