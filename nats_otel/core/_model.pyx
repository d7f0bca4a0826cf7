# cython: language_level=3, boundscheck=False, wraparound=False
"""The compiled twins of `model`'s `__post_init__` hooks (see there), and of the fast decode's
in `decode`: msgspec calls one per decoded struct (server, every event, the request and the
document), and the Python ones were a visible share of decoding.
Same checks, same fields set; anything out of range goes to the Python twins, which raise
exactly what the pure path raises."""

from msgspec.structs import force_setattr

cdef object _parse = None
cdef object _py_timestamp = None
cdef object _py_check_uint64 = None
cdef object _U64 = 2 ** 64


def configure(parse, py_timestamp, py_check_uint64):
    """The RFC 3339 parser in use and the Python twins, for what is out of range."""
    global _parse, _py_timestamp, _py_check_uint64
    _parse, _py_timestamp, _py_check_uint64 = parse, py_timestamp, py_check_uint64


cdef inline object _ns(object text):
    ns = _parse(text)
    if ns < 0 or ns >= _U64:
        return _py_timestamp(text)  # raises the pure path's error
    return ns


def event_post_init(self):
    """`_Event.__post_init__`: `ts_ns` from `ts`."""
    force_setattr(self, "ts_ns", _ns(self.ts))


def connection_post_init(self):
    """`Ingress`/`Egress.__post_init__`: `cid` within a uint64, then as any event."""
    cid = self.cid
    if cid >= _U64:
        _py_check_uint64("cid", cid)
    force_setattr(self, "ts_ns", _ns(self.ts))


def server_post_init(self):
    """`ServerInfo.__post_init__`: `seq` within a uint64, `time_ns` from `time`."""
    seq = self.seq
    if seq >= _U64:
        _py_check_uint64("seq", seq)
    time = self.time
    if time is not None:
        force_setattr(self, "time_ns", _ns(time))


def request_post_init(self):
    """`decode._Request.__post_init__`: `msgsize` within a uint64."""
    msgsize = self.msgsize
    if msgsize >= _U64:
        _py_check_uint64("msgsize", msgsize)


def document_post_init(self):
    """`decode._Document.__post_init__`: `hops` within a uint64."""
    hops = self.hops
    if hops >= _U64:
        _py_check_uint64("hops", hops)
