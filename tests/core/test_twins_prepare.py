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

from nats_otel.core import accel, pipeline
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


def test_the_process_runs_the_prepare_it_was_asked_for():
    assert (pipeline.prepare is pipeline.python_prepare) == accel.NO_EXTENSIONS, accel.unavailable()


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
