"""The kernel's ids stage (`_stage_ids.pxi`, with `_blake2b.h`) against the pure-Python
reference (`ids`, hashlib): BLAKE2b, the span ids across block edges, the context's fields
and the traceparent's parse, on generated and edge-case input. As in test_twins.py, the
kernel comes from the `kernel` fixture (skipped under NATS_OTEL_NO_EXTENSIONS=1) and is
compared with the reference in one process.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.core.test_twins import outcome


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
    ctx = ids.TraceContext(trace_id or b"\x01", parent)
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

    _span_ids_are_hashlibs(kernel, ids.TraceContext(trace_id, parent), ident, position)


def test_span_ids_at_block_edges_are_hashlibs(kernel):
    from nats_otel.core import ids

    ctx = ids.TraceContext(bytes(range(1, 17)), bytes(range(8)))
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
