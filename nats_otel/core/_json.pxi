# The lexical pieces of the kernel's own JSON parse (`_stage_parse.pxi`, which says why it
# exists): whitespace, strings, numbers, literals, a value to skip, a key, the separator after
# a member. Each takes the index of the first byte it reads and returns the index after what
# it read, or -1 to decline ("not sure: msgspec decides"); none reads past `n`, none loops
# but forward, and only `_skip` recurses (8 deep at most).

cimport cpython.unicode
from cpython.ref cimport Py_XDECREF
from libc.stdint cimport uint64_t
from libc.string cimport memcmp, memcpy

cdef object _NO = object()  # "declined"


cdef inline Py_ssize_t _ws(const unsigned char* s, Py_ssize_t at, Py_ssize_t n) noexcept:
    while at < n and (s[at] == 32 or s[at] == 10 or s[at] == 13 or s[at] == 9):
        at += 1
    return at


cdef extern from "_json_scan.h":
    Py_ssize_t nats_otel_string_end(const unsigned char* s, Py_ssize_t at, Py_ssize_t n, int* ascii) noexcept


cdef inline Py_ssize_t _string_end(const unsigned char* s, Py_ssize_t at, Py_ssize_t n, bint* ascii) noexcept:
    # `at`: just after the opening quote; the index of the closing one, with `ascii` set when
    # every byte before it is below 128. An escape or a control character (invalid JSON;
    # msgspec words the error) declines. Sixteen or eight bytes at a time (`_json_scan.h`).
    cdef int plain = 1
    at = nats_otel_string_end(s, at, n, &plain)
    ascii[0] = plain != 0
    return at


cdef object _text(const unsigned char* s, Py_ssize_t start, Py_ssize_t end, bint ascii):
    cdef Py_ssize_t size = end - start
    if ascii:
        out = PyUnicode_New(size, 127)
        if size:
            memcpy(PyUnicode_1BYTE_DATA(out), s + start, size)
        return out
    try:  # UTF-8, strictly: what is not (lone surrogates...) is msgspec's to refuse
        return cpython.unicode.PyUnicode_DecodeUTF8(<const char*>s + start, size, NULL)
    except UnicodeDecodeError:
        return _NO


# Names repeat from message to message (a server's name, id, host, cluster and version, the
# accounts, subjects and connections, header names): their texts are kept in a small
# direct-mapped cache - a slot per hash of the bytes, the last text wins - so that a repeated
# name costs a hash and a compare, not a string made and freed (nor its hash worked out again
# as a dict key). Bounded (CACHE_SLOTS texts of CACHE_MAX bytes at most); the values that do
# not repeat (timestamps, the traceparent) are never put in it.
cdef enum:
    CACHE_SLOTS = 1024  # a power of two
    CACHE_MAX = 64  # a server's id is 56
cdef PyObject* _cache[CACHE_SLOTS]  # owned references (or NULL), kept for the process' life


cdef object _name(const unsigned char* s, Py_ssize_t start, Py_ssize_t end, bint ascii):
    cdef Py_ssize_t size = end - start, i
    cdef uint64_t h = 14695981039346656037ULL  # FNV-1a's constants
    cdef uint64_t head = 0, tail = 0
    cdef PyObject* held
    if not ascii or size > CACHE_MAX:
        return _text(s, start, end, ascii)
    if size >= 8:  # the first and the last eight bytes and the length: the compare decides the rest
        memcpy(&head, s + start, 8)
        memcpy(&tail, s + end - 8, 8)
        h = (h ^ head) * 1099511628211ULL
        h = (h ^ tail ^ <uint64_t>size) * 1099511628211ULL
    else:
        for i in range(size):
            h = (h ^ s[start + i]) * 1099511628211ULL
    h = (h ^ (h >> 29) ^ (h >> 43)) & (CACHE_SLOTS - 1)
    held = _cache[h]
    if (held is not NULL and PyUnicode_GET_LENGTH(<object>held) == size
            and memcmp(PyUnicode_1BYTE_DATA(<object>held), s + start, size) == 0):
        return <object>held
    text = _text(s, start, end, True)
    # The slot read again: making the text may run the collector, and another thread with
    # it, which may have replaced the slot meanwhile. No Python code runs between these lines.
    held = _cache[h]
    Py_INCREF(text)
    _cache[h] = <PyObject*>text
    Py_XDECREF(held)
    return text


cdef inline Py_ssize_t _digits(const unsigned char* s, Py_ssize_t at, Py_ssize_t n, long long* out) noexcept:
    # A non-negative integer without a sign, a fraction or an exponent, below 10**18 (every
    # uint64 check downstream holds); `01` is not JSON.
    cdef Py_ssize_t start = at
    cdef long long value = 0
    if at >= n or not 48 <= s[at] <= 57:
        return -1
    if s[at] == 48:
        at += 1
    else:
        while at < n and 48 <= s[at] <= 57:
            value = value * 10 + (s[at] - 48)
            at += 1
            if at - start > 18:
                return -1
    if at < n and (48 <= s[at] <= 57 or s[at] == 46 or s[at] == 101 or s[at] == 69):
        return -1
    out[0] = value
    return at


cdef inline Py_ssize_t _literal(const unsigned char* s, Py_ssize_t at, Py_ssize_t n, const char* word,
                                Py_ssize_t size) noexcept:
    if n - at < size or memcmp(s + at, word, size) != 0:
        return -1
    return at + size


cdef Py_ssize_t _skip(const unsigned char* s, Py_ssize_t at, Py_ssize_t n, int depth) noexcept:
    # A value of a key no record has (servers add fields: `feature_flags`, `flags`): checked
    # as JSON msgspec surely accepts - ASCII strings without escapes, integers, literals,
    # nesting 8 deep at most - or declined.
    cdef unsigned char c
    cdef bint ascii
    cdef long long ignored
    if at >= n:
        return -1
    c = s[at]
    if c == 34:
        at = _string_end(s, at + 1, n, &ascii)
        return at + 1 if at >= 0 and ascii else -1
    if c == 123 or c == 91:  # { [
        if depth >= 8:
            return -1
        at = _ws(s, at + 1, n)
        if at < n and s[at] == c + 2:  # } ]
            return at + 1
        while True:
            if c == 123:
                if at >= n or s[at] != 34:
                    return -1
                at = _string_end(s, at + 1, n, &ascii)
                if at < 0 or not ascii:
                    return -1
                at = _ws(s, at + 1, n)
                if at >= n or s[at] != 58:
                    return -1
                at = _ws(s, at + 1, n)
            at = _skip(s, at, n, depth + 1)
            if at < 0:
                return -1
            at = _ws(s, at, n)
            if at < n and s[at] == 44:
                at = _ws(s, at + 1, n)
            elif at < n and s[at] == c + 2:
                return at + 1
            else:
                return -1
    if c == 116:
        return _literal(s, at, n, b"true", 4)
    if c == 102:
        return _literal(s, at, n, b"false", 5)
    if c == 110:
        return _literal(s, at, n, b"null", 4)
    if c == 45:
        at += 1
    return _digits(s, at, n, &ignored)


# A member no record has is usually the same bytes in every report of a server (its
# `feature_flags` object): the last few such objects and arrays skipped are kept, and a value
# that begins with one of them is that value - an object or an array ends at its own closing
# bracket, so bytes equal to a whole checked one are a whole value too. (A number or a literal
# is not kept: `12` is the start of `123`.) ~500 instructions a report become one compare.
cdef enum:
    SKIPPED_SLOTS = 4
    SKIPPED_MAX = 256
cdef unsigned char _skipped[SKIPPED_SLOTS][SKIPPED_MAX]
cdef Py_ssize_t _skipped_size[SKIPPED_SLOTS]  # 0: an empty slot
cdef int _skipped_next = 0


cdef Py_ssize_t _skip_member(const unsigned char* s, Py_ssize_t at, Py_ssize_t n) noexcept:
    """`_skip(s, at, n, 1)`: a member's value no record has, compared first with the objects
    and arrays skipped last."""
    global _skipped_next
    cdef int i
    cdef Py_ssize_t size, end
    if at >= n or (s[at] != 123 and s[at] != 91):
        return _skip(s, at, n, 1)
    for i in range(SKIPPED_SLOTS):
        size = _skipped_size[i]
        if size and n - at >= size and memcmp(s + at, _skipped[i], size) == 0:
            return at + size
    end = _skip(s, at, n, 1)
    if end > at and end - at <= SKIPPED_MAX:
        i = _skipped_next
        memcpy(_skipped[i], s + at, end - at)
        _skipped_size[i] = end - at
        _skipped_next = (i + 1) % SKIPPED_SLOTS
    return end


cdef inline Py_ssize_t _key(const unsigned char* s, Py_ssize_t at, Py_ssize_t n, Py_ssize_t* name) noexcept:
    # `"name"` then `:` -> the index of the value's first byte; the name lies at
    # [name[0], name[1]).
    cdef bint ascii
    cdef Py_ssize_t end
    if at >= n or s[at] != 34:
        return -1
    end = _string_end(s, at + 1, n, &ascii)
    if end < 0 or not ascii:  # no field is named in anything but ASCII; a skipped key too
        return -1
    name[0] = at + 1
    name[1] = end
    at = _ws(s, end + 1, n)
    if at >= n or s[at] != 58:
        return -1
    return _ws(s, at + 1, n)


cdef inline Py_ssize_t _next(const unsigned char* s, Py_ssize_t at, Py_ssize_t n, unsigned char close) noexcept:
    # After a member: `,` -> the next member's first byte (>= 0); the closing bracket at c ->
    # -c - 2 (<= -2: the caller's end is -result - 1, the index after it); else -1 (declined).
    at = _ws(s, at, n)
    if at < n and s[at] == 44:
        return _ws(s, at + 1, n)
    if at < n and s[at] == close:
        return -(at + 1) - 1
    return -1
