"""Span records: what mapping produces and encoding consumes. Plain, hashable, picklable."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

__all__ = ["AttrValue", "Attributes", "Resource", "SpanKind", "SpanRecord", "StatusCode"]

AttrValue = str | bool | int | float | tuple[str, ...]
Attributes = tuple[tuple[str, AttrValue], ...]


class SpanKind:
    """OTLP `Span.SpanKind` numbers."""

    INTERNAL = 1
    SERVER = 2
    CLIENT = 3
    PRODUCER = 4
    CONSUMER = 5


class StatusCode:
    """OTLP `Status.StatusCode` numbers."""

    UNSET = 0
    OK = 1
    ERROR = 2


@dataclass(frozen=True, slots=True)
class Resource:
    """The server that produced the spans (OTel resource). Hashable: spans group by it."""

    attributes: Attributes
    # Spans are grouped by resource once per span on the hot path: hash the nested tuple
    # once, not at every look-up.
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash(self.attributes))

    def __hash__(self) -> int:
        return self._hash

    def __getstate__(self) -> Attributes:
        return self.attributes  # the hash of a str differs between processes: not pickled

    def __setstate__(self, attributes: Attributes) -> None:
        object.__setattr__(self, "attributes", attributes)
        object.__setattr__(self, "_hash", hash(attributes))

    def get(self, key: str) -> AttrValue | None:
        """The value of one resource attribute, or None."""
        for name, value in self.attributes:
            if name == key:
                return value
        return None


class SpanRecord(NamedTuple):
    """One span, ready to encode. Ids are raw bytes (16 for traces, 8 for spans).

    A NamedTuple: immutable, hashable, picklable, and the cheapest record Python creates,
    which matters on the hot path (several per trace message).
    """

    trace_id: bytes
    span_id: bytes
    parent_span_id: bytes
    name: str
    kind: int
    start_ns: int
    end_ns: int
    resource: Resource
    attributes: Attributes = ()
    status_code: int = StatusCode.UNSET
    status_message: str = ""
    trace_state: str = ""

    def attribute(self, key: str) -> AttrValue | None:
        """The value of one span attribute, or None."""
        for name, value in self.attributes:
            if name == key:
                return value
        return None
