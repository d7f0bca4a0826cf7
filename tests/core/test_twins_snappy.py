"""The kernel's unframing of framed snappy (`_stage_snappy.pxi`, `_crc32c.h`) against the
reference, cramjam's framed decoder (`decode.decompress`): where the kernel takes a stream it
gives the same bytes; anything it declines (None from `own_snappy`) the reference decides, so
`prepare` gives the same `Prepared` or the same error either way. On every release's own
snappy trace messages, on streams of several chunks and chunk kinds built here, on broken
streams, and on fuzzed ones.
"""

from __future__ import annotations

import struct
from pathlib import Path

import cramjam
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nats_otel.core import pipeline
from nats_otel.core.decode import DecodeLimits, RawTraceMessage, decompress, parse_archive_line
from tests.core import factories as f
from tests.core.test_twins_prepare import handed, outcome

DATA = Path(__file__).resolve().parent.parent / "data"
STREAM_ID = b"\xff\x06\x00\x00sNaPpY"


def _masked(crc: int) -> int:
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def _crc32c(data: bytes) -> int:
    # bit by bit, the definition (Castagnoli, reflected): the kernel's tables are checked against it
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def chunk(kind: int, body: bytes) -> bytes:
    return bytes([kind]) + len(body).to_bytes(3, "little") + body


def data_chunk(data: bytes, compressed: bool = True, crc: int | None = None) -> bytes:
    checksum = struct.pack("<I", _masked(_crc32c(data)) if crc is None else crc)
    return chunk(0x00 if compressed else 0x01, checksum + (bytes(cramjam.snappy.compress_raw(data)) if compressed
                                                          else data))


def reference(payload: bytes, limit: int = DecodeLimits().max_decompressed_bytes):
    try:
        return decompress(payload, "snappy", DecodeLimits(max_decompressed_bytes=limit))
    except Exception as exc:  # noqa: BLE001 - compared: which error the reference gives
        return type(exc)


def snappy_messages() -> list[RawTraceMessage]:
    found = [parse_archive_line(line) for path in sorted(DATA.glob("corpus*/19_accept_encoding_snappy.jsonl"))
             for line in path.read_bytes().splitlines() if line.strip()]
    assert len(found) >= 10  # two per release corpus
    return found


def test_the_checksum_is_crc32c(kernel):
    # RFC 3720's check value, through an uncompressed chunk, and one bit off
    assert _crc32c(b"123456789") == 0xE3069283
    assert kernel.own_snappy(STREAM_ID + data_chunk(b"123456789", compressed=False)) == b"123456789"
    wrong = _masked(0xE3069283 ^ 1)
    assert kernel.own_snappy(STREAM_ID + data_chunk(b"123456789", compressed=False, crc=wrong)) is None
    # every length around the eight-byte steps, through the stream
    for size in range(40):
        data = bytes(range(7, 7 + size))
        assert kernel.own_snappy(STREAM_ID + data_chunk(data, compressed=False)) == (data or None)


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=2000))
def test_both_ways_of_summing_are_the_definition(kernel, data):
    # the tables (slicing-by-8) and, where the processor has it, the SSE 4.2 instruction
    table, hardware = kernel.crc32c_ways(data)
    assert table == _crc32c(data)
    assert hardware in (None, table)


def test_every_release_snappy_messages_unframe_and_prepare_alike(kernel):
    for raw in snappy_messages():
        assert raw.header("Content-Encoding") == "snappy" and raw.payload.startswith(STREAM_ID)
        assert kernel.own_snappy(raw.payload) == reference(raw.payload)
        prepared, by_reference = handed(kernel, kernel.prepare, raw)
        assert isinstance(prepared, pipeline.Prepared) and by_reference == 0
        assert prepared == outcome(pipeline.python_prepare, raw)


STREAMS = {
    "one compressed chunk": STREAM_ID + data_chunk(b"a" * 300),
    "uncompressed chunk": STREAM_ID + data_chunk(b"plain text", compressed=False),
    "several chunks, both kinds": STREAM_ID + data_chunk(b"x" * 65536) + data_chunk(b"y" * 10, compressed=False)
    + data_chunk(bytes(range(256)) * 100),
    "padding and skippable chunks": STREAM_ID + chunk(0xFE, b"\0" * 5) + data_chunk(b"a" * 50) + chunk(0x80, b"skip")
    + chunk(0xFD, b"") + data_chunk(b"b" * 50),
    "streams concatenated": STREAM_ID + data_chunk(b"first") + STREAM_ID + data_chunk(b"second"),
    "cramjam's own framing": bytes(cramjam.snappy.compress(b'{"events": []}' * 10_000)),
}
BROKEN = {
    "no stream identifier": data_chunk(b"abc"),
    "the identifier misspelled": b"\xff\x06\x00\x00sNaPpX" + data_chunk(b"abc"),
    "only the identifier": STREAM_ID,
    "a reserved chunk type": STREAM_ID + data_chunk(b"abc") + chunk(0x02, b"xx"),
    "a chunk cut short": (STREAM_ID + data_chunk(b"abc" * 20))[:-3],
    "a header cut short": STREAM_ID + data_chunk(b"abc") + b"\x00\x10",
    "a checksum that differs": STREAM_ID + data_chunk(b"abc", crc=12345),
    "a chunk without its checksum": STREAM_ID + chunk(0x00, b"\x01\x02"),
    "a corrupt block": STREAM_ID + chunk(0x00, struct.pack("<I", 0) + b"\x05\xff\xff\xff"),
    "a block over 64 KiB": STREAM_ID + data_chunk(b"z" * 65537),
    "an uncompressed chunk over 64 KiB": STREAM_ID + data_chunk(b"z" * 65537, compressed=False),
    "a second identifier misspelled": STREAM_ID + data_chunk(b"abc") + chunk(0xFF, b"sNaPpZ"),
}


@pytest.mark.parametrize("name", STREAMS)
def test_streams_the_kernel_takes_give_the_reference_bytes(kernel, name):
    data = kernel.own_snappy(STREAMS[name])
    assert data is not None and data == reference(STREAMS[name])


@pytest.mark.parametrize("name", BROKEN)
def test_streams_the_kernel_declines_are_the_reference_s_to_decide(kernel, name):
    assert kernel.own_snappy(BROKEN[name]) is None
    raw = RawTraceMessage("trace.a", {"Content-Encoding": ["snappy"]}, BROKEN[name])
    assert outcome(kernel.prepare, raw) == outcome(pipeline.python_prepare, raw)


def test_the_limit_is_declined_and_the_reference_words_it(kernel):
    stream = STREAM_ID + data_chunk(b"a" * 1000) + data_chunk(b"b" * 1000)
    assert kernel.own_snappy(stream, 2000) == b"a" * 1000 + b"b" * 1000
    assert kernel.own_snappy(stream, 1999) is None
    limits = DecodeLimits(max_decompressed_bytes=1999)
    raw = RawTraceMessage("trace.a", {"Content-Encoding": ["snappy"]}, stream)
    ours = outcome(kernel.prepare, raw, limits)
    assert ours == outcome(pipeline.python_prepare, raw, limits) and ours[1] == "too_large"


def test_a_trace_message_in_chunks_prepares_alike(kernel):
    import orjson

    data = orjson.dumps(f.message(f.ingress(kind=1), f.egress(kind=1, hop="h9", name="n2"),
                                  headers={"traceparent": [f.TRACEPARENT]}))
    for split in (1, 17, len(data) // 2, len(data) - 1):
        stream = STREAM_ID + data_chunk(data[:split]) + chunk(0xFE, b"") + data_chunk(data[split:], compressed=False)
        raw = RawTraceMessage("trace.a", {"Content-Encoding": ["snappy"]}, stream)
        prepared, by_reference = handed(kernel, kernel.prepare, raw)
        assert isinstance(prepared, pipeline.Prepared) and by_reference == 0
        assert prepared == outcome(pipeline.python_prepare, raw)


@st.composite
def mutated_streams(draw) -> bytes:
    parts = [STREAM_ID]
    for _ in range(draw(st.integers(1, 4))):
        data = draw(st.binary(max_size=300))
        parts.append(draw(st.sampled_from([data_chunk(data), data_chunk(data, compressed=False),
                                            chunk(draw(st.sampled_from([0x02, 0x7F, 0x80, 0xFE, 0xFF])),
                                                  draw(st.binary(max_size=8)))])))
    stream = bytearray(b"".join(parts))
    for _ in range(draw(st.integers(0, 3))):  # a few bytes changed, anywhere
        at = draw(st.integers(0, len(stream) - 1))
        stream[at] = draw(st.integers(0, 255))
    if draw(st.booleans()):
        stream = stream[: draw(st.integers(0, len(stream)))]
    return bytes(stream)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=mutated_streams())
def test_fuzzed_streams_never_give_other_bytes_than_the_reference(kernel, stream):
    data = kernel.own_snappy(stream)
    if data is not None:
        assert data == reference(stream)
    raw = RawTraceMessage("trace.a", {"Content-Encoding": ["snappy"]}, stream)
    assert outcome(kernel.prepare, raw) == outcome(pipeline.python_prepare, raw)
