"""What a trace message says of the traced message itself, the same at every hop it crosses:
its *shape* (`message_shape`), the exact evidence of the hop links (`linking`, `sequences`).

Two messages under one trace context (a producer span publishing a batch, an ad-hoc
destination used for every message) look alike to the linker by context, hop id and time.
Their own headers tell them apart when the application sets one per message (`Nats-Msg-Id`
for JetStream's de-duplication, an id or a sequence): each report carries the headers its
server received, and a downstream server's are the upstream's plus what servers add on the
way. A shape is a plain int, so the link window holds a fixed size per entry, never headers.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nats_otel.core.model import HeaderMapping

__all__ = [
    "CONTEXT_HEADERS",
    "RELEASE_HEADERS",
    "SERVER_HEADERS",
    "SHAPE_DIGEST",
    "message_shape",
    "shape_digest",
    "shapes_agree",
]

_HOP_HEADER = "nats-trace-hop"
# What each supported release line adds to or rewrites on a traced message it forwards, read
# off the records captured from it (tests/data/corpus-<release>, docs/span-model.md "What a
# server adds to a message it forwards"; each row is tested on its release's records):
# `Nats-Trace-Hop` on every route, gateway and leafnode hop; across a service import the
# requestor's `Nats-Request-Info`, and 2.11 and 2.12 `Nats-Trace-Origin-Account` (the
# requestor's account) where 2.14 and later add (or, ad hoc, rewrite to the reply subject)
# `Nats-Trace-Dest`. Stream exports, subject mappings, JetStream, gateways and leafnodes
# add nothing more on any of them. Lower case.
RELEASE_HEADERS: dict[str, frozenset[str]] = {
    "2.11": frozenset({_HOP_HEADER, "nats-request-info", "nats-trace-origin-account"}),
    "2.12": frozenset({_HOP_HEADER, "nats-request-info", "nats-trace-origin-account"}),
    "2.14": frozenset({_HOP_HEADER, "nats-request-info", "nats-trace-dest"}),
    "2.15": frozenset({_HOP_HEADER, "nats-request-info", "nats-trace-dest"}),
}
# The shape takes out what any supported release adds: the two reports of a hop may come from
# servers of different releases (a rolling upgrade), and a report does not say which release
# forwarded its message. Taking a header out on both sides never makes two sizes differ; a
# header of the message's own by one of these names only stops being evidence. A header a
# release outside this table adds is the message's own to the rule: the downstream side gets
# a digest the upstream's plain size cannot equal, and the link is declined, never made wrong.
SERVER_HEADERS: frozenset[str] = frozenset().union(*RELEASE_HEADERS.values())
# The trace context's own headers: the same for every message of a link key already.
CONTEXT_HEADERS = frozenset({"traceparent", "tracestate"})
# A shape at or above this is a digest of the message's own headers (`message_shape`); below
# it, a plain size. Digests keep bit 62 set and bit 63 clear: they fit the evidence's u64,
# and no real message size reaches them.
SHAPE_DIGEST = 1 << 62


def message_shape(msg_size: int, headers: HeaderMapping) -> int:
    """The message's shape: its size without the header lines of `SERVER_HEADERS` (`Name:
    value\\r\\n` each; taken out on both sides, the upstream's and the downstream's sizes of one
    message are equal, seen on every hop of every release's corpus, service imports
    included); or, when it
    carries headers beyond those and the trace context's, a 64-bit digest (>= `SHAPE_DIGEST`)
    of that size and those headers, names lower-cased (2.11 and 2.12 lower-case some)."""
    own: list[tuple[str, list[str]]] | None = None
    for name, values in headers.items():
        lowered = name.lower()
        if lowered in SERVER_HEADERS:
            for value in values:
                msg_size -= len(name) + len(value) + 4
        elif lowered not in CONTEXT_HEADERS:
            if own is None:
                own = []
            own.append((lowered, values))
    if own is None:  # the common case: nothing but the context (a traceparent per message)
        return msg_size
    return shape_digest(msg_size, own)


def shape_digest(size: int, own: list[tuple[str, list[str]]]) -> int:
    """`message_shape`'s digest: BLAKE2b-64 of the size and the headers in name order, each
    name and value length-prefixed (no two header sets encode alike)."""
    parts = [size.to_bytes(16, "little", signed=True)]  # any u64 msgsize less any headers fits
    for name, values in sorted(own):
        encoded = name.encode()
        parts += (len(encoded).to_bytes(4, "little"), encoded, len(values).to_bytes(4, "little"))
        for value in values:
            data = value.encode()
            parts += (len(data).to_bytes(4, "little"), data)
    digest = int.from_bytes(hashlib.blake2b(b"".join(parts), digest_size=8).digest(), "little")
    return (digest & (SHAPE_DIGEST - 1)) | SHAPE_DIGEST


def shapes_agree(arrival_shape: int, egress_shape: int) -> bool:
    """Whether an arrival and an egress may be one message: equal shapes, or two plain sizes
    (a size only breaks ties: a header a server adds that `SERVER_HEADERS` does not name
    would change it)."""
    return arrival_shape == egress_shape or (arrival_shape < SHAPE_DIGEST and egress_shape < SHAPE_DIGEST)
