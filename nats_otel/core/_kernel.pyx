# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The compiled kernel: the core's hot path, one extension, behind the API `engine` exports.

A raw trace message goes prepare -> link -> map and encode -> network, then into export
requests; each stage is an include below (`_stage_*.pxi`), the compiled counterpart of one
pure-Python module, which is the reference (prepare's JSON is the kernel's own parse,
`_stage_parse.pxi` over `_json.pxi`, for the shape servers send; msgspec's decode otherwise): the same records, bytes, counters and errors
(the golden files test the reference; tests/core runs every core test on both, through
the `core` fixture).

The kernel imports what it uses from the pure modules itself: the record types, their
constants, and the reference functions a message goes to when the kernel does not take it
(a payload to decompress with an unusual encoding, an event type it does not know, an odd
value...). Nothing is handed to it. Those modules never import it: `engine` chooses it, so
the core's imports run one way. A message a stage hands to the reference is counted
(`handed_to_reference`: the bridge's `nats_otel_core_reference_total`).

Below it sits one leaf, `_primitives` (msgspec's hooks, RFC 3339, the context's id
fields), which the decoding modules choose when their classes are made; the kernel
cimports from it.
"""

cimport cython
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.dict cimport PyDict_GetItemWithError, PyDict_Next, PyDict_SetItem, PyDict_Size
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from cpython.long cimport PyLong_AsLongLongAndOverflow, PyLong_AsUnsignedLongLong
from cpython.object cimport PyObject
from cpython.pyport cimport PY_SSIZE_T_MAX
from cpython.ref cimport Py_INCREF
from cpython.tuple cimport PyTuple_GET_SIZE, PyTuple_New, PyTuple_SET_ITEM
from libc.string cimport memcpy, memset

from nats_otel.core._primitives cimport context_fields_c

cdef extern from "Python.h":
    bint PyUnicode_IS_ASCII(object unicode)
    unsigned char* PyUnicode_1BYTE_DATA(object unicode)
    Py_ssize_t PyUnicode_GET_LENGTH(object unicode)
    object PyUnicode_New(Py_ssize_t size, Py_UCS4 maxchar)
    PyObject* PyDict_SetDefault(object d, object key, object default) except NULL
    PyObject** PySequence_Fast_ITEMS(object o)  # a list's or tuple's item array, borrowed

from bisect import bisect_left
from collections import deque
from collections.abc import Sequence
from itertools import islice

from msgspec.structs import force_setattr as _force_setattr

# The pure modules: the records and constants read here, and the references.
from nats_otel.core.decode import _DOCUMENT, DecodeError as _DecodeError, DecodeLimits
from nats_otel.core.decode import RawTraceMessage as _RawTraceMessage, _Document, decompress as _decompress
from nats_otel.core.decode import _Request as _DecodedRequest
from nats_otel.core.ids import _POSITIONS, _ROLE_PREFIX, TraceContext as _TraceContext
from nats_otel.core.ids import _fields as _reference_fields, _role as _reference_role, adhoc_trace_id as _adhoc_trace_id
from nats_otel.core.ids import TRACE_DISABLED as _TRACE_DISABLED_, context_id as _reference_context_id
from nats_otel.core.ids import event_span_id as _reference_event_span_id
from nats_otel.core.ids import parse_traceparent as _reference_parse_traceparent
from nats_otel.core.ids import server_span_id as _reference_server_span_id
from nats_otel.core.ids import trace_context as _trace_context, upstream_hop as _upstream_hop
from nats_otel.core.linking import AMBIGUOUS as _AMBIGUOUS, MATCHED as _MATCHED, UNMATCHED as _UNMATCHED
from nats_otel.core.link_latency import LinkLatency as _LinkLatency
from nats_otel.core.linking import Arrival as _Arrival, Egress as _LinkEgress, Link as _Link, LinkSettings
from nats_otel.core.mapping import _NOT_FAILURES as _NOT_FAILURES_, HEADER_ATTRIBUTE_PREFIX, MappingOptions
from nats_otel.core.mapping import Placement as _Placement, map_message as _map_message
from nats_otel.core.mapping import server_resource as _server_resource
from nats_otel.core.model import _KIND_LABELS as _KIND_LABELS_, FORWARDING_KINDS
from nats_otel.core.model import Egress as _EgressEvent, Ingress as _Ingress, JetStreamEvent as _JetStreamEvent
from nats_otel.core.model import ServerInfo as _ServerInfo, ServerReport as _ServerReport, ServiceImport as _ServiceImport
from nats_otel.core.model import StreamExport as _StreamExport, SubjectMapping as _SubjectMapping
from nats_otel.core.model import NO_HEADERS as _NO_HEADERS, TraceHeaders as _TraceHeaders, TraceMessage as _TraceMessage
from nats_otel.core.network import HopSample as _HopSample, NetworkSample as _NetworkSample
from nats_otel.core.network import network_sample as _reference_network_sample
from nats_otel.core.otlp_wire import _UNCACHED_PREFIX as _uncached_prefix, _key_value as _reference_key_value
from nats_otel.core.otlp_wire import _resource as _reference_resource, _span as _reference_span
from nats_otel.core.pipeline import _BAD_TRACEPARENT as _BAD_TRACEPARENT_, _MAX_DEPTH as _ADHOC_DEPTH_
from nats_otel.core.pipeline import Prepared as _Prepared, prepare as _reference_prepare
from nats_otel.core.results import Converted as _Converted, Rejected as _Rejected
from nats_otel.core.results import encode_results as _reference_encode_results
from nats_otel.core.results import tally_results as _reference_tally_results
from nats_otel.core.report_ledger import ReportLedger as _ReportLedger, _Member, _ServerRuns
from nats_otel.core.sequences import HopSequences as _HopSequences, _LinkPairs
from nats_otel.core.shapes import CONTEXT_HEADERS, SERVER_HEADERS, SHAPE_DIGEST
from nats_otel.core.shapes import message_shape as _message_shape, shape_digest as _shape_digest
from nats_otel.core.span_bytes import _SCOPE as _encoded_scope, EncodedSpans as _EncodedSpans
from nats_otel.core.span_bytes import python_encode_request as _reference_request
from nats_otel.core.span_bytes import python_map_encode as _reference_map_encode
from nats_otel.core.span_layout import ROLES as _ROLES, SLOT_NAMES as _SLOT_NAMES, LayoutChanged as _LayoutChanged
from nats_otel.core.span_layout import layouts as _layouts

__all__ = ["IMPLEMENTATION", "Converter", "LinkIndex", "Linker", "convert_batch", "encode_request", "encode_results",
           "encode_spans", "event_span_id", "finish", "handed_to_reference", "map_encode", "network_sample",
           "observed", "observed_entries", "parse_traceparent", "prepare", "server_span_id",
           "tally_results"]

IMPLEMENTATION = "compiled"

cdef object _UNSET = object()
cdef str _HOP_HEADER = "nats-trace-hop"
cdef object _SHAPE_DIGEST = SHAPE_DIGEST
cdef frozenset _FORWARDING = frozenset(FORWARDING_KINDS)
# `kind in FORWARDING_KINDS` for the exact ints the parse makes, as a bit per kind below 64:
# the set holds IntEnum members, and a plain int found in it is compared through the rich
# comparison's slow path (~160 instructions, several times a message).
cdef unsigned long long _FORWARDING_BITS = 0
for _kind in FORWARDING_KINDS:
    if not 0 <= _kind < 64:
        raise ImportError(f"a forwarding kind the kernel cannot hold as a bit: {_kind}")
    _FORWARDING_BITS |= 1ULL << int(_kind)
# `shapes.SERVER_HEADERS` and `CONTEXT_HEADERS` in one look-up: a lowered name -> True for
# a server's header, False for the trace context's (a server's wins, as in `message_shape`).
cdef dict _HEADER_CLASS = {**{name: False for name in CONTEXT_HEADERS}, **{name: True for name in SERVER_HEADERS}}
cdef tuple _NOT_FAILURES = tuple(_NOT_FAILURES_)
cdef dict _KIND_LABELS = dict(_KIND_LABELS_)
cdef tuple _BAD_TRACEPARENT = tuple(_BAD_TRACEPARENT_)
cdef int _ADHOC_DEPTH = _ADHOC_DEPTH_
cdef tuple _QUIET_EVENTS = (_SubjectMapping, _StreamExport, _ServiceImport)  # events that carry no error
cdef bytes _SERVER_PREFIX = _ROLE_PREFIX[b"server"]
cdef bytes _EVENT_PREFIX = _ROLE_PREFIX[b"event"]
cdef object _DEFAULT_OPTIONS = MappingOptions()
cdef object _DEFAULT_LIMITS = DecodeLimits()
cdef object _DEFAULT_LINK = LinkSettings()
cdef object _UNMATCHED_LINK = _Link(_UNMATCHED)  # immutable: one for every unmatched arrival
cdef object _decode_document = _DOCUMENT.decode


cdef object _DEQUE_APPEND = deque.append  # the method itself: no look-up on the object per call


cdef inline void _append(object fifo, object item) except *:
    # `fifo.append(item)`, for an exact deque without finding the method each time
    if type(fifo) is deque:
        _DEQUE_APPEND(fifo, item)
    else:
        fifo.append(item)


cdef inline bint _truthy(object value) except -1:
    # `bool(value)` for the values the records hold, without CPython's generic truth test (a
    # str's, a tuple's, a list's or a dict's length through its type's slots, ~25
    # instructions, ~17 times a message): those read here, anything else as Python does.
    if value is None:
        return False
    if type(value) is str:
        return PyUnicode_GET_LENGTH(value) != 0
    if type(value) is tuple:
        return PyTuple_GET_SIZE(value) != 0
    if type(value) is list:
        return PyList_GET_SIZE(value) != 0
    if type(value) is dict:
        return PyDict_Size(value) != 0
    if type(value) is _TraceHeaders:  # its length is a Python method: its items read in C
        return PyTuple_GET_SIZE(value) != 0
    return bool(value)


cdef inline object _or(object value, object default):
    # `value or default`, with `_truthy`
    return value if _truthy(value) else default


cdef inline bint _forwards(object kind) except -1:
    # `kind in FORWARDING_KINDS`: a bit test for an exact int (what the parse makes), the
    # set for anything else (an IntEnum member, a big number)
    cdef long long value
    cdef int overflow
    if type(kind) is int:
        value = PyLong_AsLongLongAndOverflow(kind, &overflow)
        if overflow == 0 and 0 <= value < 64:
            return (_FORWARDING_BITS >> value) & 1
    return kind in _FORWARDING


# --- what the kernel hands to the reference -----------------------------------------------

cdef enum:
    H_PREPARE = 0   # a message prepare does not take: decoded and its context found by the reference
    H_MAP = 1       # a message whose spans the reference maps and encodes
    H_NETWORK = 2   # a message whose network sample the reference takes
    H_REQUEST = 3   # a batch the reference writes into a request
cdef Py_ssize_t _handed[4]
_handed[:] = [0, 0, 0, 0]
_HANDED_STAGES = ("prepare", "map", "network", "request")


def handed_to_reference():
    """How many messages (batches, for "request") each stage handed to the pure-Python
    reference since the process started: what it did not take (see each stage)."""
    return {stage: _handed[i] for i, stage in enumerate(_HANDED_STAGES)}


include "_fields.pxi"
include "_records.pxi"
include "_protobuf.pxi"

# The span layouts the mapping stage writes, read from mapping.py (`span_layout`).
try:
    _LAYOUTS = _layouts()
except _LayoutChanged as exc:
    raise ImportError(f"mapping.py makes spans the kernel does not write: {exc}") from exc

include "_stage_ids.pxi"
include "_stage_record.pxi"
include "_json.pxi"
include "_parse_specs.pxi"
include "_parse_kept.pxi"
include "_parse_result.pxi"
include "_stage_parse.pxi"
include "_stage_snappy.pxi"
include "_stage_prepare.pxi"
include "_stage_ledger.pxi"
include "_link_buckets.pxi"
include "_stage_link.pxi"
include "_stage_headers.pxi"
include "_stage_pairs.pxi"
include "_stage_map.pxi"
include "_stage_wire.pxi"
include "_stage_network.pxi"
include "_stage_convert.pxi"
include "_stage_batch.pxi"
