"""Which bridge of a queue group owns a trace, and the forwarded trace messages' wire format.

Every trace message of one trace context has the same key (`sharding.shard_key`: the
traceparent's trace id, else the arrival subject of an ad-hoc trace), so every report of a
trace reaches its owner wherever the queue group delivered it, and the owner links, maps and
exports the trace alone. The owner of a key is found on a consistent-hash ring of the members
(`Ring`: each member at `VNODES` points, a key owned by the first point at or after its hash):
when a member comes or goes, only the keys of its arcs move, about 1/N of them, the same
answer as the OpenTelemetry Collector's load-balancing exporter gives its trace ids.

Pure: no I/O, no clock. `routing.Router` keeps the members and moves the bytes.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
from bisect import bisect_left
from collections.abc import Iterable, Sequence

import msgspec

from nats_otel.core.decode import RawTraceMessage
from nats_otel.core.evidence import StreamState

__all__ = ["VNODES", "Forward", "ForwardError", "Frame", "Ring", "decode_forward", "encode_forward", "member_token"]

# Points per member: with 64 the largest member's share of the keys stays within ~1.3x of the
# mean up to 64 members (measured in tests/bridge/test_ownership.py), at one bisect a key.
VNODES = 64
# A forwarded batch's frames, at most: a hostile input's bound (a batch is one intake batch's
# share of one owner: `batch.max_messages` is at most 10,000).
_MAX_FRAMES = 65_536


def _hash64(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


@functools.lru_cache(maxsize=1024)  # every forward names its owner's: hashed once per member
def member_token(member: str) -> str:
    """A member's name as one subject token (hex): where its forwarded trace messages go."""
    return hashlib.blake2b(member.encode(), digest_size=8).hexdigest()


class Ring:
    """The members' points on the ring, and the view: one id for one set of members."""

    __slots__ = ("_owners", "_points", "members", "view")

    def __init__(self, members: Iterable[str]) -> None:
        self.members: tuple[str, ...] = tuple(sorted(set(members)))
        points = sorted((_hash64(f"{member}#{vnode}".encode()), member)
                        for member in self.members for vnode in range(VNODES))
        self._points = [point for point, _ in points]
        self._owners = [member for _, member in points]
        self.view = hashlib.blake2b("\n".join(self.members).encode(), digest_size=8).hexdigest()

    def owner(self, key: bytes) -> str:
        """The member that owns `key` (a ring of no members has no owner: KeyError)."""
        if not self._points:
            raise KeyError("a ring with no members")
        at = bisect_left(self._points, _hash64(key))
        return self._owners[at if at < len(self._owners) else 0]

    def __len__(self) -> int:
        return len(self.members)


class Frame(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """One forwarded trace message: as received (subject, headers, payload), the stream it
    arrived on at the sender (an index into `Forward.streams`) and that stream's losses before
    it (`Delivery.breaks`), or -1: the sender does not vouch for it."""

    subject: str | None
    headers: dict[str, list[str]]
    payload: bytes
    stream: int
    breaks: int
    # JetStream mode: how many times JetStream delivered it to the sender (0 in core mode).
    # Last and defaulted: a forward without it (an older bridge's) reads as before, and an
    # older bridge reads past it.
    delivered: int = 0


class Forward(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """The trace messages one bridge received for one owner, in its arrival order: who sent
    them, under which view of the members, its count of forwards to this owner (from 1), and
    what its streams say of their completeness then (a heartbeat's state, carried along: a
    bridge that forwards to every peer needs no heartbeat in between). In the payload, not
    in headers: the owner reads it on the receive path's fast lane, without nats-py's `Msg`."""

    sender: str
    view: str
    number: int
    streams: tuple[str, ...]
    frames: tuple[Frame, ...]
    states: tuple[StreamState, ...] = ()


class ForwardError(ValueError):
    """A forwarded batch that cannot be read (dropped whole, counted by `reason`)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail = reason, detail


_SIGNED = b"S"
_SIGNATURE_BYTES = 16
_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(Forward)


def encode_forward(sender: str, view: str, number: int, streams: Sequence[str],
                   frames: Sequence[tuple[RawTraceMessage, int, int, int]], states: Sequence[StreamState] = (),
                   key: bytes | None = None) -> bytes:
    """One batch for one owner: each raw message with its stream index, breaks and delivery
    count (`Frame`); with the
    exchange's shared `key` (`link.exchange_key_file`), signed: `_SIGNED`, the keyed BLAKE2b
    of the rest, then the rest (a msgpack array never starts with that byte)."""
    data = _ENCODER.encode(Forward(sender, view, number, tuple(streams), tuple(
        Frame(raw.subject, raw.headers, raw.payload, stream, breaks, delivered)
        for raw, stream, breaks, delivered in frames), tuple(states)))
    if key is None:
        return data
    return _SIGNED + _signature(key, data) + data


def _signature(key: bytes, data: bytes) -> bytes:
    return hashlib.blake2b(data, key=key[:64], digest_size=_SIGNATURE_BYTES).digest()


def decode_forward(data: bytes, key: bytes | None = None) -> Forward:
    """A received batch, checked: signed with `key` when there is one, every frame naming
    one of the batch's streams."""
    if key is not None:
        signature, data = data[1:1 + _SIGNATURE_BYTES], data[1 + _SIGNATURE_BYTES:]
        if not hmac.compare_digest(signature, _signature(key, data)):
            raise ForwardError("forged", "missing or wrong signature")
    try:
        forward = _DECODER.decode(data)
    except msgspec.DecodeError as exc:
        raise ForwardError("malformed", str(exc)) from None
    if not forward.sender:
        raise ForwardError("malformed", "no sender")
    if len(forward.frames) > _MAX_FRAMES:
        raise ForwardError("oversized", f"{len(forward.frames)} frames")
    streams = len(forward.streams)
    for frame in forward.frames:
        if not 0 <= frame.stream < streams:
            raise ForwardError("malformed", f"a frame names stream {frame.stream} of {streams}")
    return forward
