# What the kernel's parse (`_stage_parse.pxi`) keeps of the records it read: the bytes of
# the members that repeat from report to report of one sender, and the record they gave.
#
# A server sends the same members before `seq` and `time` in every report (its name, host,
# id, cluster, version, flags: ~200-300 bytes in every release from 2.11 to 2.15): the
# **prefix** of its object. An event's members after its `ts` (the connection's kind, id,
# name, account, the subject) repeat for every message of one connection and subject: the
# **rest** of its object. The parse keeps, for the last ones seen, those bytes and the
# record they gave; an object with the same bytes there takes the kept record's fields
# (a server's: the kept record itself, or a copy of it when a member of its own follows;
# an event's: the kept record itself as its shape, its time in its slot, when nothing but
# its `ts` came before the bytes - the record of one that had other members there is not
# kept -, else its fields copied in; the object ending with them). Equal bytes parse to equal fields: what is taken is
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

cdef struct Kept:
    const void* spec        # the record type it was read for (an event's members fit several)
    Py_ssize_t size         # 0: an empty slot; an event's bytes end with the object's `}`
    unsigned long long used  # when it was last kept or taken (`_uses`)
    unsigned int seen       # the fields its members set
    PyObject* record        # (owned) the record they gave (a server's: the rest of its fields the template's)
    unsigned char* text     # room for the table's `room` bytes

cdef struct KeptTable:      # the servers' prefixes, or the events' rests
    Kept* slots
    size_t count            # a power of two
    Py_ssize_t hashed       # the bytes hashed, and the fewest kept
    Py_ssize_t room         # the most kept
    Py_ssize_t hits

cdef unsigned char _prefix_text[PREFIX_SLOTS][PREFIX_MAX]
cdef unsigned char _rest_text[REST_SLOTS][REST_MAX]
cdef Kept _prefix_slots[PREFIX_SLOTS]
cdef Kept _rest_slots[REST_SLOTS]
cdef KeptTable PREFIXES, RESTS
cdef unsigned long long _uses = 0


cdef void _table(KeptTable* table, Kept* slots, unsigned char* text, size_t count, Py_ssize_t hashed,
                 Py_ssize_t room) noexcept:
    # Its empty slots, each given its room in `text` (a loop in C: no module-level name left behind)
    cdef size_t i
    table.slots, table.count, table.hashed, table.room, table.hits = slots, count, hashed, room, 0
    for i in range(count):
        slots[i].text = text + i * room


_table(&PREFIXES, _prefix_slots, &_prefix_text[0][0], PREFIX_SLOTS, PREFIX_HASHED, PREFIX_MAX)
_table(&RESTS, _rest_slots, &_rest_text[0][0], REST_SLOTS, REST_HASHED, REST_MAX)


cdef Kept* _pair(KeptTable* table, const unsigned char* s, Py_ssize_t at, Py_ssize_t n) noexcept:
    """The first of the two slots of the members at `at` (the other is the next): the top
    bits of their first `hashed` bytes, multiplied in a 64-bit word at a time; NULL when
    there are fewer."""
    cdef uint64_t h = 0, word
    cdef Py_ssize_t i
    if n - at < table.hashed:
        return NULL
    for i in range(0, table.hashed, 8):
        memcpy(&word, s + at + i, 8)
        h = (h ^ word) * <uint64_t>0x9E3779B97F4A7C15ULL
    return table.slots + (<size_t>(h >> 58) & (table.count - 1) & ~(<size_t>1))


cdef Kept* _taken(KeptTable* table, Kept* pair, const void* spec, const unsigned char* s, Py_ssize_t at,
                  Py_ssize_t n, unsigned int seen) noexcept:
    """The one of the `pair` whose bytes the members at `at` (of a record of `spec`, `seen`
    read so far, none of them among its fields) begin with; else NULL."""
    global _uses
    cdef Kept* kept
    cdef int i
    for i in range(2):
        kept = pair + i
        if kept.size and kept.spec == spec and kept.size <= n - at and not (kept.seen & seen) \
                and memcmp(s + at, kept.text, kept.size) == 0:
            table.hits += 1
            _uses += 1
            kept.used = _uses
            return kept
    return NULL


cdef void _keep(KeptTable* table, Kept* pair, const void* spec, const unsigned char* s, Py_ssize_t size,
                object record, unsigned int seen) noexcept:
    """Keep the `size` bytes at `s` (`hashed` to `room` of them) and the record they gave,
    in the one of the `pair` used least lately."""
    global _uses
    if size < table.hashed or size > table.room:
        return
    cdef Kept* kept = pair if pair[0].used <= pair[1].used else pair + 1
    Py_INCREF(record)
    Py_XDECREF(kept.record)  # a record's deallocation runs no Python code
    kept.record = <PyObject*>record
    memcpy(kept.text, s, size)
    kept.spec = spec
    kept.size = size
    kept.seen = seen
    _uses += 1
    kept.used = _uses


cdef void _copy_kept(TypeSpec* spec, object obj, object kept, unsigned int fields) except *:
    # The fields (a bit each) of the kept record into `obj`, with what each derives
    cdef int i
    for i in range(spec.count):
        if (fields >> i) & 1:
            set_field(obj, spec.fields[i].offset, field(kept, spec.fields[i].offset))
            if spec.fields[i].derived >= 0:
                set_field(obj, spec.fields[i].derived, field(kept, spec.fields[i].derived))


def kept_hits():
    """How many server objects began with kept bytes, and how many events ended with them,
    since the process started (for the tests)."""
    return {"prefix": PREFIXES.hits, "rest": RESTS.hits}


cdef void _forget(KeptTable* table) noexcept:
    cdef size_t i
    for i in range(table.count):
        Py_XDECREF(table.slots[i].record)
        table.slots[i].record = NULL
        table.slots[i].size = 0
        table.slots[i].used = 0


def forget_kept():
    """Empty every slot (for the tests: from nothing kept)."""
    _forget(&PREFIXES)
    _forget(&RESTS)
