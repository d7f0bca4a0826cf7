# What the kernel's parse (`_stage_parse.pxi`) keeps of the records it read: the bytes of
# the members that repeat from report to report of one sender, and the record they gave.
#
# A server sends the same members before `seq` and `time` in every report (its name, host,
# id, cluster, version, flags: ~200-300 bytes in every release from 2.11 to 2.15): the
# **prefix** of its object. An event's members after its `ts` (the connection's kind, id,
# name, account, the subject) repeat for every message of one connection and subject: the
# **rest** of its object. The parse keeps, for the last ones seen, those bytes and the
# record they gave; an object with the same bytes there takes the kept record's fields
# (a server's: a copy of it, its parse going on after them; an event's: its fields copied
# in, the object ending with them). Equal bytes parse to equal fields: what is taken is
# what the parse would have built, and what is around the bytes is read as always (a key
# given again there still declines: the kept members count as seen).
#
# Two compares at most decide: two slots by a hash of the first bytes (a server's first 64
# hold its name, where servers differ; an event's first 32 after its `ts` its connection),
# the kept bytes compared whole; a new one replaces the one of the two used least lately.
# Bounded: a slot holds at most PREFIX_MAX (REST_MAX) bytes and one record.

from libc.stdint cimport uint64_t

cdef enum:
    PREFIX_SLOTS = 16   # powers of two
    REST_SLOTS = 64
    PREFIX_HASHED = 64  # the bytes hashed, and the fewest kept
    REST_HASHED = 32
    PREFIX_MAX = 2048
    REST_MAX = 256

cdef struct KeptPrefix:
    Py_ssize_t size         # 0: an empty slot
    unsigned long long used  # when it was last kept or taken (`_uses`)
    unsigned int seen       # the fields its members set
    PyObject* record        # (owned) the record they gave: the rest of its fields the template's
    unsigned char text[PREFIX_MAX]

cdef struct KeptRest:
    const void* spec        # the record type it was read for (an event's members fit several)
    Py_ssize_t size         # 0: an empty slot; the bytes end with the object's `}`
    unsigned long long used
    unsigned int seen
    PyObject* record        # (owned) the record they ended
    unsigned char text[REST_MAX]

cdef KeptPrefix _prefixes[PREFIX_SLOTS]
cdef KeptRest _rests[REST_SLOTS]
cdef Py_ssize_t _kept_hits[2]
_kept_hits[:] = [0, 0]
cdef unsigned long long _uses = 0


cdef inline size_t _hashed(const unsigned char* s, int words, int slots) noexcept:
    # `words` 64-bit words multiplied in; the top bits pick one of `slots` (a power of two)
    cdef uint64_t h = 0, word
    cdef int i
    for i in range(words):
        memcpy(&word, s + 8 * i, 8)
        h = (h ^ word) * <uint64_t>0x9E3779B97F4A7C15ULL
    return <size_t>(h >> 58) & <size_t>(slots - 1)


cdef KeptPrefix* _prefix_slot(const unsigned char* s, Py_ssize_t at, Py_ssize_t n) noexcept:
    """The first of the two slots of a server object whose members begin at `at` (the other
    is the next); NULL when too short to hash."""
    if n - at < PREFIX_HASHED:
        return NULL
    return &_prefixes[_hashed(s + at, PREFIX_HASHED // 8, PREFIX_SLOTS) & ~1]


cdef object _kept_prefix(KeptPrefix* pair, const unsigned char* s, Py_ssize_t at, Py_ssize_t n,
                         unsigned int* seen, Py_ssize_t* after):
    """A copy of the kept record when the members at `at` begin with the bytes kept in one
    of the `pair` (`seen` gets its fields, `after` the index after the bytes: the next
    member's key); else None."""
    global _uses
    cdef KeptPrefix* kept
    cdef int i
    for i in range(2):
        kept = pair + i
        if kept.size and kept.size <= n - at and memcmp(s + at, kept.text, kept.size) == 0:
            _kept_hits[0] += 1
            _uses += 1
            kept.used = _uses
            seen[0] = kept.seen
            after[0] = at + kept.size
            return _struct_copy(<object>kept.record)  # no Python code runs in between: the slot is as read
    return None


cdef void _keep_prefix(KeptPrefix* pair, const unsigned char* s, Py_ssize_t size, object record,
                       unsigned int seen) noexcept:
    """Keep the `size` bytes at `s` (PREFIX_HASHED to PREFIX_MAX) and the record they gave,
    in the one of the `pair` used least lately."""
    global _uses
    if size < PREFIX_HASHED or size > PREFIX_MAX:
        return
    cdef KeptPrefix* kept = pair if pair[0].used <= pair[1].used else pair + 1
    Py_INCREF(record)
    Py_XDECREF(kept.record)  # a record's deallocation runs no Python code
    kept.record = <PyObject*>record
    memcpy(kept.text, s, size)
    kept.size = size
    kept.seen = seen
    _uses += 1
    kept.used = _uses


cdef KeptRest* _rest_slot(const unsigned char* s, Py_ssize_t at, Py_ssize_t n) noexcept:
    """The first of the two slots of the members at `at` after an event's `ts` (the other is
    the next); NULL when too short to hash."""
    if n - at < REST_HASHED:
        return NULL
    return &_rests[_hashed(s + at, REST_HASHED // 8, REST_SLOTS) & ~1]


cdef object _kept_rest(KeptRest* pair, const void* spec, const unsigned char* s, Py_ssize_t at, Py_ssize_t n,
                       unsigned int seen, unsigned int* fields, Py_ssize_t* after):
    """The kept record when the members at `at` (of a record of `spec`, `seen` read so far)
    are the bytes kept in one of the `pair`, up to the object's `}` (`fields`: the fields
    they set; `after`: the index after the `}`); else None."""
    global _uses
    cdef KeptRest* kept
    cdef int i
    for i in range(2):
        kept = pair + i
        if kept.size and kept.spec == spec and kept.size <= n - at and not (kept.seen & seen) \
                and memcmp(s + at, kept.text, kept.size) == 0:
            _kept_hits[1] += 1
            _uses += 1
            kept.used = _uses
            fields[0] = kept.seen
            after[0] = at + kept.size
            return <object>kept.record
    return None


cdef void _keep_rest(KeptRest* pair, const void* spec, const unsigned char* s, Py_ssize_t size, object record,
                     unsigned int seen) noexcept:
    """Keep the `size` bytes at `s` (REST_HASHED to REST_MAX, the last one the object's `}`)
    and the record they ended, in the one of the `pair` used least lately."""
    global _uses
    if size < REST_HASHED or size > REST_MAX:
        return
    cdef KeptRest* kept = pair if pair[0].used <= pair[1].used else pair + 1
    Py_INCREF(record)
    Py_XDECREF(kept.record)
    kept.record = <PyObject*>record
    memcpy(kept.text, s, size)
    kept.spec = spec
    kept.size = size
    kept.seen = seen
    _uses += 1
    kept.used = _uses


cdef unsigned int _copy_kept(TypeSpec* spec, object obj, object kept, unsigned int fields) except? 0:
    # The fields (a bit each) of the kept record into `obj`, with what each derives
    cdef int i
    for i in range(spec.count):
        if (fields >> i) & 1:
            set_field(obj, spec.fields[i].offset, field(kept, spec.fields[i].offset))
            if spec.fields[i].derived >= 0:
                set_field(obj, spec.fields[i].derived, field(kept, spec.fields[i].derived))
    return fields


def kept_hits():
    """How many server objects began with kept bytes, and how many events ended with them,
    since the process started (for the tests)."""
    return {"prefix": _kept_hits[0], "rest": _kept_hits[1]}


def forget_kept():
    """Empty every slot (for the tests: from nothing kept)."""
    cdef int i
    for i in range(PREFIX_SLOTS):
        Py_XDECREF(_prefixes[i].record)
        _prefixes[i].record = NULL
        _prefixes[i].size = 0
        _prefixes[i].used = 0
    for i in range(REST_SLOTS):
        Py_XDECREF(_rests[i].record)
        _rests[i].record = NULL
        _rests[i].size = 0
        _rests[i].used = 0
