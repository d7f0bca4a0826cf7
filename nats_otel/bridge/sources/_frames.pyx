# cython: language_level=3, boundscheck=False, wraparound=False
"""The compiled twin of `frames.python_scan` (see frames.py: what is served, what is left to
nats-py, and why). Same frames served, same results; the control line is read byte by byte
instead of split, and each payload is copied once, straight from the buffer.

`DeliverySink` is the compiled twin of a core source's per-message handler (`nats_core`'s
`on_raw`, the reference): `scan` hands it a frame of its sid without a Python call (and
without the subject's bytes when the subject is the last one), and it offers the delivery
to the intake's compiled state (`IntakeState`, twin of `intake._IntakeState`) in C."""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.string cimport memchr, memcmp

from nats_otel.bridge.sources.delivery import MESSAGE_OVERHEAD as _MESSAGE_OVERHEAD, Delivery as _Delivery
from nats_otel.core.decode import NO_RAW_HEADERS as _NO_RAW_HEADERS, RawTraceMessage as _RawTraceMessage

cdef Py_ssize_t MESSAGE_OVERHEAD = _MESSAGE_OVERHEAD

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


def plain_headers(bytes block not None):
    """`headers.parse_headers(block)[0]` for a plain block (`NATS/1.0`, then `Name: value`
    lines of printable ASCII): what servers send with a compressed trace message
    (`Content-Encoding`). None for anything else - a status, a byte outside printable ASCII
    and tab, a line without a colon or with a space in its name -, which the Python reader
    (the reference) decides and counts when malformed."""
    return _plain_headers(<const unsigned char*>PyBytes_AS_STRING(block), PyBytes_GET_SIZE(block))


cdef object _plain_headers(const unsigned char* s, Py_ssize_t n):
    cdef dict out = {}
    cdef Py_ssize_t at, end, colon, name_end, value_start, value_end, i
    cdef unsigned char c
    if n < 10 or memcmp(s, b"NATS/1.0\r\n", 10) != 0:
        return None
    at = 10
    while at < n:
        end = at  # the line's end: its \r\n (a lone \r or \n is the reference's to decide)
        colon = -1
        while end < n and s[end] != 13:
            c = s[end]
            if c == 58 and colon < 0:  # :
                colon = end
            elif c == 10 or (c < 32 and c != 9) or c > 126:
                return None
            end += 1
        if end + 1 >= n or s[end + 1] != 10:
            return None
        if end > at:  # an empty line is skipped, as the reference skips it
            if colon <= at:
                return None
            name_end = colon
            while name_end > at and (s[name_end - 1] == 32 or s[name_end - 1] == 9):
                name_end -= 1
            for i in range(at, name_end):  # no space inside the name (the reference: malformed)
                if s[i] == 32 or s[i] == 9:
                    return None
            if name_end == at:
                return None
            value_start, value_end = colon + 1, end
            while value_start < value_end and (s[value_start] == 32 or s[value_start] == 9):
                value_start += 1
            while value_end > value_start and (s[value_end - 1] == 32 or s[value_end - 1] == 9):
                value_end -= 1
            name = (<const char*>s)[at:name_end].decode("ascii")
            value = (<const char*>s)[value_start:value_end].decode("ascii")
            values = out.get(name)
            if values is None:
                out[name] = [value]
            else:
                (<list>values).append(value)
        at = end + 2
    return out


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
    cdef bint sink
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
        # A trace subscription's sink is called in C: its subject is read in place, its reply unused.
        sink = type(handler) is DeliverySink
        if not sink:
            subject = _copy(data + field_start[0], field_end[0] - field_start[0])
            reply = _copy(data + field_start[2], field_end[2] - field_start[2]) if nfields == max_fields else None
        headers = _copy(data + start, header_size) if header_size else None
        payload = _copy(data + start + header_size, total - header_size)
        pos = stop + 2  # nats-py skips the two bytes after the payload without looking
        served += 1
        size += total - header_size
        try:
            if sink:
                (<DeliverySink>handler).take(data + field_start[0], field_end[0] - field_start[0], headers, payload)
            else:
                handler(subject, reply, headers, payload)
        except Exception as exc:
            return pos, served, size, exc
    return pos, served, size, MORE


cdef class IntakeState:
    """The numbers and the queue of the bridge's `Intake` (intake.py, its subclass), as C
    fields, and its `offer`: `DeliverySink` offers without a Python call or attribute
    look-up; Python reads and writes the fields as before. The reference is the pure-Python
    twin, `intake._IntakeState`."""

    cdef public object _items           # the deliveries waiting, oldest first (a deque)
    cdef public Py_ssize_t bytes, held  # charged: waiting, and taken but not released
    cdef public Py_ssize_t max_bytes
    cdef public object max_messages     # int or None
    cdef public object _waiter          # the collector's future, or None
    cdef public Py_ssize_t _wanted      # deliveries that wake it
    cdef public bint _stopped

    def offer(self, delivery):
        """Queue `delivery`; False (nothing queued) when it does not fit (`intake._IntakeState.offer`)."""
        return self._offer(delivery, delivery.size)

    cdef bint _offer(self, object delivery, Py_ssize_t size) except -1:
        cdef Py_ssize_t waiting = len(self._items)
        if self.bytes + size > self.max_bytes or (
                self.max_messages is not None and waiting >= <Py_ssize_t>self.max_messages):
            return False
        self._items.append(delivery)
        self.bytes += size
        self.held += 1
        waiter = self._waiter
        if waiter is not None and waiting + 1 >= self._wanted and not waiter.done():
            waiter.set_result(None)
        return True


cdef class DeliverySink:
    """A core source's direct handler (`CoreSource.direct_handler`): each frame becomes a
    `Delivery` offered to the bridge's `Intake` (`IntakeState._offer`, a C call), or a drop
    counted (`queue_full`). The compiled twin of the Python handler `on_raw` there, which
    stays the reference (tests/bridge/test_delivery_sink.py runs both on the same frames).
    With the scan, ~5.8k instructions a message where the Python handler and offer took
    ~9.6k (`bench/core_ab.py --path receive`, issue 48). Callable as any handler too
    (nats-py's own parser, `python_scan`)."""

    cdef IntakeState intake
    cdef object source, tally, queue_full, headers_of, subjects, stamp, link
    cdef str name
    cdef bytes last_subject  # the last subject's bytes and text: a trace subscription sees few
    cdef str last_text

    def __init__(self, source, intake, tally, queue_full, headers_of, subjects, stamp, link, str name):
        self.source = source          # its `_dropped` is read per message, as `on_raw` reads it
        self.intake = <IntakeState?>intake
        self.tally = tally
        self.queue_full = queue_full
        self.headers_of = headers_of
        self.subjects = subjects
        self.stamp = stamp
        self.link = link
        self.name = name
        self.last_subject = b""
        self.last_text = None

    def __call__(self, bytes subject, reply, header_block, bytes payload):
        self.take(<const unsigned char*>PyBytes_AS_STRING(subject), PyBytes_GET_SIZE(subject), header_block,
                  payload)

    cdef int take(self, const unsigned char* subject, Py_ssize_t subject_size, object header_block,
                  bytes payload) except -1:
        self.tally.value += 1
        cdef str text = self._text(subject, subject_size)
        headers = _NO_RAW_HEADERS
        if type(header_block) is bytes and header_block:  # a plain block in C; the Python reader
            headers = _plain_headers(<const unsigned char*>PyBytes_AS_STRING(header_block),
                                     PyBytes_GET_SIZE(header_block))
            if headers is None:  # decides (and counts) the rest
                headers = self.headers_of(header_block)
        elif header_block:
            headers = self.headers_of(header_block)
        raw = _RawTraceMessage(text, headers, payload, self.stamp[0])
        cdef Py_ssize_t size = PyBytes_GET_SIZE(payload) + len(text) + MESSAGE_OVERHEAD
        breaks = self.source._dropped + self.link.downs
        if self.intake._offer(_Delivery(raw, self.name, size, None, breaks), size):
            return 0
        self.queue_full.inc()
        self.source._dropped += 1
        return 0

    cdef str _text(self, const unsigned char* subject, Py_ssize_t size):
        """`subjects.get(subject) or subjects.add(subject)`, the last subject's text at once."""
        cdef bytes last = self.last_subject
        if size == PyBytes_GET_SIZE(last) and self.last_text is not None and \
                memcmp(PyBytes_AS_STRING(last), subject, size) == 0:
            return self.last_text
        key = PyBytes_FromStringAndSize(<const char*>subject, size)
        text = self.subjects.get(key) or self.subjects.add(key)
        self.last_subject, self.last_text = key, text
        return text
