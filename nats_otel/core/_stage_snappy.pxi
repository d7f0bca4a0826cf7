# Framed snappy, unframed in the kernel. (The header below is not named in the first two
# lines: there Cython reads "coding" and a name after it as the file's text encoding.)
#
# A trace that asks for it (`Accept-Encoding: snappy` on the traced message) gets its trace
# messages from nats-server as a snappy *stream*: its s2 writer in the Snappy-compatible
# framing (google/snappy's framing_format.txt: a stream identifier, then chunks of at most
# 64 KiB, each with the masked CRC-32C of its data). The reference (`decode.decompress`)
# decodes it with cramjam's framed decoder: ~4 µs for a corpus message of 624 bytes, most
# of it zeroing the 64 KiB buffers it makes for every call, where its raw decoder takes the
# one block inside in ~0.6 µs. So the kernel walks the frames and checks the checksums
# itself (`_crc32c.h`), and hands each compressed block to cramjam's raw decoder (the one
# its framed decoder uses): ~0.8 µs in all (docs/performance.md, session 33).
#
# It takes only what it is sure of: the stream identifier first (and again between
# concatenated streams), compressed (0x00) and uncompressed (0x01) chunks of at most 64 KiB
# of data whose checksum matches, skippable chunks and padding (0x80-0xfe) passed over, some
# data in all, within the limit. Anything else - a reserved chunk type, a chunk cut short, a
# block that claims more than 64 KiB or that cramjam refuses, a checksum that differs - gives
# _NO, and the reference decides (the same bytes, or its error).

from libc.stdint cimport int64_t, uint32_t

from cramjam import snappy as _snappy

cdef object _decompress_raw = _snappy.decompress_raw
cdef Py_ssize_t _MAX_CHUNK = 65536  # the framing's bound on a chunk's data, uncompressed
cdef const char* _STREAM_ID = b"\xff\x06\x00\x00sNaPpY"  # the identifier chunk, header included

cdef extern from "_crc32c.h":
    void _crc32c_init "nats_otel_crc32c_init"() noexcept nogil
    uint32_t crc32c "nats_otel_crc32c"(const unsigned char* data, size_t size) noexcept nogil
    uint32_t _crc32c_table "nats_otel_crc32c_table"(const unsigned char* data, size_t size) noexcept nogil
    int64_t _crc32c_hardware "nats_otel_crc32c_hardware_sum"(const unsigned char* data, size_t size) noexcept nogil

_crc32c_init()


cdef inline uint32_t _masked(uint32_t crc) noexcept nogil:
    # the framing stores the CRC rotated and offset (a CRC of data holding CRCs is weak)
    return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u


cdef inline uint32_t _le32(const unsigned char* p) noexcept nogil:
    return p[0] | (<uint32_t>p[1] << 8) | (<uint32_t>p[2] << 16) | (<uint32_t>p[3] << 24)


cdef Py_ssize_t _block_length(const unsigned char* p, Py_ssize_t size) noexcept nogil:
    # A raw snappy block starts with its uncompressed length, a little-endian varint of at
    # most 5 bytes (32 bits); -1 when it is cut short or longer
    cdef Py_ssize_t value = 0, i
    for i in range(min(size, 5)):
        value |= <Py_ssize_t>(p[i] & 0x7F) << (7 * i)
        if p[i] < 0x80:
            return value
    return -1


cdef object _unframe_snappy(bytes payload, Py_ssize_t limit):
    """The data of a framed snappy stream, or _NO (the reference decides)."""
    cdef const unsigned char* s = <const unsigned char*>PyBytes_AS_STRING(payload)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(payload), at = 10, length, total = 0
    cdef unsigned char kind
    cdef list chunks = []
    if n < 10 or memcmp(s, _STREAM_ID, 10) != 0:
        return _NO
    while at < n:
        if n - at < 4:
            return _NO
        kind = s[at]
        length = s[at + 1] | (s[at + 2] << 8) | (s[at + 3] << 16)
        at += 4
        if length > n - at:
            return _NO
        if kind == 0x00 or kind == 0x01:  # compressed, uncompressed: a checksum, then the data
            if length < 4:
                return _NO
            if kind == 0x00:
                if not 0 <= _block_length(s + at + 4, length - 4) <= _MAX_CHUNK:
                    return _NO
                try:
                    data = bytes(_decompress_raw(PyBytes_FromStringAndSize(<const char*>s + at + 4, length - 4)))
                except Exception:  # a corrupt block: the reference words the error
                    return _NO
            else:
                data = PyBytes_FromStringAndSize(<const char*>s + at + 4, length - 4)
            if PyBytes_GET_SIZE(data) > _MAX_CHUNK or _masked(crc32c(
                    <const unsigned char*>PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data))) != _le32(s + at):
                return _NO
            total += PyBytes_GET_SIZE(data)
            if total > limit:
                return _NO
            chunks.append(data)
        elif kind == 0xFF:  # a stream identifier again: streams concatenated
            if length != 6 or memcmp(s + at, _STREAM_ID + 4, 6) != 0:
                return _NO
        elif kind < 0x80:  # 0x02-0x7f: reserved, not to be skipped
            return _NO
        at += length  # 0x80-0xfd skippable, 0xfe padding
    if total == 0:
        return _NO
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def own_snappy(payload, Py_ssize_t limit=_DEFAULT_LIMITS.max_decompressed_bytes):
    """The kernel's unframing alone, for the tests: the stream's data, or None where it
    declines (the reference's `decompress` then decides)."""
    if type(payload) is not bytes:
        return None
    data = _unframe_snappy(payload, limit)
    return None if data is _NO else data


def crc32c_ways(bytes data):
    """CRC-32C of `data` both ways, for the tests: (the tables', the SSE 4.2 instruction's or
    None where the processor has none)."""
    cdef const unsigned char* p = <const unsigned char*>PyBytes_AS_STRING(data)
    cdef int64_t hardware = _crc32c_hardware(p, PyBytes_GET_SIZE(data))
    return _crc32c_table(p, PyBytes_GET_SIZE(data)), (None if hardware < 0 else hardware)
