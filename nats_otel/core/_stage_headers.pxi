# The message's headers a server span copies (`mapping.map_message`: the allowlisted ones,
# `messaging.nats.header.<lower-case name>`, each an array of its values), for the mapping
# stage (`_stage_map.pxi`). A message's header names repeat from message to message (the
# parse hands out one object per name): what each name comes to - copied or not, the
# pair's encoded key - is worked out once per name, not per message and header.


# A message's headers are a `model.TraceHeaders`: name, values, name, values..., a name's
# values one str, or a tuple of them (none or several).

cdef int put_headers_generic(Buf* s, object headers, object allowlist) except -1:
    """The copied headers, in the message's order (`nats.header.<lower-case name>`)."""
    cdef set seen = None
    cdef Py_ssize_t at
    for at in range(0, PyTuple_GET_SIZE(headers), 2):
        name = <object>PyTuple_GET_ITEM(headers, at)
        values = <object>PyTuple_GET_ITEM(headers, at + 1)
        lowered = name.lower()
        if lowered not in allowlist:
            continue
        if seen is None:
            seen = set()
        if lowered in seen:
            return 0  # two names differing in case share one attribute: Python decides
        seen.add(lowered)
        if not put_key_value(s, 9, HEADER_ATTRIBUTE_PREFIX + lowered, (values,) if type(values) is str else values):
            return 0
    return 1


# What `put_headers_generic` works out per header and message (the lower-case name, whether
# the allowlist has it, the attribute's name, the pair's key field), kept per header name:
# a name -> (the allowlist's own text for it, the encoded key field), or None if it is not
# copied. For one allowlist, held (a frozenset: it cannot change under the cache); another
# one empties it. The allowlist's texts are the attributes' identities: held with it, so
# the duplicates' check can compare addresses, and the cache emptied within a message
# cannot free one.
cdef object _header_allowlist = None
cdef dict _header_attributes = {}  # the allowlist's texts, each to itself
cdef dict _header_names = {}

cdef enum:
    _HEADER_NAMES_LIMIT = 1024  # names are the sender's: keep memory bounded
    _COPIED_MAX = 16            # copied headers per message the fast way writes; more: the generic


cdef object _header_entry(object name):
    """The cache's entry for `name` (made if missing); `_NO` if it cannot be cached."""
    cdef PyObject* hit = PyDict_GetItemWithError(_header_names, name)
    cdef Buf key
    if hit != NULL:
        return <object>hit
    lowered = name.lower()
    hit = PyDict_GetItemWithError(_header_attributes, lowered)  # `lowered in allowlist`: the same hash and ==
    if hit == NULL:
        entry = None
    else:
        buf_init(&key, 64)
        try:
            if not put_utf8(&key, 1, HEADER_ATTRIBUTE_PREFIX + lowered):
                return _NO  # lone surrogates: the generic path hands the message to Python
            entry = (<object>hit, PyBytes_FromStringAndSize(key.data, key.size))
        finally:
            buf_free(&key)
    if PyDict_Size(_header_names) >= _HEADER_NAMES_LIMIT:
        _header_names.clear()
    PyDict_SetItem(_header_names, name, entry)
    return entry


cdef int put_header_values(Buf* s, bytes key, object values) except -1:
    """One copied header's pair (span field 9), its values an array of strings, as
    `put_key_value(key, values)` writes it (one str: an array of it), sized first: no
    buffer per level. 0 for a value that is not an exact str, or one with lone surrogates."""
    cdef Py_ssize_t i, n = _values_count(values), size, item, array = 0, value
    cdef const char* data
    cdef object text
    for i in range(n):
        text = <object>_value_at(values, i)
        if not PyUnicode_CheckExact(text):
            return 0
        try:
            PyUnicode_AsUTF8AndSize(text, &size)  # kept in the str: the second pass reads it again
        except UnicodeEncodeError:
            return 0
        item = 1 + varint_size(<uint64_t>size) + size    # AnyValue { string_value (1) }
        array += 1 + varint_size(<uint64_t>item) + item  # ArrayValue.values (1)
    value = 1 + varint_size(<uint64_t>array) + array     # AnyValue { array_value (5) }
    put_byte(s, 0x4a)                                    # Span.attributes (9): KeyValue
    put_varint(s, <uint64_t>(PyBytes_GET_SIZE(key) + 1 + varint_size(<uint64_t>value) + value))
    put_bytes(s, key)
    put_byte(s, 0x12)                                    # KeyValue.value (2)
    put_varint(s, <uint64_t>value)
    put_byte(s, 0x2a)
    put_varint(s, <uint64_t>array)
    for i in range(n):
        data = PyUnicode_AsUTF8AndSize(<object>_value_at(values, i), &size)
        put_byte(s, 0x0a)
        put_varint(s, <uint64_t>(1 + varint_size(<uint64_t>size) + size))
        put_byte(s, 0x0a)
        put_varint(s, <uint64_t>size)
        put(s, data, size)
    return 1


cdef int put_headers_cached(Buf* s, object headers, object allowlist) except -1:
    """`put_headers_generic`'s bytes from the cache; 0 (whatever it wrote is the caller's to
    drop) for anything unusual: a name twice in other cases, values of other types, more
    than `_COPIED_MAX` copied, an allowlist that is not a frozenset..."""
    global _header_allowlist
    cdef PyObject* name
    cdef PyObject* values
    cdef PyObject* copied[_COPIED_MAX]
    cdef Py_ssize_t at, count = 0, j
    if type(allowlist) is not frozenset:
        return 0
    if allowlist is not _header_allowlist:
        _header_names.clear()
        _header_attributes.clear()
        for text in <frozenset>allowlist:
            _header_attributes[text] = text
        _header_allowlist = allowlist
    for at in range(0, PyTuple_GET_SIZE(headers), 2):
        name = <PyObject*>PyTuple_GET_ITEM(headers, at)
        values = <PyObject*>PyTuple_GET_ITEM(headers, at + 1)
        if not PyUnicode_CheckExact(<object>name):
            return 0
        entry = _header_entry(<object>name)
        if entry is None:
            continue
        if entry is _NO or count == _COPIED_MAX:
            return 0
        if type(<object>values) is not str and type(<object>values) is not tuple:
            return 0
        attribute = <PyObject*>PyTuple_GET_ITEM(entry, 0)
        for j in range(count):
            if copied[j] == attribute:
                return 0
        copied[count] = attribute
        count += 1
        if not put_header_values(s, <bytes>PyTuple_GET_ITEM(entry, 1), <object>values):
            return 0
    return 1


cdef int put_headers(Buf* s, object headers, object allowlist) except -1:
    """The copied headers (a `TraceHeaders`: the mapper takes no other): from the cache, or,
    for what it does not write, the generic way."""
    cdef Py_ssize_t mark = s.size
    if put_headers_cached(s, headers, allowlist):
        return 1
    s.size = mark
    return put_headers_generic(s, headers, allowlist)
