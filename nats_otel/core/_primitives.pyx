# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The leaf of primitives: what msgspec calls while it decodes, compiled.

msgspec calls a `__post_init__` hook per decoded struct (the server, every event, the
request, the document), and the Python hooks were a visible share of
decoding. `model` and `decode` choose these hooks (`accel.primitives`) when their
classes are made, so this module sits below them: it imports nothing of the core but
`timestamps`, its own reference, which imports nothing (the text forms the C parser does
not take go there). The kernel (`_kernel.pyx`) cimports `context_fields_c`, and for its own
JSON parse `rfc3339_bytes_c` and `timestamp_ns_c`.

The references: `timestamps.parse_rfc3339_ns`, `model`'s and `decode`'s hooks,
`ids._context_fields`. Same values, same errors (the
tests compare the two on generated input)."""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.stdint cimport int64_t
from libc.string cimport memcmp, memcpy
from msgspec.structs import force_setattr

from nats_otel.core.timestamps import parse_rfc3339_ns as _reference_parse

cdef object _U64 = 2 ** 64
cdef bytes _HEX = b"0123456789abcdef"


# --- RFC 3339 (`timestamps.parse_rfc3339_ns`) -------------------------------------------
# What servers write: `YYYY-MM-DDTHH:MM:SS[.f{1,9}]Z` in ASCII. Anything else (offsets,
# odd digits, year 0, out-of-range fields) goes to the reference, which parses or raises.

# A text's characters: bytes from the kernel's own parse, code points of a `str` otherwise.
ctypedef fused Chars:
    unsigned char
    unsigned int


cdef inline int digits(const Chars* p, int n, int* out) noexcept:
    cdef int i, value = 0
    for i in range(n):
        if p[i] < 48 or p[i] > 57:
            return 0
        value = value * 10 + <int>p[i] - 48
    out[0] = value
    return 1


cdef inline int64_t days_from_civil(int64_t y, int m, int d) noexcept:
    # Howard Hinnant's algorithm: days since 1970-01-01 of a proleptic Gregorian date. Day
    # 31 of a short month runs on into the next, as in `calendar.timegm`.
    cdef int64_t era, yoe, doy, doe
    y -= m <= 2
    era = (y if y >= 0 else y - 399) // 400
    yoe = y - era * 400
    doy = (153 * (m + (-3 if m > 2 else 9)) + 2) // 5
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468 + (d - 1)


def parse_rfc3339_ns(text):
    """Nanoseconds since the Unix epoch; `ValueError` naming the text if it is not RFC 3339."""
    cdef Py_ssize_t n, i
    cdef unsigned int buf[30]
    cdef Py_UCS4 c
    cdef int64_t days, ns
    cdef str chars
    if type(text) is not str:
        return _reference_parse(text)
    chars = <str>text  # typed: indexing reads the character in C, not through str.__getitem__
    n = len(chars)
    if n < 20 or n > 30:
        return _reference_parse(text)
    for i in range(n):
        c = chars[i]
        buf[i] = <unsigned int>c
    if not (_date_days(buf, &days) and _time_ns(buf, n, days, &ns)):
        return _reference_parse(text)  # raises, or (offsets, far years...) parses
    return ns


# The date the kernel's parse read last, and its day number: a server's timestamps share
# their date from report to report, so the date is one compare of ten bytes after the first.
cdef unsigned char _last_date[10]
cdef int64_t _last_days = -1  # none yet


cdef bint rfc3339_bytes_c(const unsigned char* text, Py_ssize_t n, int64_t* ns) noexcept:
    """`parse_rfc3339_ns` of ASCII bytes in the servers' form, for the kernel's own parse
    (`_stage_parse.pxi`): true with `ns` set, or false (then the text is the caller's to
    give to `parse_rfc3339_ns`). Always within what OTLP carries (years 1970 to 2200)."""
    global _last_days
    cdef int64_t days
    if n < 20 or n > 30:
        return False
    if _last_days >= 0 and memcmp(text, _last_date, 10) == 0:
        days = _last_days
    elif _date_days(text, &days):
        memcpy(_last_date, text, 10)
        _last_days = days
    else:
        return False
    return _time_ns(text, n, days, ns)


# `YYYY-MM-DDTHH:MM:SS[.f{1,9}]Z`, 20 to 30 characters, years 1970 to 2200: the date (its first
# ten characters) and the rest; each false for anything else.

cdef inline bint _date_days(const Chars* buf, int64_t* days) noexcept:
    cdef int year, month, day
    if not (buf[4] == 45 and buf[7] == 45 and digits(buf, 4, &year) and digits(buf + 5, 2, &month)
            and digits(buf + 8, 2, &day)):
        return False
    if year < 1970 or year > 2200 or not (1 <= month <= 12 and 1 <= day <= 31):
        return False
    days[0] = days_from_civil(year, month, day)
    return True


cdef inline bint _time_ns(const Chars* buf, Py_ssize_t n, int64_t days, int64_t* ns) noexcept:
    cdef int hour, minute, second, fraction = 0, width, i
    if not (buf[10] in (84, 116, 32) and buf[13] == 58 and buf[16] == 58 and buf[n - 1] in (90, 122)):
        return False
    if not (digits(buf + 11, 2, &hour) and digits(buf + 14, 2, &minute) and digits(buf + 17, 2, &second)):
        return False
    if n == 20:
        width = 0
    else:
        width = <int>(n - 21)
        if buf[19] != 46 or width < 1 or width > 9 or not digits(buf + 20, width, &fraction):
            return False
        for i in range(9 - width):
            fraction *= 10
    if not (hour < 24 and minute < 60 and second < 61):
        return False
    ns[0] = (days * 86400 + hour * 3600 + minute * 60 + second) * 1_000_000_000 + fraction
    return True


# --- msgspec's hooks (`model`, `decode`) --------------------------------------------------
# The errors are the references' (`model.check_uint64`, `model._timestamp`): the tests
# compare them.

cdef inline object _ns(object text):
    ns = parse_rfc3339_ns(text)
    if ns < 0 or ns >= _U64:
        raise ValueError(f"timestamp {text!r:.40} outside what OTLP can carry (1970 to 2554)")
    return ns


cdef object timestamp_ns_c(object text):
    """`_ns` for the kernel's own parse (`_stage_parse.pxi`): the hooks' nanoseconds, or
    their ValueError."""
    return _ns(text)


cdef inline void _check_uint64(str name, object value) except *:
    if value >= _U64:
        raise ValueError(f"{name} {value} is over a uint64")


def event_post_init(self):
    """`_Event.__post_init__`: `ts_ns` from `ts`, the text not kept."""
    force_setattr(self, "ts_ns", _ns(self.ts))
    force_setattr(self, "ts", "")


def connection_post_init(self):
    """`Ingress`/`Egress.__post_init__`: `cid` within a uint64, then as any event."""
    _check_uint64("cid", self.cid)
    force_setattr(self, "ts_ns", _ns(self.ts))
    force_setattr(self, "ts", "")


def server_post_init(self):
    """`ServerReport.__post_init__`: `seq` within a uint64."""
    _check_uint64("seq", self.seq)


def request_post_init(self):
    """`decode._Request.__post_init__`: `msgsize` within a uint64."""
    _check_uint64("msgsize", self.msgsize)


def document_post_init(self):
    """`decode._Document.__post_init__`: `hops` within a uint64."""
    _check_uint64("hops", self.hops)


# --- the trace context's fields (`ids._context_fields`) -----------------------------------

def context_fields(trace_id, parent_span_id):
    """`ids._context_fields`: `_fields(trace_id.hex(), parent_span_id.hex())`, without the two
    hex strings."""
    return context_fields_c(trace_id, parent_span_id)


cdef bytes context_fields_c(object trace_id, object parent_span_id):
    cdef bytes out, part
    cdef char* p
    cdef const unsigned char* src
    cdef Py_ssize_t at = 0, n, i
    if type(trace_id) is not bytes or type(parent_span_id) is not bytes:
        return _ascii_fields(trace_id.hex(), parent_span_id.hex())  # bytearray, memoryview: or their error
    out = PyBytes_FromStringAndSize(NULL, 8 + 2 * (PyBytes_GET_SIZE(trace_id) + PyBytes_GET_SIZE(parent_span_id)))
    p = PyBytes_AS_STRING(out)
    for part in (trace_id, parent_span_id):
        n = 2 * PyBytes_GET_SIZE(part)
        p[at] = <char>((n >> 24) & 0xFF)
        p[at + 1] = <char>((n >> 16) & 0xFF)
        p[at + 2] = <char>((n >> 8) & 0xFF)
        p[at + 3] = <char>(n & 0xFF)
        at += 4
        src = <const unsigned char*>PyBytes_AS_STRING(part)
        for i in range(n // 2):
            p[at] = _HEX[src[i] >> 4]
            p[at + 1] = _HEX[src[i] & 15]
            at += 2
    return out


cdef bytes _ascii_fields(str first, str second):
    # `ids._fields` of two ASCII texts (hex digits): each as a 4-byte length and its bytes
    cdef bytes a = first.encode("ascii"), b = second.encode("ascii")
    return len(a).to_bytes(4, "big") + a + len(b).to_bytes(4, "big") + b
