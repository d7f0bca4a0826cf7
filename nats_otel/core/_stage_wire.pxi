# The compiled twin of `otlp_wire` (see there): span records -> one serialized
# `ExportTraceServiceRequest`, written into one C buffer.
#
# The pure-Python `otlp_wire` is the reference: the same input gives the same bytes (tests
# check it on the corpus, on generated and on fuzzed input). The Python version builds a
# bytes object per field and joins them; here each span is written in place and only the
# cached (key, value) pairs are Python objects. Anything this file does not handle in C
# (a value of an unusual type, an int over 64 bits, a string with lone surrogates, a
# malformed record) is handed to the Python twin for that pair or span, so odd input gives
# the same bytes, or the same exception, on both paths.
#



# (key, value) -> encoded KeyValue entry, per parent field number (1: Resource, 9: Span).
cdef dict _pairs_resource = {}
cdef dict _pairs_span = {}


def cached_pairs(int number):
    """The (key, value) pairs cached for parent field `number` (tests: what is not cached)."""
    return list(_pairs_span if number == 9 else _pairs_resource)


def clear_caches():
    """Forget every cached pair (tests)."""
    _pairs_span.clear()
    _pairs_resource.clear()


cdef int put_attributes(Buf* b, unsigned char number, object attributes) except -1:
    """`otlp_wire._attributes`: cached pairs copied, the others encoded (and cached)."""
    cdef dict cache = _pairs_span if number == 9 else _pairs_resource
    cdef Py_ssize_t i, n, start
    cdef PyObject* hit
    cdef object pair, encoded
    if not PyTuple_Check(attributes):
        return 0
    n = PyTuple_GET_SIZE(attributes)
    for i in range(n):
        pair = <object>PyTuple_GET_ITEM(attributes, i)
        if not PyTuple_Check(pair) or PyTuple_GET_SIZE(pair) != 2:
            return 0
        try:
            hit = PyDict_GetItemWithError(cache, pair)
        except TypeError:  # unhashable: the Python twin raises it
            return 0
        if hit != NULL:
            put_bytes(b, <bytes>hit)
            continue
        start = b.size
        if not put_key_value(b, number, <object>PyTuple_GET_ITEM(pair, 0), <object>PyTuple_GET_ITEM(pair, 1)):
            b.size = start
            encoded = _reference_key_value(number, <object>PyTuple_GET_ITEM(pair, 0), <object>PyTuple_GET_ITEM(pair, 1))
            put_bytes(b, encoded)
        else:
            encoded = None
        key = <object>PyTuple_GET_ITEM(pair, 0)
        if PyUnicode_CheckExact(key) and PyUnicode_Tailmatch(key, _uncached_prefix, 0, len(key), -1):
            continue
        if encoded is None:
            encoded = PyBytes_FromStringAndSize(b.data + start, b.size - start)
        if PyDict_Size(cache) >= _CACHE_LIMIT:
            cache.clear()  # subjects and names are unbounded: keep memory bounded
        PyDict_SetItem(cache, pair, encoded)
    return 1


# --- spans ------------------------------------------------------------------------------

cdef int put_span_fields(Buf* b, object span) except -1:
    """A Span message's fields, as `otlp_wire._span`; 0 if the span must go to Python."""
    cdef object trace_id, span_id, parent, name, kind, start, end, attributes, code, message, state
    cdef uint64_t v, start_ns, end_ns
    cdef Buf status
    if not PyTuple_Check(span) or PyTuple_GET_SIZE(span) != 12:
        return 0
    trace_id = <object>PyTuple_GET_ITEM(span, 0)
    span_id = <object>PyTuple_GET_ITEM(span, 1)
    parent = <object>PyTuple_GET_ITEM(span, 2)
    name = <object>PyTuple_GET_ITEM(span, 3)
    kind = <object>PyTuple_GET_ITEM(span, 4)
    start = <object>PyTuple_GET_ITEM(span, 5)
    end = <object>PyTuple_GET_ITEM(span, 6)
    attributes = <object>PyTuple_GET_ITEM(span, 8)
    code = <object>PyTuple_GET_ITEM(span, 9)
    message = <object>PyTuple_GET_ITEM(span, 10)
    state = <object>PyTuple_GET_ITEM(span, 11)
    if not (PyBytes_CheckExact(trace_id) and PyBytes_CheckExact(span_id) and PyBytes_CheckExact(parent)
            and PyUnicode_CheckExact(state) and PyUnicode_CheckExact(message)
            and type(kind) is int and type(code) is int and type(start) is int and type(end) is int):
        return 0
    try:
        start_ns = PyLong_AsUnsignedLongLong(start)
        end_ns = PyLong_AsUnsignedLongLong(end)
    except OverflowError:  # Python's struct.error, from the twin
        return 0
    if not put_ids(b, trace_id, span_id, state, parent):
        return 0
    if not put_utf8(b, 5, name):
        return 0
    if not int_as_varint(kind, &v):
        return 0
    put_byte(b, 0x30)
    put_varint(b, v)
    put_times(b, start_ns, end_ns)
    if not put_attributes(b, 9, attributes):
        return 0
    if code or len(message):
        buf_init(&status, 64)
        try:
            if len(message) and not put_utf8(&status, 2, message):
                return 0
            if code:
                if not int_as_varint(code, &v):
                    return 0
                put_byte(&status, 0x18)
                put_varint(&status, v)
            put_field(b, 15, status.data, status.size)
        finally:
            buf_free(&status)
    return 1


cdef int put_span(Buf* group, Buf* scratch, object span) except -1:
    """One ScopeSpans.spans entry (field 2)."""
    cdef bytes encoded
    scratch.size = 0
    if put_span_fields(scratch, span):
        return put_field(group, 2, scratch.data, scratch.size)
    encoded = _reference_span(span)  # the twin encodes it, or raises what the pure path raises
    return put_field(group, 2, PyBytes_AS_STRING(encoded), PyBytes_GET_SIZE(encoded))


# --- requests: spans grouped by resource -------------------------------------------------
#
# A request is ~0.5 MB for 512 messages. It is written straight into its bytes object, sized
# first: growing a buffer of that size by doubling, then copying it, page-faulted enough
# fresh memory to cost more than the pure-Python join.

cdef enum:
    _IDENTITY_SCAN = 16  # groups looked up by identity before the dict (a Resource's hash is a Python call)


cdef Py_ssize_t group_of(list resources, dict index, object resource) except -1:
    """The group (position in `resources`) of `resource`, appended if it has none: grouped as
    a dict keyed by the resources groups them (equal resources together, in order of first
    appearance). The mapper hands out one object per server, so identity finds it first."""
    cdef Py_ssize_t i, count = len(resources)
    for i in range(count if count < _IDENTITY_SCAN else _IDENTITY_SCAN):
        if resources[i] is resource:
            return i
    found = index.get(resource)
    if found is not None:
        return found
    index[resource] = count
    resources.append(resource)
    return count


cdef inline char* put_head(char* p, unsigned char number, Py_ssize_t size):
    """A length-delimited field's tag and length at `p` (in the sized request: no `Buf` to
    grow); returns where its payload goes."""
    p[0] = <char>(number << 3 | 2)
    return write_varint(p + 1, <uint64_t>size)


cdef inline char* put_raw(char* p, bytes data):
    memcpy(p, PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data))
    return p + PyBytes_GET_SIZE(data)


cdef class _Request:
    """One request being written: ExportTraceServiceRequest { ResourceSpans (1) { resource (1),
    ScopeSpans (2) { scope (1), spans (2)... } }... }, one ResourceSpans per group, sized by
    `size` from the groups' span bytes before `begin` allocates it."""
    cdef list heads  # each group's encoded resource (field 1)
    cdef bytes scope
    cdef bytes out
    cdef char* p

    def __cinit__(self, list resources, bytes scope):
        self.heads = [_reference_resource(resource) for resource in resources]
        self.scope = scope

    cdef Py_ssize_t _inner(self, Py_ssize_t spans):
        return 1 + varint_size(<uint64_t>PyBytes_GET_SIZE(self.scope)) + PyBytes_GET_SIZE(self.scope) + spans

    cdef Py_ssize_t _outer(self, Py_ssize_t group, Py_ssize_t spans):
        cdef Py_ssize_t inner = self._inner(spans)
        return PyBytes_GET_SIZE(self.heads[group]) + 1 + varint_size(<uint64_t>inner) + inner

    cdef Py_ssize_t size(self, Py_ssize_t group, Py_ssize_t spans):
        """The bytes of one group's ResourceSpans with `spans` bytes of encoded spans."""
        cdef Py_ssize_t outer = self._outer(group, spans)
        return 1 + varint_size(<uint64_t>outer) + outer

    cdef int begin(self, Py_ssize_t total) except -1:
        self.out = PyBytes_FromStringAndSize(NULL, total)
        self.p = PyBytes_AS_STRING(self.out)
        return 0

    cdef int open_group(self, Py_ssize_t group, Py_ssize_t spans) except -1:
        """A group's fields up to its spans, which the caller copies next."""
        self.p = put_head(self.p, 1, self._outer(group, spans))
        self.p = put_raw(self.p, self.heads[group])
        self.p = put_head(self.p, 2, self._inner(spans))
        self.p = put_head(self.p, 1, PyBytes_GET_SIZE(self.scope))
        self.p = put_raw(self.p, self.scope)
        return 0


def encode_spans(spans, bytes scope):
    """`otlp_wire.encode_export_request(group_by_resource(spans), scope)`, in one pass over
    the spans (each encoded into its group's buffer), then one copy into the request."""
    cdef list resources = []
    cdef dict index = {}
    cdef Buf* groups = NULL
    cdef Py_ssize_t count = 0, cap = 0, at, i, total = 0
    cdef Buf scratch
    cdef Buf* grown
    cdef object span
    cdef _Request request
    buf_init(&scratch, 512)
    try:
        for span in spans:
            at = group_of(resources, index, span.resource)
            if at == count:
                if count == cap:
                    cap = cap * 2 if cap else 4
                    grown = <Buf*>PyMem_Realloc(groups, cap * sizeof(Buf))
                    if grown == NULL:
                        raise MemoryError()
                    groups = grown
                groups[at].data = NULL
                buf_init(&groups[at], 4096)
                count += 1
            put_span(&groups[at], &scratch, span)
        request = _Request(resources, scope)
        for i in range(count):
            total += request.size(i, groups[i].size)
        request.begin(total)
        for i in range(count):
            request.open_group(i, groups[i].size)
            memcpy(request.p, groups[i].data, groups[i].size)
            request.p += groups[i].size
        return request.out
    finally:
        for i in range(count):
            buf_free(&groups[i])
        PyMem_Free(groups)
        buf_free(&scratch)


# --- requests of spans already encoded (span_bytes) ---------------------------------------

cdef object _request_by_reference(object items):
    _handed[H_REQUEST] += 1
    return _reference_request(items)


def encode_request(items):
    """`span_bytes.python_encode_request(items)`: a list of each message's `EncodedSpans` in
    one request, grouped by resource as `encode_request` groups spans. Anything else (another
    container, an item of another type, data that is not bytes) goes to the reference, all of
    it: the same bytes, or the same error."""
    cdef list resources = []
    cdef dict index = {}
    cdef Py_ssize_t n, i, group, count = 0, total = 0
    cdef Py_ssize_t* links = NULL
    cdef Py_ssize_t* next_item
    cdef Py_ssize_t* first
    cdef Py_ssize_t* last
    cdef Py_ssize_t* sizes
    cdef object item, data
    cdef _Request request
    if type(items) is not list:
        return _request_by_reference(items)
    n = len(items)
    if n == 0:
        return b""
    # Per item, the next item of its group; per group, its first and last items and span bytes.
    links = <Py_ssize_t*>PyMem_Malloc(4 * n * sizeof(Py_ssize_t))
    if links == NULL:
        raise MemoryError()
    next_item, first, last, sizes = links, links + n, links + 2 * n, links + 3 * n
    try:
        for i in range(n):
            item = items[i]
            if type(item) is not _EncodedSpans:
                return _request_by_reference(items)
            data = <object>PyTuple_GET_ITEM(item, 1)
            if not PyBytes_CheckExact(data):
                return _request_by_reference(items)
            group = group_of(resources, index, <object>PyTuple_GET_ITEM(item, 0))
            next_item[i] = -1
            if group == count:
                first[group], sizes[group] = i, 0
                count += 1
            else:
                next_item[last[group]] = i
            last[group] = i
            sizes[group] += PyBytes_GET_SIZE(data)
        request = _Request(resources, _encoded_scope)
        for group in range(count):
            total += request.size(group, sizes[group])
        request.begin(total)
        for group in range(count):
            request.open_group(group, sizes[group])
            i = first[group]
            while i >= 0:
                request.p = put_raw(request.p, <bytes>PyTuple_GET_ITEM(items[i], 1))
                i = next_item[i]
        return request.out
    finally:
        PyMem_Free(links)


def encode_results(results, held=frozenset()):
    """`pipeline.encode_results`: the batch's items gathered in C (the bridge's per-batch pass
    over `convert_many`'s results, ~0.2 µs a message in Python), then `encode_request`.
    Anything but a list of `Converted` / `Rejected` with `EncodedSpans` or None, and `held`
    a frozenset, goes to the reference: the same bytes, or the same error."""
    cdef list items = []
    cdef Py_ssize_t at, spans = 0
    cdef bint holding
    if type(results) is not list or type(held) is not frozenset:
        return _reference_encode_results(results, held)
    holding = len(<frozenset>held) != 0
    for at in range(len(<list>results)):
        result = (<list>results)[at]
        if type(result) is not _Converted:
            if type(result) is _Rejected:
                continue
            return _reference_encode_results(results, held)
        encoded = field(result, CONVERTED.encoded)
        if encoded is None or (holding and at in held):
            continue
        if type(encoded) is not _EncodedSpans or type(<object>PyTuple_GET_ITEM(encoded, 2)) is not int:
            return _reference_encode_results(results, held)
        spans += <Py_ssize_t>(<object>PyTuple_GET_ITEM(encoded, 2))
        items.append(encoded)
    return (encode_request(items) if spans else b""), spans


def tally_results(results):
    """`pipeline.tally_results` in one pass in C: what the bridge's accounting counts of every
    batch, on the event loop (~0.9k instructions a message fewer than the reference's
    comprehensions, issue 48). Anything but a list of `Converted` / `Rejected` whose links
    are strings and issues lists goes to the reference: the same tally, or the same error."""
    cdef Py_ssize_t at, decoded = 0
    cdef dict links = {}
    cdef list issues = [], samples = []
    cdef PyObject* count
    if type(results) is not list:
        return _reference_tally_results(results)
    for at in range(len(<list>results)):
        result = (<list>results)[at]
        if type(result) is not _Converted:
            if type(result) is _Rejected:
                continue
            return _reference_tally_results(results)
        link = field(result, CONVERTED.link)
        found = field(result, CONVERTED.issues)
        if type(link) is not str or type(found) is not list:
            return _reference_tally_results(results)
        decoded += 1
        if PyUnicode_GET_LENGTH(link):
            count = PyDict_GetItemWithError(links, link)
            links[link] = 1 if count is NULL else <object>count + 1
        if PyList_GET_SIZE(found):
            issues.extend(found)
        network = field(result, CONVERTED.network)
        if network is not None:
            samples.append(network)
    return decoded, links, issues, samples
