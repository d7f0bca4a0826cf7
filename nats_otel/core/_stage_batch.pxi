# The compiled twin of `results.EncodedBatch` (see there, the reference): a batch converted
# straight into its export request. `Converter.convert_encoded` calls `_convert_encoded`.
#
# The reference converts the batch (`convert_many`, one `Converted` a message with its
# `EncodedSpans` and their bytes), then writes the request from the results
# (`encode_results`) and counts them (`tally_results`). Here each message's spans are written
# by the mapper into one buffer as it converts the message, its issues into the batch's one
# list and its network sample into the batch's list; what `results` would hold of it is
# kept in a C record (`_Placed`), and its `Converted` is made only if the batch is indexed
# (a backend refusing the batch, worker processes). In issue 48's burst the results were
# made, their bytes copied into the request, counted and freed on the event loop's thread:
# ~10 % of the bridge's CPU (docs/performance.md, session 49).
#
# The request is `encode_request`'s: the groups of spans by resource in the order their
# resources first appear, each group's messages in order (the mapper hands one resource
# object per server, `group_of`).

cdef struct _Placed:
    # One message of a batch, as `EncodedBatch` makes its result when asked. References
    # held by the batch: `rejected`, `link`, `network` (each NULL when it has none).
    PyObject* rejected      # its `Rejected`; NULL when it was converted
    PyObject* link          # `Converted.link`
    PyObject* network       # `Converted.network` (None is held too)
    Py_ssize_t group        # its resource's position in the batch's groups
    Py_ssize_t start        # its spans' bytes: in the batch buffer, then (`_write`) in the request
    Py_ssize_t size
    Py_ssize_t span_count
    Py_ssize_t issues_from  # its issues: `issues[issues_from:issues_to]`
    Py_ssize_t issues_to
    Py_ssize_t next         # the next message of its group, or -1 (the request's order)


# The buffer a batch's spans are written into, and the mapper's scratch for one span: kept
# from batch to batch (a request is ~0.5 MB, and fresh memory of that size is page-faulted
# anew each time), unless taken (a batch converted while another is: a thread switch in a
# reference call) or grown past `_BATCH_KEPT_MAX` by a batch of large messages.
cdef Buf _batch_blob, _batch_span
cdef bint _batch_taken = False
buf_init(&_batch_blob, 1 << 16)
buf_init(&_batch_span, 512)

cdef enum:
    _BATCH_KEPT_MAX = 1 << 23


@cython.final
cdef class EncodedBatch:
    """A batch converted straight into its export request: `results.EncodedBatch`'s twin (the
    same request, counts and, indexed, results)."""

    cdef readonly bytes request
    cdef readonly Py_ssize_t spans
    cdef readonly Py_ssize_t decoded
    cdef readonly dict links
    cdef readonly list issues
    cdef readonly list samples
    cdef readonly list rejected  # the `Rejected` among the results, in order
    cdef list _resources  # each group's resource, in the request's order
    cdef _Placed* _placed
    cdef Py_ssize_t _count
    cdef list _results  # made on first use (`_made`)

    def __cinit__(self):
        self.request = b""
        self.links, self.issues, self.samples, self.rejected, self._resources = {}, [], [], [], []

    def __dealloc__(self):
        cdef Py_ssize_t i
        if self._placed is NULL:
            return
        for i in range(self._count):
            Py_XDECREF(self._placed[i].rejected)
            Py_XDECREF(self._placed[i].link)
            Py_XDECREF(self._placed[i].network)
        PyMem_Free(self._placed)
        self._placed = NULL

    def __len__(self):
        return self._count

    def __getitem__(self, index):
        return self._made()[index]

    def __iter__(self):
        return iter(self._made())

    cdef list _made(self):
        """Each message's result, as `convert_many(..., encoded=True)` gives it (made once)."""
        cdef Py_ssize_t i
        cdef _Placed* placed
        if self._results is not None:
            return self._results
        out = []
        for i in range(self._count):
            placed = &self._placed[i]
            if placed.rejected is not NULL:
                out.append(<object>placed.rejected)
                continue
            data = PyBytes_FromStringAndSize(PyBytes_AS_STRING(self.request) + placed.start, placed.size)
            converted = _struct_new(_Converted)  # as `_finish` makes it
            set_field(converted, CONVERTED.spans, [])
            set_field(converted, CONVERTED.issues, self.issues[placed.issues_from:placed.issues_to])
            set_field(converted, CONVERTED.link, <object>placed.link)
            set_field(converted, CONVERTED.network, <object>placed.network)
            set_field(converted, CONVERTED.encoded,
                      _record3(_EncodedSpans, self._resources[placed.group], data, placed.span_count))
            out.append(converted)
        self._results = out
        return out

    cdef int _write(self, Buf* blob, Py_ssize_t* groups) except -1:
        """The request: each group's messages' spans from `blob`, grouped as `encode_request`
        groups them (`groups[2 * group]`: its first message, `[2 * group + 1]`: its span
        bytes); each message's `start` moved to where its spans are in it."""
        cdef _Request request = _Request(self._resources, _encoded_scope)
        cdef Py_ssize_t group, i, total = 0
        cdef char* base
        for group in range(len(self._resources)):
            total += request.size(group, groups[2 * group + 1])
        request.begin(total)
        base = PyBytes_AS_STRING(request.out)
        for group in range(len(self._resources)):
            request.open_group(group, groups[2 * group + 1])
            i = groups[2 * group]
            while i >= 0:
                memcpy(request.p, blob.data + self._placed[i].start, self._placed[i].size)
                self._placed[i].start = request.p - base
                request.p += self._placed[i].size
                i = self._placed[i].next
        self.request = request.out
        return 0


Sequence.register(EncodedBatch)


cdef EncodedBatch _convert_encoded(Converter converter, list raws, list entries, object now):
    """`EncodedBatch(convert_many(raws, now, True, entries))`, the index expired already:
    `entries` checked (`_aligned`), each let go as its message is converted (as
    `convert_many` replaces it by its result); without them (None), each message's found as
    `convert_many` finds it, when its turn comes."""
    global _batch_taken
    cdef EncodedBatch batch = EncodedBatch.__new__(EncodedBatch)
    cdef Py_ssize_t n = len(raws if entries is None else entries), at, group
    cdef object linker = converter.linker, options = converter.options, index = linker.index
    cdef Buf own_blob, own_span
    cdef Buf* blob = &_batch_blob
    cdef Buf* s = &_batch_span
    cdef bint kept = not _batch_taken
    # Per group, from `groups[2 * group]`: its first message and its span bytes; per message
    # (`_Placed.next`), the next of its group. `last` of each group while they are linked.
    cdef Py_ssize_t* groups = NULL
    cdef Py_ssize_t* last = NULL
    cdef Py_ssize_t group_cap = 0
    cdef dict groups_of = {}  # `group_of`'s index of the resources
    cdef _Placed* placed
    own_blob.data = own_span.data = NULL
    batch._placed = <_Placed*>PyMem_Malloc((n if n else 1) * sizeof(_Placed))
    if batch._placed is NULL:
        raise MemoryError()
    memset(batch._placed, 0, (n if n else 1) * sizeof(_Placed))
    if kept:
        _batch_taken = True
        blob.size = 0
    else:
        blob, s = &own_blob, &own_span
    try:
        if not kept:
            buf_init(blob, 1 << 16)
            buf_init(s, 512)
        for at in range(n):
            if entries is None:
                entry = converter._entry_of(raws[at], now, index)
            else:
                entry = entries[at]
                entries[at] = None  # the entry, and the message it decoded, freed once converted
            placed = &batch._placed[at]
            batch._count = at + 1
            placed.next = -1
            if type(entry) is not MessageRecord:  # (raw, its `Rejected`, None)
                result = (<tuple>entry)[1]
                Py_INCREF(result)
                placed.rejected = <PyObject*>result
                batch.rejected.append(result)
                continue
            opened = _convert_into(batch, blob, s, placed, <MessageRecord>entry, linker, options,
                                   (<MessageRecord>entry).egress_ids, groups_of)
            entry = None
            group = placed.group
            if opened:
                if group >= group_cap:
                    group_cap = group + 8
                    groups = <Py_ssize_t*>_grown(groups, 2 * group_cap * sizeof(Py_ssize_t))
                    last = <Py_ssize_t*>_grown(last, group_cap * sizeof(Py_ssize_t))
                groups[2 * group], groups[2 * group + 1] = at, 0
            else:
                batch._placed[last[group]].next = at
            last[group] = at
            groups[2 * group + 1] += placed.size
            batch.spans += placed.span_count
            batch.decoded += 1
        if batch.spans:
            batch._write(blob, groups)
    finally:
        PyMem_Free(groups)
        PyMem_Free(last)
        if kept:
            _batch_taken = False
            _give_back(blob, 1 << 16, _BATCH_KEPT_MAX)
            _give_back(s, 512, _KEPT_MAX)
        else:
            buf_free(blob)
            buf_free(s)
    return batch


cdef void* _grown(void* block, size_t size) except NULL:
    grown = PyMem_Realloc(block, size)
    if grown is NULL:
        raise MemoryError()
    return grown


cdef bint _convert_into(EncodedBatch batch, Buf* blob, Buf* s, _Placed* placed, MessageRecord record, object linker,
                        object options, object egress_ids, dict index) except -1:
    """`_finish(record, linker, options, True, egress_ids)` into the batch: the message's
    spans appended to `blob`, its issues to the batch's, its link and sample counted (what
    `tally_results` counts of its result). True when it opened a group (its resource new)."""
    cdef Py_ssize_t mark = blob.size, issues_from = len(batch.issues), groups = len(batch._resources)
    cdef PyObject* seen
    if type(linker) is Linker:
        placement = (<Linker>linker)._locate(record)
        link = (<Linker>linker).take_link()
    else:
        placement, link = linker.locate(record.prepared())
    prepared_issues = record.issues
    issues = batch.issues
    if _truthy(prepared_issues):
        issues.extend(prepared_issues)
    # the record is the message and its context
    resource = _spans_into(blob, s, record, record, placement, options, egress_ids, issues, &placed.span_count)
    network = _conclude(record, placement, link, issues)
    placement_link = _placement_link(placement)
    Py_INCREF(placement_link)
    placed.link = <PyObject*>placement_link
    Py_INCREF(network)
    placed.network = <PyObject*>network
    if _truthy(placement_link):
        seen = PyDict_GetItemWithError(batch.links, placement_link)
        batch.links[placement_link] = 1 if seen is NULL else <object>seen + 1
    if network is not None:
        batch.samples.append(network)
    placed.issues_from, placed.issues_to = issues_from, len(issues)
    placed.start, placed.size = mark, blob.size - mark
    placed.group = group_of(batch._resources, index, resource)
    return placed.group == groups
