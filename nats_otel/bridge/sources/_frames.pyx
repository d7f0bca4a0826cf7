# cython: language_level=3, boundscheck=False, wraparound=False
"""The compiled twin of `frames.python_scan` (see frames.py: what is served, what is left to
nats-py, and why). Same frames served, same results; the control line is read byte by byte
instead of split, and each payload is copied once, straight from the buffer."""

from cpython.bytes cimport PyBytes_FromStringAndSize
from libc.string cimport memchr

MORE = 0
OTHER = 1

DEF MAX_FIELDS = 5
DEF MAX_DIGITS = 18


cdef inline bint _space(unsigned char c):
    # What a bytes regex's \s matches (and bytes.split() splits on).
    return c == 32 or 9 <= c <= 13


cdef long long _number(const unsigned char* text, Py_ssize_t length):
    """A decimal field as nats-py's `\\d+` reads it, or -1."""
    cdef long long value = 0
    cdef Py_ssize_t i
    if length == 0 or length > MAX_DIGITS:
        return -1
    for i in range(length):
        if not 48 <= text[i] <= 57:
            return -1
        value = value * 10 + (text[i] - 48)
    return value


cdef inline bytes _copy(const unsigned char* start, Py_ssize_t length):
    return PyBytes_FromStringAndSize(<const char*>start, length)


def scan(bytearray buf not None, dict handlers not None):
    """As `frames.python_scan`."""
    cdef Py_ssize_t end = len(buf)
    if end == 0:
        return 0, 0, 0, MORE
    cdef const unsigned char[:] view = buf
    cdef const unsigned char* data = &view[0]
    cdef const unsigned char* found
    cdef Py_ssize_t pos = 0, eol, at, line_start, start, stop, count, header_size
    cdef Py_ssize_t served = 0, size = 0
    cdef Py_ssize_t field_start[MAX_FIELDS]
    cdef Py_ssize_t field_end[MAX_FIELDS]
    cdef int nfields, min_fields, max_fields
    cdef long long sid, total
    cdef unsigned char c
    while pos < end:
        # The line's end: the first CR LF from here.
        at = pos
        eol = -1
        while at < end:
            found = <const unsigned char*>memchr(data + at, 13, end - at)
            if found == NULL:
                break
            at = found - data
            if at + 1 < end and data[at + 1] == 10:
                eol = at
                break
            at += 1
        if eol < 0:
            return pos, served, size, MORE
        if eol - pos >= 4 and data[pos] == 77 and data[pos + 1] == 83 and data[pos + 2] == 71 and data[pos + 3] == 32:
            line_start, min_fields, max_fields = pos + 4, 3, 4  # "MSG "
        elif (eol - pos >= 5 and data[pos] == 72 and data[pos + 1] == 77 and data[pos + 2] == 83
              and data[pos + 3] == 71 and data[pos + 4] == 32):
            line_start, min_fields, max_fields = pos + 5, 4, 5  # "HMSG "
        else:
            return pos, served, size, OTHER
        # Fields separated by runs of spaces, no other whitespace, none after the last
        # field (as frames.py checks).
        nfields = 0
        field_start[0] = line_start
        at = line_start
        while at <= eol:
            c = data[at] if at < eol else 32
            if c == 32:
                if nfields == max_fields:
                    return pos, served, size, OTHER  # too many fields, or a space after the last
                if at == field_start[nfields]:
                    if at == eol:
                        return pos, served, size, OTHER  # a space before the line's end, or no field
                    field_start[nfields] = at + 1  # a run of spaces: the field starts after it
                else:
                    field_end[nfields] = at
                    nfields += 1
                    if nfields < MAX_FIELDS:
                        field_start[nfields] = at + 1
            elif _space(c):
                return pos, served, size, OTHER
            at += 1
        if nfields < min_fields:
            return pos, served, size, OTHER
        sid = _number(data + field_start[1], field_end[1] - field_start[1])
        total = _number(data + field_start[nfields - 1], field_end[nfields - 1] - field_start[nfields - 1])
        header_size = 0
        if min_fields == 4:
            header_size = _number(data + field_start[nfields - 2], field_end[nfields - 2] - field_start[nfields - 2])
        handler = handlers.get(sid) if sid >= 0 else None
        if handler is None or total < 0 or header_size < 0 or header_size > total:
            return pos, served, size, OTHER
        start = eol + 2
        stop = start + total
        if stop + 2 > end:
            return pos, served, size, MORE
        subject = _copy(data + field_start[0], field_end[0] - field_start[0])
        reply = _copy(data + field_start[2], field_end[2] - field_start[2]) if nfields == max_fields else None
        headers = _copy(data + start, header_size) if header_size else None
        payload = _copy(data + start + header_size, total - header_size)
        pos = stop + 2  # nats-py skips the two bytes after the payload without looking
        served += 1
        size += total - header_size
        try:
            handler(subject, reply, headers, payload)
        except Exception as exc:
            return pos, served, size, exc
    return pos, served, size, MORE
