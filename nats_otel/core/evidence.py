"""The hop evidence of one report, compact, for bridges that share one cluster's traces.

A queue group gives each trace message to one bridge of many, at random (nats-server has no
preference for the local member), so the two reports of a hop reach the same bridge with
probability 1/N. Each bridge therefore publishes what `Linker.observe` records of every
report it receives - its identity and event number (the report ledger), its arrival and its
forwarding egresses - and records what the others publish: then every bridge decides each
hop with the whole cluster's evidence, as one bridge would.

What arrives is checked (`decode_batch`): the format, every type and size, a bounded count
per message; a malformed batch is rejected whole, with a reason. The egress span ids are
never taken from the wire: they are worked out here from the context, identity and event
position (`ids.event_span_id`), so evidence can at worst name a span of the report it
describes, never an arbitrary one. Who may publish evidence is the NATS permissions' job
(docs/security.md); an optional shared key (`sign`) rejects any batch not made with it.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Sequence
from typing import Annotated, Any

import msgspec
from msgspec import Meta, Struct

from nats_otel.core.ids import TraceContext, event_span_id
from nats_otel.core.linking import Arrival, Egress
from nats_otel.core.model import Egress as EgressEvent
from nats_otel.core.pipeline import Prepared

__all__ = ["EVIDENCE_FORMAT", "EvidenceError", "HopEvidence", "LinkLatencyEstimate", "PeerBatch", "StreamState",
           "Streams",
           "decode_batch", "decode_batch_with_latencies", "decode_peer_batch", "encode_batch", "encode_numbers",
           "evidence_of", "observe_evidence", "observe_ledger", "observe_numbers", "sign"]

# Bumped when the layout changes: a bridge rejects another format instead of misreading it.
EVIDENCE_FORMAT = 2  # 2: the streams that vouch (issue 36)
# Bounds on what one published batch may hold (a report has few hops; a batch, one intake batch).
_MAX_REPORTS = 10_000
_MAX_EGRESSES = 256
_Text = Annotated[str, Meta(max_length=256)]
_Bytes = Annotated[bytes, Meta(max_length=512)]
_U64 = Annotated[int, Meta(ge=0, le=2**63 - 1)]


class _Hop(Struct, array_like=True, frozen=True, gc=False):
    """One side of one hop: the hop id, the other server's name, the time, the body size,
    and for an egress its 1-based position among the report's events (its span id)."""

    hop: _Text
    peer: _Text
    ts_ns: _U64
    size: _U64
    position: Annotated[int, Meta(ge=0, le=65_535)] = 0


class HopEvidence(Struct, array_like=True, frozen=True, gc=False):
    """What one report says about the hops it took part in (see the module's docstring)."""

    ident: _Bytes
    server_id: _Text
    server_name: _Text
    account: _Text  # the account it came in on
    seq: _U64
    ts_ns: _U64  # the report's ingress time (the ledger's clock)
    context: _Bytes  # the trace context's id fields
    adhoc: bool
    #: Where it came from (hop id, upstream server name), or None at the origin.
    arrival: _Hop | None
    egresses: Annotated[tuple[_Hop, ...], Meta(max_length=_MAX_EGRESSES)] = ()
    #: The sender's stream it arrived on (an index into the batch's `streams`; -1: none that
    #: vouches) and that stream's losses before it (`Delivery.breaks`).
    stream: Annotated[int, Meta(ge=-1, le=255)] = -1
    breaks: _U64 = 0


class StreamState(Struct, array_like=True, frozen=True, gc=False):
    """What a sender's stream says of its completeness (`ReportLedger.whole`): its losses,
    whole since, whole until (report times; None: unknown)."""

    name: _Text
    breaks: _U64
    since_ns: _U64 | None
    until_ns: _U64 | None


class LinkLatencyEstimate(Struct, array_like=True, frozen=True, gc=False):
    """A sender's learned latency of one link (`link_latency.LinkLatency.known`)."""

    upstream: _Text
    downstream: _Text
    latency_ns: Annotated[int, Meta(ge=-(2**40), le=2**40)]
    tolerance_ns: Annotated[int, Meta(ge=0, le=2**40)]


class _Batch(Struct, array_like=True, frozen=True, gc=False):
    format: int
    sender: _Text
    reports: Annotated[tuple[HopEvidence, ...], Meta(max_length=_MAX_REPORTS)]
    latencies: Annotated[tuple[LinkLatencyEstimate, ...], Meta(max_length=1024)] = ()
    #: The sender's streams, when it vouches for what they received (one process, core
    #: mode); empty: it cannot, and while it publishes, no gap is vouched for.
    streams: Annotated[tuple[StreamState, ...], Meta(max_length=256)] = ()


#: Each stream's name -> (losses, whole since, whole until): what a bridge's streams say
#: (`bridge.wholeness.Wholeness.streams`), made `StreamState`s in its batches.
Streams = dict[str, tuple[int, int | None, int | None]]


class PeerBatch(Struct, frozen=True, gc=False):
    """A received batch: who sent it, what it says, and how many of the sender's batches
    before it never arrived here (its streams count them as losses)."""

    sender: str
    reports: tuple[HopEvidence, ...]
    latencies: tuple[LinkLatencyEstimate, ...] = ()
    streams: tuple[StreamState, ...] = ()
    missed: int = 0
    #: Report time before which the sender's evidence may have gone out before this bridge
    #: listened (it was first heard of mid-way); None: every batch of it arrived.
    trusted_from_ns: int | None = None


class _Numbers(Struct, array_like=True, frozen=True, gc=False):
    """Between the worker processes of one bridge: the event numbers of the reports one
    worker observed, (server id, seq, report time), and the link latencies it learned."""

    reports: tuple[tuple[str, int, int], ...]
    latencies: tuple[LinkLatencyEstimate, ...] = ()


class EvidenceError(ValueError):
    """A published batch that cannot be used; `reason` is a metric label."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail = reason, detail


def _message_and_context(decoded: Any) -> tuple[Any, Any]:
    """A decoded report's message and trace context: a `pipeline.Prepared`'s, or the
    compiled kernel's record of the report (`observed_entries`), which is read as both (it
    has their fields: `_stage_record.pxi`), so that neither is made for it."""
    if type(decoded) is Prepared:
        return decoded.msg, decoded.ctx
    return decoded, decoded


def evidence_of(prepared: Any, stream: int = -1, breaks: int = 0) -> HopEvidence:
    """The evidence of a decoded report (`pipeline.Prepared`, or the kernel's record of
    it), received on the sender's `stream` (an index into its batch's `streams`) after
    `breaks` losses."""
    msg, ctx = _message_and_context(prepared)
    arrival = None
    if prepared.arrival is not None:
        (_, hop, upstream, _), entry = prepared.arrival
        arrival = _Hop(hop, upstream, entry.ts_ns, entry.size)
    egresses = tuple(_Hop(event.hop, event.name, event.ts_ns, prepared.size, position)
                     for position, event in enumerate(msg.events, start=1)
                     if type(event) is EgressEvent and event.forwards)
    ingress = msg.ingress  # read once: the kernel's record makes it when asked
    return HopEvidence(prepared.ident, msg.server.id, msg.server.name, ingress.account, msg.seq, ingress.ts_ns,
                       ctx.id_fields, ctx.adhoc_key is not None, arrival, egresses, stream, breaks)


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(_Batch)
_NUMBERS = msgspec.msgpack.Decoder(_Numbers)


def encode_batch(sender: str, reports: Sequence[HopEvidence],
                 latencies: Sequence[tuple[str, str, int, int]] = (),
                 streams: Sequence[StreamState] = ()) -> bytes:
    """One published message of evidence (msgpack), with the sender's learned latencies and
    what its streams say of their completeness."""
    return _ENCODER.encode(_Batch(EVIDENCE_FORMAT, sender, tuple(reports),
                                  tuple(LinkLatencyEstimate(*known) for known in latencies[:1024]), tuple(streams)))


def sign(key: bytes, data: bytes) -> str:
    """The hex signature of a batch under a shared key (keyed BLAKE2b)."""
    return hashlib.blake2b(data, key=key[:64], digest_size=16).hexdigest()


def decode_batch(data: bytes, key: bytes | None = None,
                 signature: str | None = None) -> tuple[str, tuple[HopEvidence, ...]]:
    """(sender, reports) of a published batch; `EvidenceError` when it is unsigned or badly
    signed (with `key`), malformed, of another format or out of bounds."""
    sender, reports, _ = decode_batch_with_latencies(data, key, signature)
    return sender, reports


def decode_batch_with_latencies(data: bytes, key: bytes | None = None, signature: str | None = None
                                ) -> tuple[str, tuple[HopEvidence, ...], tuple[LinkLatencyEstimate, ...]]:
    """`decode_batch`, with the sender's learned link latencies."""
    batch = decode_peer_batch(data, key, signature)
    return batch.sender, batch.reports, batch.latencies


def decode_peer_batch(data: bytes, key: bytes | None = None, signature: str | None = None) -> PeerBatch:
    """Everything a published batch says (`decode_batch`)."""
    if key is not None and (signature is None or not hmac.compare_digest(sign(key, data), signature)):
        raise EvidenceError("forged", "missing or wrong signature")
    try:
        batch = _DECODER.decode(data)
    except msgspec.ValidationError as exc:
        raise EvidenceError("invalid", str(exc)[:200]) from None
    except msgspec.DecodeError as exc:
        raise EvidenceError("malformed", str(exc)[:200]) from None
    if batch.format != EVIDENCE_FORMAT:
        raise EvidenceError("format", f"evidence format {batch.format}, this bridge reads {EVIDENCE_FORMAT}")
    return PeerBatch(batch.sender, batch.reports, batch.latencies, batch.streams)


def observe_evidence(linker: Any, reports: Iterable[HopEvidence], now: float = 0.0,
                     latencies: Iterable[LinkLatencyEstimate] = (), peer: PeerBatch | None = None) -> None:
    """Record other bridges' evidence in a linker, as `Linker.observe` records a report's,
    and adopt their learned link latencies where this linker has none (a bridge that
    restarts need not relearn them from crowded hops it cannot yet decide). With the
    `peer`'s batch, its streams become members of the ledger (`ReportLedger.whole`) and
    vouch for the reports they received, as the sender's own ledger did; a sender whose
    batches say nothing of its streams is a member that vouches for nothing."""
    index = linker.index
    ledger = index.sequences.ledger
    for known in latencies:
        index.sequences.latency.adopt((known.upstream, known.downstream), known.latency_ns, known.tolerance_ns)
    members: list[str] = []
    missed = 0 if peer is None else peer.missed
    if peer is not None:
        # Batches of the sender that never arrived hid reports: each counts as a loss of
        # every stream of that sender (from here on, what came before proves nothing after).
        for state in peer.streams:
            members.append(f"{peer.sender}/{state.name}")
            ledger.whole(members[-1], state.breaks + missed, state.since_ns if missed == 0 else None,
                         state.until_ns, now, local=False, trusted_from_ns=peer.trusted_from_ns)
        if not peer.streams:
            ledger.whole(peer.sender, None, None, None, now, local=False)
    for report in reports:
        ctx = TraceContext(report.context)
        if 0 <= report.stream < len(members):
            ledger.receiving = (members[report.stream], report.breaks + missed)
        try:
            index.observe_report(report.ident, report.server_id, report.seq, report.ts_ns, now, report.account)
        finally:
            ledger.receiving = None
        arrival = None
        if report.arrival is not None:
            key = (report.context, report.arrival.hop, report.arrival.peer, report.server_name)
            arrival = (key, Arrival(report.arrival.ts_ns, report.arrival.size, report.ident))
            index.add_arrival(*arrival, now)
        for egress in report.egresses:
            if egress.position < 1:
                continue  # an egress always has its position (its span id); a forged one has not
            key = (report.context, egress.hop, report.server_name, egress.peer)
            index.add_egress(key, Egress(egress.ts_ns, egress.size, report.ident,
                                         event_span_id(ctx, report.ident, egress.position)), now)
        if report.adhoc:
            linker.note_adhoc(report.ident, arrival)


def encode_numbers(prepared: Iterable[Any], latencies: Sequence[tuple[str, str, int, int]] = ()) -> bytes:
    """The event numbers of decoded reports (`pipeline.Prepared`) for the sibling workers,
    whose traces are others but whose ledgers need every report (`observe_numbers`): a
    few bytes a report, where their whole evidence is ~260."""
    messages = (_message_and_context(p)[0] for p in prepared)
    reports = tuple((msg.server.id, msg.seq, msg.ingress.ts_ns) for msg in messages)
    return _ENCODER.encode(_Numbers(reports, tuple(LinkLatencyEstimate(*known) for known in latencies[:1024])))


def observe_numbers(linker: Any, data: bytes, now: float = 0.0) -> None:
    """Record a sibling worker's event numbers (`encode_numbers`) in the ledger, and adopt
    its learned latencies where this linker has none."""
    numbers = _NUMBERS.decode(data)
    sequences = linker.index.sequences
    for known in numbers.latencies:
        sequences.latency.adopt((known.upstream, known.downstream), known.latency_ns, known.tolerance_ns)
    ledger = sequences.ledger
    for server_id, seq, ts_ns in numbers.reports:
        ledger.observe_number(server_id, seq, ts_ns, now)


def observe_ledger(linker: Any, reports: Iterable[HopEvidence], now: float = 0.0) -> None:
    """Record only which reports each server published (the ledger, `sequences`): what a
    worker needs of the reports whose traces another worker links."""
    index = linker.index
    for report in reports:
        index.observe_report(report.ident, report.server_id, report.seq, report.ts_ns, now, report.account)
