# The attributes of the mapper's spans (`_stage_map.pxi`) as encoded KeyValue pairs (span
# field 9): each role's attribute positions, found by name in `span_layout`, and each
# position's pairs cached by value (`put_pair`), a client's `client.id` by its connection
# id (`put_client_id`), the layout's constants (`put_const`).

# The roles, in `span_layout.ROLES`' order (checked at import).
cdef enum:
    SERVER = 0
    EGRESS = 1
    MAPPING = 2
    EXPORT = 3
    IMPORT = 4
    JETSTREAM = 5

if _ROLES != ("server", "egress", "mapping", "export", "import", "jetstream"):
    raise ImportError(f"span_layout's roles changed: {_ROLES}")


cdef int _slot(str role, str name) except -1:
    """Where the attribute `name` of a `role` span is in its layout (`span_layout.SLOT_NAMES`):
    slots are found by name, so one added in mapping.py and span_layout renumbers nothing here."""
    return _SLOT_NAMES[role].index(name)


cdef int S_SUBJECT = _slot("server", "destination")
cdef int S_SIZE = _slot("server", "size")
cdef int S_ACCOUNT = _slot("server", "account")
cdef int S_KIND = _slot("server", "kind")
cdef int S_CID = _slot("server", "cid")
cdef int S_NAME = _slot("server", "name")
cdef int S_HOPS = _slot("server", "hops")
cdef int S_CLIENT_ID = _slot("server", "client.id")
cdef int S_HOP = _slot("server", "hop")
cdef int S_ONLY = _slot("server", "only")
cdef int S_ADHOC = _slot("server", "adhoc")
cdef int S_LINK = _slot("server", "link")
cdef int S_CANDIDATES = _slot("server", "candidates")
cdef int S_UNMAPPED = _slot("server", "unmapped")
cdef int S_NOTE = _slot("server", "note")
cdef int E_DEST = _slot("egress", "destination")
cdef int E_ACCOUNT = _slot("egress", "account")
cdef int E_KIND = _slot("egress", "kind")
cdef int E_CID = _slot("egress", "cid")
cdef int E_NAME = _slot("egress", "name")
cdef int E_CLIENT_ID = _slot("egress", "client.id")
cdef int E_SUB = _slot("egress", "subscription")
cdef int E_QUEUE = _slot("egress", "queue")
cdef int E_HOP = _slot("egress", "hop")
cdef int E_PEER = _slot("egress", "peer")
cdef int E_NOTE = _slot("egress", "note")
cdef int J_DEST = _slot("jetstream", "destination")
cdef int J_STREAM = _slot("jetstream", "stream")
cdef int J_NO_INTEREST = _slot("jetstream", "no_interest")
cdef int J_NOTE = _slot("jetstream", "note")
cdef int M_FROM = _slot("mapping", "from")
cdef int M_TO = _slot("mapping", "to")
cdef int X_ACCOUNT = _slot("export", "account")
cdef int X_SUBJECT = _slot("export", "subject")
cdef int I_ACCOUNT = _slot("import", "account")
cdef int I_FROM = _slot("import", "from")
cdef int I_TO = _slot("import", "to")

cdef enum:
    _CACHE_LIMIT = 65536  # entries per cache of encoded pairs: subjects and names are unbounded

cdef list _keys = [[key for key, _ in _LAYOUTS[role]] for role in _ROLES]      # per role: the attribute names
cdef list _consts = [[value for _, value in _LAYOUTS[role]] for role in _ROLES]  # per role: the probe's values
cdef list _caches = [[{} for _ in _LAYOUTS[role]] for role in _ROLES]  # per role, position: value -> encoded pair


# Each position's last value and its encoded pair, held: the parse gives a repeated name the
# same `str` object (`_json.pxi`'s cache), so most positions see the object they saw last and
# skip the dict (its hash and compare) for one pointer compare.
cdef enum:
    _LAST_PER_ROLE = 32
cdef PyObject* _last_value[6 * _LAST_PER_ROLE]
cdef PyObject* _last_pair[6 * _LAST_PER_ROLE]
if any(len(_LAYOUTS[role]) > _LAST_PER_ROLE for role in _ROLES):
    raise ImportError("a role has more attribute positions than put_pair keeps")


cdef int put_pair(Buf* b, int role, int index, object value) except -1:
    """One attribute (span field 9), cached per position by value; 0 if Python must do it."""
    cdef int slot = role * _LAST_PER_ROLE + index
    cdef PyObject* hit
    cdef PyObject* old_value
    cdef PyObject* old_pair
    cdef Py_ssize_t start
    if _last_value[slot] == <PyObject*>value:
        put_bytes(b, <bytes>_last_pair[slot])
        return 1
    cdef dict cache = <dict>(<list>_caches[role])[index]
    hit = PyDict_GetItemWithError(cache, value)  # values here are str, int or bool
    if hit != NULL:
        pair = <bytes>hit
        put_bytes(b, pair)
    else:
        start = b.size
        if not put_key_value(b, 9, (<list>_keys[role])[index], value):
            return 0
        if PyDict_Size(cache) >= _CACHE_LIMIT:
            cache.clear()  # subjects and names are unbounded: keep memory bounded
        pair = PyBytes_FromStringAndSize(b.data + start, b.size - start)
        PyDict_SetItem(cache, value, pair)
    # No Python code runs from here on (a str's or bytes' release runs none).
    old_value, old_pair = _last_value[slot], _last_pair[slot]
    Py_INCREF(value)
    Py_INCREF(pair)
    _last_value[slot], _last_pair[slot] = <PyObject*>value, <PyObject*>pair
    Py_XDECREF(old_value)
    Py_XDECREF(old_pair)
    return 1


# Per role (each has one `client.id` position): a connection id (int) -> its text's encoded pair.
cdef list _client_ids = [{} for _ in _ROLES]


cdef int put_client_id(Buf* b, int role, int index, object cid) except -1:
    """`put_pair(b, role, index, str(cid))`, the pair cached by the connection id itself: no
    text made and hashed per message for a client's connection (an int from the parse)."""
    cdef PyObject* hit
    cdef Py_ssize_t start
    cdef dict cache = <dict>_client_ids[role]
    if type(cid) is not int:
        return put_pair(b, role, index, str(cid))
    hit = PyDict_GetItemWithError(cache, cid)
    if hit != NULL:
        put_bytes(b, <bytes>hit)
        return 1
    start = b.size
    if not put_pair(b, role, index, str(cid)):
        return 0
    if PyDict_Size(cache) >= _CACHE_LIMIT:
        cache.clear()  # connection ids are unbounded: keep memory bounded
    PyDict_SetItem(cache, cid, PyBytes_FromStringAndSize(b.data + start, b.size - start))
    return 1


cdef inline int put_const(Buf* b, int role, int index) except -1:
    return put_pair(b, role, index, (<list>_consts[role])[index])
