"""The kernel's ids stage (`_stage_ids.pxi`, with `_blake2b.h`) against the pure-Python
reference (`ids`, hashlib): BLAKE2b, the span ids across block edges, the context's fields
the traceparent's parse, the shape's digest of a message with headers of its own and the
ad-hoc trace ids, on generated and edge-case input. As in test_twins.py, the
kernel comes from the `kernel` fixture (skipped under NATS_OTEL_NO_EXTENSIONS=1) and is
compared with the reference in one process.
"""

from __future__ import annotations

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from nats_otel.core import pipeline
from nats_otel.core.decode import RawTraceMessage
from tests.core import factories as f
from tests.core.test_twins import outcome
from tests.core.test_twins_prepare import outcome as prepared_outcome


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=600), st.integers(1, 64))
def test_blake2b_in_c_is_hashlibs(kernel, data, size):
    import hashlib

    assert kernel.blake2b(data, size) == hashlib.blake2b(data, digest_size=size).digest()


def test_blake2b_block_edges(kernel):
    import hashlib

    for n in (0, 1, 127, 128, 129, 255, 256, 257, 1000):
        assert kernel.blake2b(b"x" * n, 16) == hashlib.blake2b(b"x" * n, digest_size=16).digest()


@settings(max_examples=600, deadline=None)
@given(st.lists(st.text(max_size=20), max_size=4), st.binary(max_size=40), st.binary(max_size=20),
       st.binary(max_size=20), st.integers(-3, 300))
def test_ids_hash_alike(kernel, primitives, texts, ident, trace_id, parent, position):
    from nats_otel.core import ids

    assert primitives.context_fields(trace_id, parent) == ids._context_fields(trace_id, parent)
    ctx = ids.TraceContext.of(trace_id or b"\x01", parent)
    assert kernel.server_span_id(ctx, ident) == ids.server_span_id(ctx, ident)
    assert outcome(kernel.event_span_id, ctx, ident, position) == outcome(ids.event_span_id, ctx, ident, position)


def _span_ids_are_hashlibs(kernel, ctx, ident: bytes, position: int) -> None:
    """The kernel's server and event span ids of `ident` are hashlib's BLAKE2b of their bytes."""
    import hashlib

    from nats_otel.core import ids

    for span_id, data in ((kernel.server_span_id(ctx, ident), ids._ROLE_PREFIX[b"server"] + ctx.id_fields + ident),
                          (kernel.event_span_id(ctx, ident, position),
                           ids._ROLE_PREFIX[b"event"] + ctx.id_fields + ident + ids._POSITIONS[position])):
        digest = hashlib.blake2b(data, digest_size=16).digest()[:8]
        assert span_id == (digest if any(digest) else b"\x00" * 7 + b"\x01"), len(data)


@settings(max_examples=300, deadline=None)
@given(st.binary(min_size=1, max_size=20), st.binary(max_size=20), st.binary(min_size=60, max_size=420),
       st.integers(0, 255))
def test_span_ids_of_several_blocks_are_hashlibs(kernel, trace_id, parent, ident, position):
    # 130 to 560 bytes hashed: 2 to 5 BLAKE2b blocks, the kernel's four parts across their edges.
    from nats_otel.core import ids

    _span_ids_are_hashlibs(kernel, ids.TraceContext.of(trace_id, parent), ident, position)


def test_span_ids_at_block_edges_are_hashlibs(kernel):
    from nats_otel.core import ids

    ctx = ids.TraceContext.of(bytes(range(1, 17)), bytes(range(8)))
    fixed = len(ids._ROLE_PREFIX[b"server"] + ctx.id_fields)
    for total in (127, 128, 129, 255, 256, 257, 383, 384, 385):
        _span_ids_are_hashlibs(kernel, ctx, b"i" * (total - fixed), 7)


_trace_hex = st.sampled_from(["0" * 32, "4bf92f3577b34da6a3ce929d0e0e4736", "4BF92F3577B34DA6A3CE929D0E0E4736",
                              "4bf92f3577b34da6a3ce929d0e0e473"]) | st.from_regex(r"[0-9a-fA-F]{32}", fullmatch=True)
_parent_hex = (st.sampled_from(["0" * 16, "00f067aa0ba902b7", "00f067aa0ba902bz"])
               | st.from_regex(r"[0-9a-f]{16}", fullmatch=True))
_traceparent = st.builds("{}-{}-{}-{}{}".format, st.sampled_from(["00", "01", "ff", "0g", "0"]), _trace_hex,
                         _parent_hex, st.sampled_from(["01", "00", "1", "xx"]), st.sampled_from(["", "-x", " ", "-"]))


# 55 characters that are not all ASCII: the compiled twin reads UTF-8 bytes, which must then
# not be 55 (or not encode at all: a lone surrogate).
_non_ascii = st.sampled_from(["00-4bf92f3577b34da6a3ce929d0e0e473é-00f067aa0ba902b7-01",
                              "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0\ud800",
                              "é" * 55, "\ud800" * 55])


@settings(max_examples=800, deadline=None)
@given(_traceparent | _non_ascii | st.text(min_size=55, max_size=55) | st.text(max_size=60)
       | st.sampled_from([None, 5, b"00"]))
def test_traceparents_parse_alike(kernel, value):
    from nats_otel.core import ids

    assert outcome(kernel.parse_traceparent, value) == outcome(ids.parse_traceparent, value)


def test_every_digit_of_a_traceparent_is_checked(kernel):
    """Each hex position of a valid traceparent, given each byte around the digit ranges
    (and the ids all zero but one digit): decided as the pure twin decides."""
    from nats_otel.core import ids

    valid = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    zeros = "00-" + "0" * 32 + "-" + "0" * 16 + "-01"
    positions = [*range(3, 35), *range(36, 52), 53, 54]
    for position in positions:
        for char in "09afAFg/:`@G\x00 ":
            for base in (valid, zeros):
                value = base[:position] + char + base[position + 1:]
                assert outcome(kernel.parse_traceparent, value) == outcome(ids.parse_traceparent, value), value


# The headers of a message's own, as `message_shape` gathers them: lower-cased names (the same
# name twice in two spellings), lists of values (none, several, non-ASCII, a lone surrogate:
# no UTF-8 form, the twin's error).
_header_text = st.text(max_size=12) | st.sampled_from(["accept-encoding", "nats-msg-id", "é", "\ud800", ""])
_own = st.lists(st.tuples(_header_text, st.lists(_header_text, max_size=3)), max_size=5)
_sizes = st.integers(-(2**63), 2**63 - 1) | st.integers(-(2**70), 2**70) | st.sampled_from([0, -1, 2**63, -(2**63) - 1])


@settings(max_examples=800, deadline=None)
@given(_sizes, _own)
def test_shape_digests_alike(kernel, size, own):
    from nats_otel.core.shapes import shape_digest

    assert outcome(kernel.shape_digest, size, list(own)) == outcome(shape_digest, size, own)


def test_shape_digest_odd_items_go_to_the_twin(kernel):
    from nats_otel.core.shapes import shape_digest

    for size, own in [(5, [("a", ("x",))]), (5, [("a", [1])]), (5, [(b"a", ["x"])]), (5, [("a", ["x"], 3)]),
                      (5, [("a", ["x"]), ("a", "y")]), (5.0, [("a", ["x"])]), (True, [("a", ["x"])])]:
        assert outcome(kernel.shape_digest, size, list(own)) == outcome(shape_digest, size, own), (size, own)


def test_a_message_with_headers_of_its_own_is_shaped_in_c(kernel, monkeypatch):
    # The digest is the kernel's own: the Python twin is not called for the usual header.
    def refuse(*_args):
        raise AssertionError("the Python twin was called")

    raw = RawTraceMessage("trace.a", {}, orjson.dumps(f.message(f.ingress(), headers={
        "traceparent": ["00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"],
        "Nats-Msg-Id": ["order-1"], "Content-Type": ["application/json", "charset=é"]})))
    expected = pipeline.python_prepare(raw)
    monkeypatch.setattr(kernel, "_shape_digest", refuse)
    prepared = kernel.prepare(raw)
    assert prepared == expected and prepared.size >= kernel.SHAPE_DIGEST


@settings(max_examples=600, deadline=None)
@given(st.binary(max_size=20), st.binary(max_size=20), st.binary(max_size=80))
def test_a_contexts_ids_are_read_back_from_its_fields_alike(kernel, trace_id, parent, id_fields):
    # A context keeps its ids only as the hex fields its span ids hash (`id_fields`).
    from nats_otel.core import ids

    ctx = ids.TraceContext.of(trace_id, parent)
    assert ctx.id_fields == ids._context_fields(trace_id, parent)
    assert (ctx.trace_id, ctx.parent_span_id) == (trace_id, parent)
    assert (kernel.context_id(ctx, False), kernel.context_id(ctx, True)) == (trace_id, parent)
    # Fields no context of ids has (cut short, trailing bytes, lengths past the end, odd or
    # upper-case digits): the kernel hands them to the reference, which reads them or raises.
    upper = ids._fields(trace_id.hex().upper(), parent.hex())
    for fields in (id_fields, upper, upper[:-1], upper + b"x", ids._fields(trace_id.hex() + "a", ""),
                   ids._fields(trace_id.hex(), "zz"), ids._fields("0" * 66, "")):
        odd = ids.TraceContext(fields)
        for parent_wanted in (False, True):
            assert outcome(kernel.context_id, odd, parent_wanted) == outcome(
                ids.context_id, fields, parent_wanted), (fields, parent_wanted)


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=80), st.binary(max_size=300))
def test_adhoc_trace_ids_alike(kernel, id_fields, origin):
    from nats_otel.core import ids

    ctx = ids.TraceContext(id_fields, "", True, "adhoc.dest")
    assert kernel.adhoc_trace_id(ctx, origin) == ids.adhoc_trace_id(ctx, origin)


_subjects = st.none() | st.sampled_from(["", "trace.adhoc", "é.adhoc", "\ud800"]) | st.text(max_size=20)
_dests = st.none() | st.sampled_from(["", "trace disabled", "adhoc.dest", "é"]) | st.text(max_size=20)


@settings(max_examples=300, deadline=None)
@given(_subjects, _dests, st.sampled_from([None, "", "k=v"]))
def test_adhoc_contexts_prepare_alike(kernel, subject, dest, trace_state):
    # No traceparent: the context is the ad-hoc one (by the arrival subject, else the
    # destination), or the twin's error where neither names one.
    headers = {"Nats-Trace-Dest": [dest]} if dest is not None else {}
    if trace_state is not None:
        headers["tracestate"] = [trace_state]
    raw = RawTraceMessage(subject, {}, orjson.dumps(f.message(f.ingress(), headers=headers)))
    assert prepared_outcome(kernel.prepare, raw) == prepared_outcome(pipeline.python_prepare, raw)


def test_an_adhoc_message_is_traced_in_c(kernel, monkeypatch):
    # The ad-hoc context and the trace id at its origin are the kernel's: the twins not called.
    def refuse(*_args):
        raise AssertionError("the Python twin was called")

    raw = RawTraceMessage("trace.adhoc", {}, orjson.dumps(f.message(f.ingress(), headers={
        "Nats-Trace-Dest": ["trace.adhoc"]})))
    expected = pipeline.python_prepare(raw)
    linker = pipeline.Linker()
    linker.observe(expected)
    expected_place = linker.place(expected)
    monkeypatch.setattr(kernel, "_trace_context", refuse)
    monkeypatch.setattr(kernel, "_adhoc_trace_id", refuse)
    prepared = kernel.prepare(raw)
    assert prepared == expected and prepared.ctx.adhoc_key == "trace.adhoc"
    compiled = kernel.Linker()
    compiled.observe(prepared)
    assert compiled.place(prepared) == expected_place
