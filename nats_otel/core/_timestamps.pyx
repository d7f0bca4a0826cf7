# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The compiled twin of `timestamps.parse_rfc3339_ns` (see there), for what servers write:
`YYYY-MM-DDTHH:MM:SS[.f{1,9}]Z` in ASCII. Anything else (offsets, odd digits, year 0,
out-of-range fields) goes to the Python twin, which parses or raises exactly as the pure
path does."""

from libc.stdint cimport int64_t

cdef object _py_parse = None


def configure(py_parse):
    """The Python twin, for every text the C parser does not take."""
    global _py_parse
    _py_parse = py_parse


cdef inline int digits(const unsigned int* p, int n, int* out):
    cdef int i, value = 0
    for i in range(n):
        if p[i] < 48 or p[i] > 57:
            return 0
        value = value * 10 + <int>p[i] - 48
    out[0] = value
    return 1


cdef inline int64_t days_from_civil(int64_t y, int m, int d):
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
    cdef int year, month, day, hour, minute, second, fraction = 0, width
    cdef int64_t days
    cdef str chars
    if type(text) is not str:
        return _py_parse(text)
    chars = <str>text  # typed: indexing reads the character in C, not through str.__getitem__
    n = len(chars)
    if n < 20 or n > 30:
        return _py_parse(text)
    for i in range(n):
        c = chars[i]
        buf[i] = <unsigned int>c
    if not (buf[4] == 45 and buf[7] == 45 and buf[10] in (84, 116, 32) and buf[13] == 58 and buf[16] == 58
            and buf[n - 1] in (90, 122)):
        return _py_parse(text)
    if not (digits(buf, 4, &year) and digits(buf + 5, 2, &month) and digits(buf + 8, 2, &day)
            and digits(buf + 11, 2, &hour) and digits(buf + 14, 2, &minute) and digits(buf + 17, 2, &second)):
        return _py_parse(text)
    if n == 20:
        width = 0
    else:
        width = <int>(n - 21)
        if buf[19] != 46 or width < 1 or width > 9 or not digits(buf + 20, width, &fraction):
            return _py_parse(text)
        for i in range(9 - width):
            fraction *= 10
    if year < 1970 or year > 2200 or not (1 <= month <= 12 and 1 <= day <= 31 and hour < 24 and minute < 60
                                          and second < 61):
        return _py_parse(text)  # raises, or (far years: no int64 overflow here) parses
    days = days_from_civil(year, month, day)
    return (days * 86400 + hour * 3600 + minute * 60 + second) * 1_000_000_000 + fraction
