"""The compiled kernel (`nats_otel/core/_kernel.pyx`) and the leaf of primitives
(`_primitives.pyx`) against the pure-Python reference: the same bytes (or the same
exception) on the whole corpus, on generated span records and timestamps, and on fuzzed
trace messages. The golden files test the reference; these tests tie the compiled core
to it.

The compiled modules come from the `kernel` and `primitives` fixtures (tests/conftest.py),
the reference from the pure modules' own names: both are compared in one process. Under
NATS_OTEL_NO_EXTENSIONS=1 those tests skip; the process's own choice (`engine`) and the
whole path in a child process running the other core are tested in both runs.
"""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nats_otel.core import accel, encode, engine, otlp_wire, reference, span_bytes, timestamps
from nats_otel.core.decode import RawTraceMessage
from nats_otel.core.linking import LinkSettings
from nats_otel.core.pipeline import Converted, Converter, convert_batch
from nats_otel.core.records import Resource, SpanRecord
from tests.core.test_fuzz_decode import LIMITS, payloads

SCOPE = encode._SCOPE


def outcome(function, *args):
    """The result, or the exception's type and text: both twins must agree on either."""
    try:
        return function(*args)
    except Exception as exc:  # noqa: BLE001 - compared, not hidden
        return type(exc), str(exc)


def handed(kernel: ModuleType, stage: str, call, *args):
    """`outcome(call, *args)`, and how many messages (batches, for "request") the kernel
    handed to the reference at `stage` meanwhile."""
    before = kernel.handed_to_reference()[stage]
    result = outcome(call, *args)
    return result, kernel.handed_to_reference()[stage] - before


def test_the_process_runs_the_core_it_was_asked_for():
    from nats_otel.core import decode, linking, model, network, pipeline

    # The pure modules never choose: their names are the reference's, in both runs.
    assert (pipeline.Converter, pipeline.Linker, linking.LinkIndex) == (
        pipeline.PythonConverter, pipeline.PythonLinker, linking.PythonLinkIndex)
    assert (pipeline.prepare, pipeline.finish) == (pipeline.python_prepare, pipeline.python_finish)
    assert network.network_sample is network.python_network_sample
    # `reference` gathers exactly those.
    assert (reference.Converter, reference.Linker, reference.LinkIndex) == (
        pipeline.PythonConverter, pipeline.PythonLinker, linking.PythonLinkIndex)
    assert (reference.prepare, reference.finish) == (pipeline.python_prepare, pipeline.python_finish)
    assert otlp_wire.encode_request is otlp_wire.python_encode_request
    assert (span_bytes.map_encode, span_bytes.encode_request) == (span_bytes.python_map_encode,
                                                                  span_bytes.python_encode_request)
    assert timestamps.parse_rfc3339_ns is timestamps.python_parse_rfc3339_ns
    # `engine` chooses the kernel unless forbidden: every name of the one it runs.
    expected = "python" if accel.NO_EXTENSIONS else "compiled"
    assert engine.implementation() == expected, engine.unavailable()
    assert engine.IMPLEMENTATIONS["python"] is reference
    assert sorted(engine.IMPLEMENTATIONS) == sorted({"python", expected})
    running = engine.IMPLEMENTATIONS[expected]
    assert expected == engine.IMPLEMENTATION == running.IMPLEMENTATION
    for name in reference.__all__:
        assert getattr(engine, name) is getattr(running, name), name
    # The decoding hooks: the leaf's when built and allowed, else the pure modules' own.
    hooks = {name: vars(record)["__post_init__"] for name, record in (
        ("connection_post_init", model.Ingress), ("server_post_init", model.ServerReport),
        ("request_post_init", decode._Request), ("document_post_init", decode._Document))}
    leaf = accel.compiled("_primitives")
    assert (leaf is None) == accel.NO_EXTENSIONS, accel.refused()
    if leaf is None:
        assert {name: hook.__module__ for name, hook in hooks.items()} == {
            "connection_post_init": "nats_otel.core.model", "server_post_init": "nats_otel.core.model",
            "request_post_init": "nats_otel.core.decode", "document_post_init": "nats_otel.core.decode"}
    else:
        assert hooks == {name: getattr(leaf, name) for name in hooks}
        assert engine.unavailable() == {}


def test_the_corpus_encodes_to_the_same_bytes(kernel, corpus_raws):
    results = convert_batch(corpus_raws)
    spans = [s for r in results if isinstance(r, Converted) for s in r.spans]
    assert len(spans) > 50
    for size in (1, 7, 64, len(spans)):
        for start in range(0, len(spans), size):
            batch = spans[start : start + size]
            assert kernel.encode_spans(batch, SCOPE) == otlp_wire.python_encode_request(batch, SCOPE)
    for result in results:
        if isinstance(result, Converted):
            assert kernel.encode_spans(result.spans, SCOPE) == otlp_wire.python_encode_request(result.spans, SCOPE)


def test_the_corpus_encoded_spans_make_the_same_request(kernel, corpus_raws):
    """The bridge's request of spans mapped straight into protobuf: the same bytes on both
    twins, and the bytes the span records of the same messages encode to (the contract)."""
    converter = Converter()
    converter.observe_many(corpus_raws, 0.0)
    encoded = converter.convert_many(corpus_raws, 0.0, True)
    records = convert_batch(corpus_raws)
    pairs = [(e.encoded, r.spans) for e, r in zip(encoded, records, strict=True)
             if isinstance(e, Converted) and e.encoded is not None and isinstance(r, Converted)]
    assert len(pairs) > 20 and len({item.resource for item, _ in pairs}) > 3
    for size in (1, 5, 64, len(pairs)):
        for start in range(0, len(pairs), size):
            items = [item for item, _ in pairs[start : start + size]]
            request, to_reference = handed(kernel, "request", kernel.encode_request, items)
            assert request == span_bytes.python_encode_request(items)
            assert to_reference == 0  # written by the kernel itself
            assert request == encode.to_protobuf_bytes([s for _, spans in pairs[start : start + size] for s in spans])


_resources = [Resource((("service.name", "nats"), ("nats.server.name", f"n{i}"))) for i in range(20)]


@st.composite
def encoded_items(draw) -> list:
    """EncodedSpans of up to 20 resources (past the compiled twin's identity scan), some as
    equal but distinct objects (grouped together by equality), with any data."""
    items = []
    for _ in range(draw(st.integers(0, 40))):
        resource = draw(st.sampled_from(_resources))
        if draw(st.booleans()):
            resource = Resource(resource.attributes)  # equal, not the same object
        items.append(span_bytes.EncodedSpans(resource, draw(st.binary(max_size=300)), 1))
    return items


@settings(max_examples=300, deadline=None)
@given(encoded_items())
def test_generated_encoded_spans_make_the_same_request(kernel, items):
    assert kernel.encode_request(items) == span_bytes.python_encode_request(items)


def test_odd_encoded_items_go_to_the_reference(kernel):
    """Not a list, an item of another type, data that is not bytes: handed to the reference
    (counted), so its bytes, or its error, on both. The rest is written by the kernel."""
    item = span_bytes.EncodedSpans(_resources[0], b"\x12\x00", 1)
    handed_over = [
        (item, item),  # a tuple of items, not a list
        [item, (_resources[1], b"\x12\x00", 1)],  # a plain tuple: no .resource in the reference
        [item, span_bytes.EncodedSpans(_resources[1], bytearray(b"\x12\x00"), 1)],
        [item, span_bytes.EncodedSpans(_resources[1], "text", 1)],
    ]
    kept = [
        [span_bytes.EncodedSpans(["unhashable"], b"", 0)],  # the kernel raises the reference's error itself
        [],
        [item, span_bytes.EncodedSpans(Resource(_resources[0].attributes), b"\x12\x00", 1)],
    ]
    for items, count in [(items, 1) for items in handed_over] + [(items, 0) for items in kept]:
        assert handed(kernel, "request", kernel.encode_request, items) == (
            outcome(span_bytes.python_encode_request, items), count), items


# Each key carries values of one type: the pair caches of both twins key on (key, value),
# where 1, 1.0 and True are equal, so mixed types under one key would make either twin's
# output depend on what it encoded before (the mapping never mixes them).
_text = st.text(max_size=12)  # includes lone surrogates: written with surrogatepass
_wide_int = st.integers(min_value=-(2**70), max_value=2**70)
_values = st.one_of(
    st.tuples(st.just("b"), st.booleans()),
    st.tuples(st.just("i"), _wide_int | st.integers(-300, 300)),
    st.tuples(st.just("f"), st.floats()),
    st.tuples(st.just("s"), _text),
    st.tuples(st.just("a"), st.recursive(st.tuples(_text), lambda inner: st.tuples(_text, inner), max_leaves=5)),
    st.tuples(st.just("h"), st.tuples(_text)),
)


@st.composite
def attributes(draw) -> tuple:
    out = []
    for kind, value in draw(st.lists(_values, max_size=6)):
        name = draw(st.sampled_from(["x", "messaging.system", "nats.account", "é"]))
        prefix = otlp_wire._UNCACHED_PREFIX if kind == "h" else f"{kind}."
        out.append((prefix + name, value))
    return tuple(out)


_u64 = st.integers(min_value=0, max_value=2**64 - 1)


@st.composite
def span_records(draw) -> SpanRecord:
    resource = Resource(draw(attributes()) or (("service.name", "nats-server"),))
    return SpanRecord(
        draw(st.binary(min_size=16, max_size=16) | st.binary(max_size=20)),
        draw(st.binary(min_size=8, max_size=8) | st.binary(max_size=9)),
        draw(st.sampled_from([b""]) | st.binary(min_size=8, max_size=8) | st.binary(max_size=300)),
        draw(_text | st.text(min_size=100, max_size=200)),
        draw(st.integers(0, 5) | _wide_int),
        draw(_u64 | st.integers(min_value=-5, max_value=2**65)),
        draw(_u64),
        resource,
        draw(attributes()),
        draw(st.sampled_from([0, 1, 2]) | _wide_int),
        draw(st.sampled_from(["", "boom"]) | _text),
        draw(st.sampled_from(["", "k=v"]) | _text),
    )


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(span_records(), max_size=6))
def test_generated_spans_encode_to_the_same_bytes_or_fail_alike(kernel, spans):
    compiled = outcome(kernel.encode_spans, spans, SCOPE)
    python = outcome(otlp_wire.python_encode_request, spans, SCOPE)
    if isinstance(python, tuple) and isinstance(compiled, tuple):
        # Both refuse. An integer outside int64 is refused by both, but with another error
        # (struct.error in Python, ValueError compiled): the mapping never makes one.
        return
    assert compiled == python


def test_copied_headers_are_not_cached_by_the_compiled_twin(kernel):
    resource = Resource((("service.name", "x"),))
    spans = [SpanRecord(b"\x01" * 16, i.to_bytes(8, "big"), b"", "s", 5, 1, 2, resource,
                        (("messaging.system", "nats"),
                         (otlp_wire._UNCACHED_PREFIX + "traceparent", (f"00-{i:032x}-{i:016x}-01",))))
             for i in range(1, 200)]
    kernel.clear_caches()
    assert kernel.encode_spans(spans, SCOPE) == otlp_wire.python_encode_request(spans, SCOPE)
    assert kernel.cached_pairs(9) == [("messaging.system", "nats")]


FUZZ_CONVERTER = Converter(limits=LIMITS, link=LinkSettings(capacity=1000))


@settings(max_examples=800, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(payloads())
def test_fuzzed_trace_messages_encode_to_the_same_bytes(kernel, raw: RawTraceMessage):
    result = FUZZ_CONVERTER.convert(raw)
    if isinstance(result, Converted):
        assert kernel.encode_spans(result.spans, SCOPE) == otlp_wire.python_encode_request(result.spans, SCOPE)


def _bench_fuzzer() -> ModuleType:
    path = Path(__file__).resolve().parents[2] / "bench" / "fuzz_decode.py"
    spec = importlib.util.spec_from_file_location("bench_fuzz_decode", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_bench_fuzzers_messages_encode_to_the_same_bytes(kernel):
    fuzz = _bench_fuzzer()
    rnd = random.Random(17)
    converter = Converter(limits=fuzz.LIMITS)
    converted = 0
    for _ in range(1500):
        _, raw = fuzz.generate(rnd)
        result = converter.convert(raw)
        if isinstance(result, Converted):
            converted += 1
            assert kernel.encode_spans(result.spans, SCOPE) == otlp_wire.python_encode_request(result.spans, SCOPE)
    assert converted > 100


_stamp = st.builds(
    "{:04d}-{:02d}-{:02d}{}{:02d}:{:02d}:{:02d}{}{}".format,
    st.integers(0, 9999), st.integers(0, 13), st.integers(0, 32), st.sampled_from(["T", "t", " ", "x"]),
    st.integers(0, 25), st.integers(0, 61), st.integers(0, 61),
    st.sampled_from(["", "."]) | st.from_regex(r"\.[0-9]{1,10}", fullmatch=True),
    st.sampled_from(["Z", "z", "+01:00", "-02:30", "", "ZZ"]),
)


@settings(max_examples=1500, deadline=None)
@given(_stamp | st.text(max_size=32) | st.from_regex(r"2026-11-22T02:16:3[0-9]\.[0-9\u0660-\u0669]{1,9}Z",
                                                         fullmatch=True))
def test_timestamps_parse_alike(primitives, text):
    assert outcome(primitives.parse_rfc3339_ns, text) == outcome(timestamps.python_parse_rfc3339_ns, text)


@pytest.mark.parametrize("text", ["2026-11-22T02:16:30Z", "2026-11-22T02:16:30.123456789Z", "1970-01-01T00:00:00.1Z",
                                  "2024-02-30T00:00:00Z", "2554-07-21T23:34:33.709551615Z", "0000-01-01T00:00:00Z",
                                  "2026-11-22T02:16:60.5Z", "2026-11-22T02:16:30.1234567890Z", None, 12])
def test_timestamp_edges_parse_alike(primitives, text):
    assert outcome(primitives.parse_rfc3339_ns, text) == outcome(timestamps.python_parse_rfc3339_ns, text)


def pipeline_outcomes(count: int) -> bytes:
    """Which core runs (`engine.implementation()`), and every outcome of the bridge's path
    through it (decode, link, map, encode) for the corpus and `count` messages of the bench
    fuzzer: spans as request bytes, rejections with their reason and detail. Compared
    between two processes running different cores."""
    import pickle

    from tests.conftest import corpus_files, read_raws

    fuzz = _bench_fuzzer()
    rnd = random.Random(23)
    raws = [raw for path in corpus_files() for raw in read_raws(path)]
    raws += [fuzz.generate(rnd)[1] for _ in range(count)]
    converter, straight = engine.Converter(limits=fuzz.LIMITS), engine.Converter(limits=fuzz.LIMITS)
    out = []
    for raw in raws:
        result = converter.convert(raw)
        if isinstance(result, Converted):
            # The bridge's OTLP path: mapped straight into protobuf, the same request bytes.
            direct = straight.convert(raw, encoded=True)
            assert isinstance(direct, Converted) and direct.encoded is not None
            request = encode.to_protobuf_bytes(result.spans)
            assert engine.encode_request([direct.encoded]) == request
            assert (direct.issues, direct.link) == (result.issues, result.link)
            out.append(("spans", request, result.issues, result.link))
        else:
            out.append(("rejected", result.reason, result.detail))
    return pickle.dumps((engine.implementation(), out))


def test_the_whole_path_gives_the_same_outcomes_on_both_cores():
    # The decode hooks (`_primitives.pyx`) are bound when the classes are made: one process
    # runs one core, so the other core runs in a child process (the compiled one must be
    # built: in the NATS_OTEL_NO_EXTENSIONS run, the child runs it).
    import os
    import pickle
    import subprocess
    import sys

    env = dict(os.environ)
    if accel.NO_EXTENSIONS:
        env.pop("NATS_OTEL_NO_EXTENSIONS")
    else:
        env["NATS_OTEL_NO_EXTENSIONS"] = "1"
    code = ("import sys; from tests.core.test_twins import pipeline_outcomes; "
            "sys.stdout.buffer.write(pipeline_outcomes(2000))")
    root = Path(__file__).resolve().parents[2]
    other = subprocess.run([sys.executable, "-c", code], env=env, cwd=root, capture_output=True, check=True).stdout
    (our_core, ours), (other_core, theirs) = pickle.loads(pipeline_outcomes(2000)), pickle.loads(other)
    assert {our_core, other_core} == {"python", "compiled"}  # both cores ran
    assert sum(1 for o in ours if o[0] == "spans") > 300
    assert theirs == ours


def _map_encode_alike(kernel, raws, options=None) -> tuple[int, int]:
    """The kernel's and the reference's map + encode on every message of `raws` (linked as
    `convert` links them); returns how many were prepared, and how many of those the
    kernel handed to the reference."""
    from nats_otel.core.decode import DecodeError
    from nats_otel.core.mapping import MappingOptions
    from nats_otel.core.pipeline import Linker, prepare

    options = options or MappingOptions()
    linker = Linker(bounded=False)
    prepared = []
    for raw in raws:
        try:
            prepared.append(prepare(raw, LIMITS))
        except DecodeError:
            continue
        linker.observe(prepared[-1])
    handed_over = 0
    for p in prepared:
        placement = linker.place(p)
        result, count = handed(kernel, "map", kernel.map_encode, p.msg, p.ctx, placement, options)
        assert result == outcome(span_bytes.python_map_encode, p.msg, p.ctx, placement, options)
        assert count in (0, 1)  # one message: handed whole, or not at all
        handed_over += count
    return len(prepared), handed_over


def test_the_corpus_maps_to_the_same_bytes(kernel, corpus_raws):
    from nats_otel.core.mapping import MappingOptions

    # Decode's records, all of them mapped by the kernel itself.
    assert _map_encode_alike(kernel, corpus_raws) == (len(corpus_raws), 0)
    # Every header copied, another service name: other attributes, other resources.
    options = MappingOptions("svc-é", frozenset({"traceparent", "content-encoding", "nats-trace-hop", "x"}))
    assert _map_encode_alike(kernel, corpus_raws, options) == (len(corpus_raws), 0)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(payloads(), min_size=1, max_size=3))
def test_fuzzed_trace_messages_map_to_the_same_bytes(kernel, raws):
    _map_encode_alike(kernel, raws)


def test_the_bench_fuzzers_messages_map_to_the_same_bytes(kernel):
    fuzz = _bench_fuzzer()
    rnd = random.Random(29)
    prepared, handed_over = _map_encode_alike(kernel, [fuzz.generate(rnd)[1] for _ in range(1500)])
    assert prepared > 100 and handed_over < prepared  # the kernel's own mapping was compared


@st.composite
def odd_messages(draw) -> RawTraceMessage:
    """Valid trace messages with odd but allowed values: empty and non-ASCII strings, lone
    surrogates, every connection kind, header names differing in case, errors and notes."""
    import json

    from nats_otel.core.mapping import _NOT_FAILURES
    from tests.core.factories import TRACEPARENT, egress, ingress, message

    text = st.sampled_from(["", "a", "é.ü", "\ud800", "x" * 200]) | st.text(max_size=8)
    error = st.sampled_from(["", "boom", _NOT_FAILURES[0], _NOT_FAILURES[0] + " x"])
    kind = st.integers(0, 9)
    events = [ingress(kind=draw(kind), subj=draw(text), acc=draw(text), name=draw(text), error=draw(error))]
    for t in range(draw(st.integers(0, 5))):
        shape = draw(st.sampled_from(["eg", "sm", "se", "si", "js"]))
        event = {"type": shape, "ts": f"2026-11-22T02:16:30.{100 + t:09d}Z"}
        if shape == "eg":
            event = egress(t=100 + t, kind=draw(kind), name=draw(text), hop=draw(text), acc=draw(text),
                           sub=draw(text), queue=draw(text), error=draw(error))
        else:
            event.update({k: draw(text) for k in ("to", "acc", "from", "stream", "subject") if draw(st.booleans())})
            if shape == "js":
                event["nointerest"] = draw(st.booleans())
                event["error"] = draw(error)
        events.append(event)
    headers = {"traceparent": [TRACEPARENT]}
    for name in draw(st.lists(st.sampled_from(["Nats-Trace-Hop", "nats-trace-hop", "Nats-Trace-Dest",
                                               "Nats-Trace-Only", "TraceState", "X-App"]), max_size=4)):
        headers[name] = draw(st.lists(text, max_size=2))
    doc = message(*events, headers=headers, hops=draw(st.integers(0, 3)))
    return RawTraceMessage(draw(st.sampled_from(["trace.a", None])), {}, json.dumps(doc).encode())


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(odd_messages(), min_size=1, max_size=3))
def test_odd_messages_map_to_the_same_bytes(kernel, raws):
    _map_encode_alike(kernel, raws)


def test_one_server_id_with_other_fields_gets_its_own_resource(kernel):
    # The compiled mapper memoises resources by the server's fields: each must be in the key.
    import json

    from tests.core.factories import ingress, message, raw

    variants = [{}, {"tags": ["a"]}, {"tags": ["b"]}, {"jetstream": True}, {"ver": "2.16.0"}, {"domain": "d"},
                {"host": "h"}, {"cluster": "c2"}, {"name": "s9"}]
    raws = []
    for variant in variants:
        doc = message(ingress())
        doc["server"].update(variant)
        raws.append(raw(json.dumps(doc).encode()))
    assert _map_encode_alike(kernel, raws * 2) == (2 * len(variants), 0)
