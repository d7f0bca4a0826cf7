"""`model.TraceHeaders`: the traced message's headers, read-only, laid flat in one tuple
(name, values, ...: one value as a str, else a tuple), read as a mapping of each name to the
list of its values; made alike by every decode path (the kernel's parse, msgspec's, the
reference's)."""

from __future__ import annotations

import copy
import json
import pickle

import pytest

from nats_otel.core import decode, pipeline
from nats_otel.core.model import NO_HEADERS, TraceHeaders, first_values
from tests.core.factories import TRACEPARENT, egress, ingress, message, raw


def laid_out(headers: TraceHeaders) -> tuple:
    """Its items as the kernel reads them (iterating it gives the names)."""
    return tuple(tuple.__iter__(headers))


HEADERS = {"traceparent": [TRACEPARENT], "X-Many": ["a", "", "b"], "X-None": [], "Nats-Trace-Hop": ["1.2"]}


def test_it_reads_as_the_mapping_it_was_made_of():
    headers = TraceHeaders.of(HEADERS)
    assert tuple.__len__(headers) == 8  # one item a name, one for its values
    assert laid_out(headers) == ("traceparent", TRACEPARENT, "X-Many", ("a", "", "b"), "X-None", (),
                              "Nats-Trace-Hop", "1.2")
    assert len(headers) == 4 and list(headers) == list(HEADERS) and headers.keys() == list(HEADERS)
    assert headers.items() == list(HEADERS.items()) and headers.values() == list(HEADERS.values())
    assert headers["X-Many"] == ["a", "", "b"] and headers.get("X-None") == [] and headers.get("x-many") is None
    assert "traceparent" in headers and "Traceparent" not in headers and 0 not in headers
    with pytest.raises(KeyError):
        headers["missing"]
    as_dict = dict(HEADERS)
    assert headers == as_dict and as_dict == headers and headers != {**HEADERS, "X-None": ["c"]}  # both ways
    assert headers == TraceHeaders.of(dict(HEADERS)) and headers != TraceHeaders.of({"traceparent": [TRACEPARENT]})
    assert (headers == ("traceparent",)) is False  # a tuple is not a mapping
    assert first_values(headers) == {"traceparent": TRACEPARENT, "x-many": "a", "nats-trace-hop": "1.2"}
    assert repr(headers) == f"TraceHeaders({HEADERS!r})"
    with pytest.raises(TypeError):
        hash(headers)


def test_what_it_hands_out_cannot_change_it():
    headers = TraceHeaders.of(HEADERS)
    headers["X-Many"].append("z")
    headers.items()[0][1].clear()
    assert headers == HEADERS
    assert TraceHeaders.of(headers) is headers
    assert laid_out(TraceHeaders.of({"a": "xy", "b": ["xy"]})) == ("a", "xy", "b", "xy")  # a str is one value


def test_it_survives_pickling_and_copying():
    headers = TraceHeaders.of(HEADERS)
    for other in (pickle.loads(pickle.dumps(headers)), copy.deepcopy(headers), copy.copy(headers)):
        assert type(other) is TraceHeaders and laid_out(other) == laid_out(headers)
    assert len(NO_HEADERS) == 0 and not NO_HEADERS and NO_HEADERS == {}


@pytest.mark.parametrize("headers", [HEADERS, {}, {"traceparent": [TRACEPARENT]}, {"É-ü": ["é"], "é-ü": ["x", "y"]}])
def test_every_decode_path_makes_the_same(core, headers):
    doc = message(ingress(), egress(), headers=headers)
    data = json.dumps(doc).encode()
    made = [core.prepare(raw(data), decode.DecodeLimits()).msg.headers,  # the kernel's parse where compiled
            pipeline.prepare(raw(data), decode.DecodeLimits()).msg.headers,
            decode.from_document(json.loads(data)).headers,  # the reference's
            decode._decode_fast(data, decode.DecodeLimits()).headers]  # msgspec's
    spaced = json.dumps(doc, indent=2).encode()
    made.append(core.prepare(raw(spaced), decode.DecodeLimits()).msg.headers)
    for headers_made in made:
        assert type(headers_made) is TraceHeaders and laid_out(headers_made) == laid_out(made[0])
        assert headers_made == headers


def test_more_names_than_the_parse_takes_go_to_msgspec_alike(kernel):
    many = {f"X-{i}": [str(i)] for i in range(65)}
    data = json.dumps(message(ingress(), egress(), headers=many)).encode()
    before = kernel.declined_by_parser()
    assert kernel.own_parse(data) is None  # over 64 names: the parse declines
    taken = kernel.prepare(raw(data), decode.DecodeLimits()).msg.headers
    assert kernel.declined_by_parser() == before + 1
    assert type(taken) is TraceHeaders and taken == many
    fewer = dict(list(many.items())[:64])
    parsed = kernel.own_parse(json.dumps(message(ingress(), egress(), headers=fewer)).encode())
    assert parsed is not None and parsed[2] == fewer


def test_a_name_given_twice_is_msgspecs_to_decide(kernel):
    data = (b'{"server":{"name":"s","id":"I"},"request":{"header":{"A":["1"],"A":["2"]}},'
            b'"events":[{"type":"in","ts":"2026-11-22T02:16:30Z","kind":0}]}')
    assert kernel.own_parse(data) is None
    headers = kernel.prepare(raw(data), decode.DecodeLimits()).msg.headers
    assert headers == decode._decode_fast(data, decode.DecodeLimits()).headers == {"A": ["2"]}
