"""The trace message one nats-server publishes for one traced message, as typed data.

Mirrors `MsgTraceEvent` of nats-server `server/msgtrace.go` (ADR-41), validated with
msgspec. Timestamps are integer nanoseconds since the epoch: the servers report
nanoseconds and `datetime` would drop them. Events of a type this version does not know
are kept aside, raw, so the rest of the message can still be mapped.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping
from typing import Annotated, Any

from msgspec import Meta, Struct
from msgspec.structs import force_setattr

from nats_otel.core import accel
from nats_otel.core.timestamps import parse_rfc3339_ns

__all__ = [
    "FORWARDING_KINDS",
    "NO_HEADERS",
    "ConnectionKind",
    "Egress",
    "HeaderMapping",
    "Ingress",
    "JetStreamEvent",
    "ServerInfo",
    "ServerReport",
    "ServiceImport",
    "StreamExport",
    "SubjectMapping",
    "TraceEvent",
    "TraceHeaders",
    "TraceMessage",
    "UInt64",
    "check_uint64",
    "first_values",
    "kind_label",
]


class ConnectionKind(enum.IntEnum):
    """The `kind` numbers of nats-server connections (server/client.go)."""

    CLIENT = 0
    ROUTER = 1
    GATEWAY = 2
    SYSTEM = 3
    LEAF = 4
    JETSTREAM = 5
    ACCOUNT = 6

    @classmethod
    def label(cls, kind: int) -> str:
        """Lower-case name of a kind, or `kind-<n>` for a number this version does not know."""
        return kind_label(kind)


_KIND_LABELS = {kind.value: kind.name.lower() for kind in ConnectionKind}


def kind_label(kind: int) -> str:
    """`ConnectionKind.label`, as a plain function: an attribute of an enum class is looked
    up through its metaclass (~0.1 us), and this runs several times per message."""
    label = _KIND_LABELS.get(kind)
    return label if label is not None else f"kind-{kind}"

# Egress kinds that hand the message to another server, which then reports its own trace
# message carrying the egress hop id in its `Nats-Trace-Hop` header.
FORWARDING_KINDS = frozenset({ConnectionKind.ROUTER, ConnectionKind.GATEWAY, ConnectionKind.LEAF})


def _timestamp(value: str) -> int:
    ns = parse_rfc3339_ns(value)
    # OTLP times are unsigned 64-bit nanoseconds: 1970 to 2554.
    if not 0 <= ns < 2**64:
        raise ValueError(f"timestamp {value!r:.40} outside what OTLP can carry (1970 to 2554)")
    return ns


def check_uint64(name: str, value: int) -> None:
    # msgspec bounds must fit an int64; Go's uint64 goes higher, so the top is checked here.
    if value >= 2**64:
        raise ValueError(f"{name} {value} is over a uint64")


# Go's uint64 connection ids and sizes: reject what no server can send (see check_uint64).
UInt64 = Annotated[int, Meta(ge=0)]


# The `__post_init__` hooks msgspec calls for each decoded struct. These are the reference;
# the leaf of primitives (`_primitives.pyx`) holds their compiled twins, chosen here when
# built (`accel`). msgspec reads the hook when the class is created, so the choice is made
# before the classes below.
# The timestamps' texts are read into nanoseconds and not kept (`ts` emptied, `time` None):
# nothing reads them after, and a trace message's three (~240 B, 3 objects) were held
# through the live bridge's link window (docs/performance.md, session 50).
def _event_post_init(self: Any) -> None:
    force_setattr(self, "ts_ns", _timestamp(self.ts))
    force_setattr(self, "ts", "")


def _connection_post_init(self: Any) -> None:
    check_uint64("cid", self.cid)
    _event_post_init(self)


def _server_post_init(self: Any) -> None:
    check_uint64("seq", self.seq)


_primitives: Any = accel.compiled("_primitives")
if _primitives is not None:
    _event_post_init, _connection_post_init, _server_post_init = (  # the compiled twins
        _primitives.event_post_init, _primitives.connection_post_init, _primitives.server_post_init)


class _Wire(Struct, frozen=True, kw_only=True, gc=False):
    # msgspec validates while it parses, in C: 5x faster than the pydantic models this
    # replaced (docs/performance.md). Its defaults are ours: extra keys are ignored
    # (servers add fields over time) and types are not coerced. Subclasses repeat
    # frozen=True: msgspec inherits it, type checkers only see it where it is written.
    # gc=False (inherited too): strings, numbers and tuples of strings hold no cycle, and
    # the live bridge keeps a second of decoded messages that the collector need not walk.
    pass


class ServerInfo(_Wire, rename={"version": "ver"}, frozen=True):
    """The `server` block: which server published this trace message.

    Only what names the server: the same in every report it sends, so one record can
    serve them all (the kernel's parse hands out the one it kept for the server's bytes).
    The report's own numbers in the block are not in it: `seq` is the `TraceMessage`'s, and
    `time` is not kept (`ServerReport`). Held in each record, they made one per report,
    ~100 bytes held through the live bridge's link window (docs/performance.md, session 51).
    """

    name: str
    id: str
    host: str = ""
    cluster: str = ""
    domain: str = ""
    version: str = ""
    tags: tuple[str, ...] = ()
    jetstream: bool = False


class ServerReport(ServerInfo, frozen=True):
    """The `server` block as the wire has it: `ServerInfo` and the report's numbers (msgspec
    reads the block into one record; `decode` takes its `ServerInfo` and moves `seq` into the
    `TraceMessage`)."""

    seq: UInt64 = 0
    # When the server published the report, as its RFC 3339 text: typed, but neither read
    # nor kept past decoding. No span carries it (a hop's times are its events'), and held
    # through the live bridge's link window it was 32 bytes a message and its parse ~0.4 %
    # of the kernel's instructions (docs/performance.md, session 52); an archive keeps the
    # payload it is in. So a server's odd `time` does not cost a message its spans.
    time: str | None = None

    __post_init__ = _server_post_init  # type: ignore[misc]  # a module function (compiled when built) as the hook

    def info(self) -> ServerInfo:
        """The block without the report's numbers."""
        return ServerInfo(**{name: getattr(self, name) for name in ServerInfo.__struct_fields__})


class _Event(_Wire, tag_field="type", frozen=True):
    """An event: `ts_ns` is the nanoseconds the server's RFC 3339 text (`ts` on the wire)
    names; the text is read into it when the record is made and then not kept (`ts` "")."""

    ts: str
    ts_ns: int = 0

    __post_init__ = _event_post_init  # type: ignore[misc]  # a module function (compiled when built) as the hook


class Ingress(_Event, tag="in", rename={"account": "acc", "subject": "subj"}, kw_only=True, frozen=True):
    """`in`: how the message entered this server. Always the first event."""

    kind: int
    cid: UInt64 = 0
    name: str = ""
    account: str = ""
    subject: str = ""
    error: str = ""

    __post_init__ = _connection_post_init  # type: ignore[misc]  # a module function (compiled when built) as the hook


class SubjectMapping(_Event, tag="sm", frozen=True):
    """`sm`: the subject was rewritten by an account mapping."""

    to: str = ""


class StreamExport(_Event, tag="se", rename={"account": "acc"}, frozen=True):
    """`se`: the message crossed into another account through a stream export."""

    account: str = ""
    to: str = ""


class ServiceImport(_Event, tag="si", rename={"account": "acc", "from_subject": "from"}, frozen=True):
    """`si`: the message crossed into another account through a service import."""

    account: str = ""
    from_subject: str = ""
    to: str = ""


class JetStreamEvent(_Event, tag="js", rename={"no_interest": "nointerest"}, frozen=True):
    """`js`: the message was offered to a stream."""

    stream: str = ""
    subject: str = ""
    no_interest: bool = False
    error: str = ""


class Egress(_Event, tag="eg", rename={"account": "acc", "subscription": "sub"}, kw_only=True, frozen=True):
    """`eg`: the message left this server, to a client or to another server (with a hop id)."""

    kind: int
    cid: UInt64 = 0
    name: str = ""
    hop: str = ""
    account: str = ""
    subscription: str = ""
    queue: str = ""
    error: str = ""

    __post_init__ = _connection_post_init  # type: ignore[misc]  # a module function (compiled when built) as the hook

    @property
    def forwards(self) -> bool:
        """True when the egress hands the message to another server that traces it too."""
        return bool(self.hop) and self.kind in FORWARDING_KINDS


TraceEvent = SubjectMapping | StreamExport | ServiceImport | JetStreamEvent | Egress

# Event type tag on the wire -> model. `in` is handled apart: it must come first.
EVENT_MODELS: dict[str, type[TraceEvent]] = {
    "sm": SubjectMapping,
    "se": StreamExport,
    "si": ServiceImport,
    "js": JetStreamEvent,
    "eg": Egress,
}


class TraceHeaders(tuple[Any, ...]):
    """The traced message's headers as the server saw them: a read-only mapping of each name
    (its case kept) to the list of its values, in the server's order.

    Laid flat in one tuple, `(name, values, name, values, ...)`, where a name's `values` are
    one `str` when it has exactly one value (nearly always: a `traceparent`) and a tuple of
    them otherwise. Held through the live bridge's link window, a dict of lists was four
    allocations and ~270 B a trace message; this is one (docs/performance.md, session 50).
    The compiled kernel makes and reads it at its items; Python reads it as a `Mapping`
    (`[name]`, `get`, `items`, `keys`, `values`, `in`, `len`, `==` with any mapping), each
    name's values a new list. Make one with `TraceHeaders.of(mapping)`."""

    __slots__ = ()

    @classmethod
    def of(cls, headers: Mapping[str, list[str]] | TraceHeaders) -> TraceHeaders:
        """The headers of a mapping of name -> list of values (as msgspec decodes them; a
        `str` is one value, as `decode` reads a header given so)."""
        if type(headers) is cls:
            return headers
        if not headers:
            return NO_HEADERS  # as the kernel's parse gives a message without headers
        flat: list[Any] = []
        for name, values in headers.items():
            flat.append(name)
            flat.append(values if isinstance(values, str) else values[0] if len(values) == 1 else tuple(values))
        return cls(flat)

    def _pairs(self) -> Iterator[tuple[str, str | tuple[str, ...]]]:
        items = tuple.__iter__(self)
        return zip(items, items, strict=False)  # one iterator twice: (name, values) pairs

    def items(self) -> list[tuple[str, list[str]]]:
        return [(name, [values] if type(values) is str else list(values)) for name, values in self._pairs()]

    def keys(self) -> list[str]:
        return [name for name, _ in self._pairs()]

    def values(self) -> list[list[str]]:
        return [values for _, values in self.items()]

    def get(self, name: str, default: Any = None) -> Any:
        for key, values in self._pairs():
            if key == name:
                return [values] if type(values) is str else list(values)
        return default

    def __getitem__(self, name: str) -> list[str]:  # type: ignore[override]
        found = self.get(name, _MISSING)
        if found is _MISSING:
            raise KeyError(name)
        return found

    def __contains__(self, name: object) -> bool:
        return any(key == name for key, _ in self._pairs())

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def __len__(self) -> int:
        return tuple.__len__(self) // 2

    def __eq__(self, other: object) -> bool:
        if type(other) is TraceHeaders:
            return tuple.__eq__(self, other)
        if isinstance(other, Mapping):
            return dict(self.items()) == dict(other.items())
        return NotImplemented

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    __hash__ = None  # type: ignore[assignment]  # equal to dicts, which are not hashable

    def __repr__(self) -> str:
        return f"TraceHeaders({dict(self.items())!r})"


_MISSING = object()
Mapping.register(TraceHeaders)
#: What reads headers takes: a `TraceHeaders`, or any mapping of name -> list of values.
HeaderMapping = Mapping[str, list[str]] | TraceHeaders
NO_HEADERS = TraceHeaders()


def first_values(headers: HeaderMapping) -> dict[str, str]:
    """Lower-cased header name -> its first value (the first spelling wins), for
    case-insensitive look-ups: servers keep the header names' case."""
    first: dict[str, str] = {}
    for key, values in headers.items():
        if values:
            first.setdefault(key.lower(), values[0])
    return first


class TraceMessage(Struct, frozen=True, gc=False):
    """One server's report about one traced message.

    `headers` are the traced message's headers as the server saw them (a `TraceHeaders`:
    a read-only mapping, name case kept);
    `events` the events after the ingress, in the server's order; `unknown_events` raw
    events of types this version does not map. Built by `decode` from validated parts.
    It keeps no index of its headers: a message has a handful, each look-up (`header`)
    reads them in place, and an index held through the live bridge's link window cost
    ~180 bytes and two blocks a message (docs/performance.md, session 46).

    A msgspec `Struct`, not a dataclass: built in C, it costs a tenth of a frozen dataclass
    per message. Not tracked by the GC (`gc=False`): it holds no reference cycles.
    """

    server: ServerInfo
    headers: TraceHeaders
    msg_size: int
    hops: int
    ingress: Ingress
    events: tuple[TraceEvent, ...] = ()
    unknown_events: tuple[dict[str, Any], ...] = ()
    #: The server's number for this report (`server.seq` on the wire; 0: not numbered):
    #: each server numbers the reports it publishes, so gaps say where one was lost.
    seq: int = 0

    @property
    def end_ns(self) -> int:
        """The latest event timestamp: when this server was done with the message."""
        latest = self.ingress.ts_ns
        for event in self.events:
            if event.ts_ns > latest:
                latest = event.ts_ns
        return latest

    def header(self, name: str) -> str | None:
        """First value of a header, looked up case-insensitively (servers keep the case):
        of the spellings with a value, the first (`first_values(headers).get(name.lower())`)."""
        wanted = name.lower()
        for key, values in self.headers.items():
            if values and key.lower() == wanted:
                return values[0]
        return None

    @property
    def hop(self) -> str:
        """The hop id this server was reached by (`Nats-Trace-Hop`); empty on the origin."""
        return self.header("Nats-Trace-Hop") or ""
