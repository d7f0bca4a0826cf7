"""decode -> trace context -> link -> map, for raw trace messages.

The one path every program uses (bridge, `convert`, the Spark backfill), so they cannot
drift apart. Still pure: the only state is the caller's `Linker`, and the live bridge's
clock comes in as an argument.

Two steps per message, because a downstream report's parent can only be decided once the
upstream's report is known, and trace messages arrive in any order:

1. `observe`: decode it, and record its hop evidence (its forwarding egresses, and if it
   came from another server its arrival) in the `Linker`;
2. `finish`: decide where its spans go (`Linker.place`) and map it.

`convert_batch` observes the whole input, then finishes it: the result ignores the order.
The live `Converter` observes each message on arrival and finishes it `link_wait` later.

All of it is the reference: the kernel (`_kernel.pyx`) has the compiled counterparts, and
`engine` chooses which runs; nothing here uses compiled code but msgspec's hooks.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from typing import Any, cast

from msgspec import Struct
from msgspec.structs import force_setattr

from nats_otel.core.decode import DecodeError, DecodeLimits, RawTraceMessage, decode
from nats_otel.core.ids import (
    TraceContext,
    adhoc_trace_id,
    event_span_id,
    identity,
    trace_context,
    upstream_hop,
)
from nats_otel.core.linking import (
    AMBIGUOUS,
    MATCHED,
    Arrival,
    Egress,
    Link,
    LinkKey,
    LinkSettings,
    PythonLinkIndex,
)
from nats_otel.core.mapping import MappingOptions, Placement, map_message
from nats_otel.core.model import Egress as EgressEvent
from nats_otel.core.model import TraceMessage
from nats_otel.core.network import network_sample
from nats_otel.core.records import SpanRecord
from nats_otel.core.results import Converted, EncodedBatch, Rejected, encode_results, tally_results
from nats_otel.core.shapes import message_shape
from nats_otel.core.span_bytes import EncodedSpans, map_encode

__all__ = ["Converted", "Converter", "EncodedBatch", "Linker", "Observed", "Prepared", "PythonConverter",
           "PythonLinker", "Rejected", "convert_batch", "encode_results", "finish", "observed", "observed_at",
           "observed_entries", "prepare", "tally_results"]

# An ad-hoc trace's id comes from its origin report, found hop by hop upstream; no real
# topology is deeper than this, and it bounds the walk.
_MAX_DEPTH = 32


# The hot path's records are msgspec `Struct`s: built in C, a tenth of the cost of a frozen
# dataclass, still immutable, comparable and picklable. None holds a reference cycle, so
# the GC need not track them (`gc=False`).


class Prepared(Struct, frozen=True, gc=False):
    """A decoded trace message with its trace context and identity: ready to be linked and mapped."""

    raw: RawTraceMessage
    msg: TraceMessage
    ctx: TraceContext
    ident: bytes
    #: Its hop key and arrival, when it came in from another server; None at the origin.
    #: Both `observe` and `place` need it: worked out once, in `prepare`.
    arrival: tuple[LinkKey, Arrival] | None = None
    issues: tuple[str, ...] = ()
    #: `shapes.message_shape` of the message (its arrival and its egresses carry it); -1: not
    #: worked out yet (a hand-built `Prepared`).
    size: int = -1

    def egresses(self) -> list[tuple[LinkKey, Egress]]:
        """Its egresses to other servers, with the span ids `map_message` gives them."""
        msg = self.msg
        found: list[tuple[LinkKey, Egress]] = []
        for position, event in enumerate(msg.events, start=1):
            if type(event) is EgressEvent and event.forwards:
                size = self.size if self.size >= 0 else message_shape(msg.msg_size, msg.headers)
                key = (self.ctx.id_fields, event.hop, msg.server.name, event.name)
                found.append((key, _new(Egress, (event.ts_ns, size, self.ident,
                                                 event_span_id(self.ctx, self.ident, position)))))
        return found


# NamedTuples built without their `__new__` (a Python call): several per message.
_new = tuple.__new__


# A broken traceparent beside an ad-hoc destination: correlated by the destination, and said so.
_BAD_TRACEPARENT = ("bad_traceparent: malformed traceparent, correlated by ad-hoc destination",)


def prepare(raw: RawTraceMessage, limits: DecodeLimits = DecodeLimits()) -> Prepared:
    """Decode and find the trace context; raises `DecodeError` (with a reason)."""
    msg = decode(raw, limits)
    ctx = trace_context(msg, raw.subject)
    issues: tuple[str, ...] = ()
    if ctx.adhoc_key is not None and msg.header("traceparent") is not None:
        issues = _BAD_TRACEPARENT
    ident = identity(msg)
    size = message_shape(msg.msg_size, msg.headers)
    return Prepared(raw, msg, ctx, ident, _arrival(msg, ctx, ident, size), issues, size)


def _arrival(msg: TraceMessage, ctx: TraceContext, ident: bytes, size: int) -> tuple[LinkKey, Arrival] | None:
    hop = upstream_hop(msg)
    if not hop:
        return None
    ingress = msg.ingress
    return (ctx.id_fields, hop, ingress.name, msg.server.name), _new(Arrival, (ingress.ts_ns, size, ident))


python_prepare = prepare  # the reference of the kernel's `prepare` (`_stage_prepare.pxi`)


class PythonLinker:
    """The hop evidence of observed messages, and where each message's spans go. The
    reference of the kernel's `Linker` (`_stage_link.pxi`)."""

    __slots__ = ("_adhoc_arrivals", "_bounded", "index")

    def __init__(self, settings: LinkSettings = LinkSettings(), bounded: bool = True) -> None:
        self.index = PythonLinkIndex(settings, bounded)
        self._bounded = bounded
        # Ad-hoc reports only: identity -> its arrival (None at the origin), to find the
        # origin whose identity names the trace. Bounded like the index.
        self._adhoc_arrivals: dict[bytes, tuple[LinkKey, Arrival] | None] = {}

    def observe(self, prepared: Prepared, now: float = 0.0) -> None:
        """Record a message's hop evidence (idempotent: a redelivery changes nothing)."""
        arrival = prepared.arrival
        msg = prepared.msg
        self.index.observe_report(prepared.ident, msg.server.id, msg.seq, msg.ingress.ts_ns, now,
                                  msg.ingress.account)
        if arrival is not None:
            self.index.add_arrival(*arrival, now)
        for key, egress in prepared.egresses():
            self.index.add_egress(key, egress, now)
        if prepared.ctx.adhoc_key is not None:
            self.note_adhoc(prepared.ident, arrival)

    def note_adhoc(self, ident: bytes, arrival: tuple[LinkKey, Arrival] | None) -> None:
        """An ad-hoc report's arrival (None at its origin): the walk to its origin's identity."""
        adhoc = self._adhoc_arrivals
        adhoc[ident] = arrival
        if self._bounded and len(adhoc) > self.index.settings.capacity:
            del adhoc[next(iter(adhoc))]

    def place(self, prepared: Prepared) -> Placement:
        """Trace id and parent of a message's spans, from what was observed."""
        return self.locate(prepared)[0]

    def locate(self, prepared: Prepared) -> tuple[Placement, Link | None]:
        """`place`, with the link decision behind it (None at the origin)."""
        ctx, ident = prepared.ctx, prepared.ident
        arrival = prepared.arrival
        if arrival is None:  # the origin: under the producer's span (a root for ad-hoc traces)
            trace_id = ctx.trace_id if ctx.adhoc_key is None else adhoc_trace_id(ctx, ident)
            return _new(Placement, (ident, trace_id, ctx.parent_span_id, "", 0)), None
        link = self.index.resolve(*arrival)
        if link.result == MATCHED and link.egress is not None:
            trace_id = ctx.trace_id if ctx.adhoc_key is None else self._adhoc_trace(ctx, link.egress.ident)
            return _new(Placement, (ident, trace_id, link.egress.span_id, MATCHED, 0)), link
        # Never under another message's egress: under the producer's span, which is an
        # ancestor whatever the path was; an ad-hoc report becomes a trace of its own.
        trace_id = ctx.trace_id if ctx.adhoc_key is None else adhoc_trace_id(ctx, ident)
        candidates = link.candidates if link.result == AMBIGUOUS else 0
        return _new(Placement, (ident, trace_id, ctx.parent_span_id, link.result, candidates)), link

    def _adhoc_trace(self, ctx: TraceContext, ident: bytes) -> bytes:
        """The trace id of the ad-hoc message whose report `ident` is: its origin's."""
        for _ in range(_MAX_DEPTH):
            arrival = self._adhoc_arrivals.get(ident)
            if arrival is None:  # the origin (or forgotten: then this report names the trace)
                break
            link = self.index.resolve(*arrival)
            if link.result != MATCHED or link.egress is None:
                break
            ident = link.egress.ident
        return adhoc_trace_id(ctx, ident)


Linker = PythonLinker  # the reference of the kernel's `Linker` (`_stage_link.pxi`)


def finish(prepared: Prepared, linker: Linker, options: MappingOptions, encoded: bool = False) -> Converted:
    """Map an observed message where the linker places it; `encoded`: straight to protobuf
    (`span_bytes.map_encode`), no span records."""
    placement, link = linker.locate(prepared)
    spans: list[SpanRecord] = []
    encoding = None
    if encoded:
        resource, data, count, map_issues = map_encode(prepared.msg, prepared.ctx, placement, options)
        encoding = _new(EncodedSpans, (resource, data, count))
    else:
        result = map_message(prepared.msg, prepared.ctx, placement, options)
        spans, map_issues = result.spans, result.issues
    # A hop's latency once: a redelivered report (`first` False) was counted already.
    egress_ns = link.egress.ts_ns if link is not None and link.egress is not None and link.first else None
    # Mapping's issue list is new at each call: extended in place, not copied.
    issues = [*prepared.issues, *map_issues] if prepared.issues else map_issues
    if placement.link and placement.link != MATCHED:
        issues.append(f"hop_{placement.link}: no single upstream egress for hop "
                      f"{upstream_hop(prepared.msg)} from {prepared.msg.ingress.name}"
                      + (f" ({placement.candidates} candidates)" if placement.candidates else ""))
    # The sample names the trace and the server span (by its id's inputs: hashed only when an
    # exemplar shows it) for the latency histograms' exemplars.
    sample = network_sample(prepared.msg, egress_ns, placement.trace_id, prepared.ctx.id_fields, placement.ident)
    return Converted(spans, issues, placement.link, sample, encoding)


# An observed message's entry, as a converter keeps it between `observe` and `convert` (or
# hands it to the caller: `observe_held`): this twin's is a tuple, the raw message first,
# then its decoded form (or its `Rejected`); the kernel's is its own record of the message
# (`_stage_record.pxi`: the raw message, the decoded form and its forwarding egresses' span
# ids), or a tuple for a `Rejected`. Opaque to callers, who give it back to the converter
# that made it, and read only which raw message it is of (`entry_raw`).
Observed = Any


def entry_raw(entry: Observed) -> RawTraceMessage:
    """The raw message an entry of either twin's converter is of."""
    return entry[0] if type(entry) is tuple else entry.raw


class PythonConverter:
    """Streaming conversion (the live bridge): `observe` on arrival, `convert` later. The
    reference of the kernel's `Converter` (`_stage_convert.pxi`).

    Between the two, the message's decoded form waits here (bounded); the linker's memory
    is bounded in time and entries (`LinkSettings`), with what it had to drop counted.
    """

    def __init__(
        self,
        options: MappingOptions = MappingOptions(),
        limits: DecodeLimits = DecodeLimits(),
        link: LinkSettings = LinkSettings(),
        pending_capacity: int = 200_000,
    ) -> None:
        self.options = options
        self.limits = limits
        self.linker = Linker(link)
        # id(raw) -> (raw, its decoded form). Keyed by the object, not by its payload: a
        # hash of ~1 kB per message was a visible cost. The entry holds the raw, so its id
        # cannot be reused while the entry lives. A redelivery (another object, same bytes)
        # is decoded again; the linker records its evidence once all the same.
        self._pending: dict[int, Observed] = {}
        self._pending_capacity = pending_capacity

    def observe(self, raw: RawTraceMessage, now: float = 0.0) -> None:
        """Decode a message that just arrived and record its hop evidence; `convert` of the
        same object later finds it decoded."""
        self.observe_many((raw,), now)

    def observe_many(self, raws: Iterable[RawTraceMessage], now: float = 0.0) -> None:
        """`observe` each of a batch that just arrived (one call per batch, not per message)."""
        pending, prepare_one = self._pending, self._prepare
        for raw in raws:
            key = id(raw)
            entry = pending.get(key)
            if entry is None or entry[0] is not raw:
                pending[key] = (raw, prepare_one(raw, now))
        self._bound()

    def observe_held(self, raws: Iterable[RawTraceMessage], now: float = 0.0,
                     release: bytes | None = None) -> list[Observed]:
        """`observe_many`, handing the batch's entries (one per raw, in order) to the caller
        instead of keeping them in `_pending`: `convert_many(raws, observed=...)` takes them
        back. The bridge's path (`bridge/observed_batches.py`): a burst holds tens of thousands
        of observed messages, and two look-ups a message in a dict that size were ~2-3 % of
        the bridge's CPU in issue 48's burst. What was kept (`observe_many`, `adopt`) is
        handed over, not observed again. A raw twice in one batch is observed twice (the
        linker records its evidence once all the same), where `observe_many` keeps one.

        `release`: what each raw's payload is replaced with once it is observed, for a caller
        that reads no payload afterwards (`bridge/observed_batches.py`): its entry holds the
        parse, and the link window need not hold the JSON too."""
        pending, prepare_one = self._pending, self._prepare
        entries: list[Observed] = []
        for raw in raws:
            entry = pending.pop(id(raw), None) if pending else None
            entries.append(entry if entry is not None and entry[0] is raw else (raw, prepare_one(raw, now)))
            if release is not None:
                force_setattr(raw, "payload", release)
        return entries

    def adopt(self, observed: Iterable[Observed]) -> None:
        """Keep entries from `observe_held` in `_pending` after all (bounded), as if observed
        by `observe_many`: for a caller that will not convert them as observed."""
        for entry in observed:
            self._pending[id(entry[0])] = entry
        self._bound()

    def _bound(self) -> None:
        over = len(self._pending) - self._pending_capacity
        if over > 0:  # the oldest are decoded again when their turn comes
            for key in list(itertools.islice(self._pending, over)):
                del self._pending[key]

    def convert(self, raw: RawTraceMessage, now: float = 0.0, encoded: bool = False) -> Converted | Rejected:
        """Spans of an observed (or not yet observed) message, or why it gave none. Never raises.

        `encoded`: the spans as protobuf (`Converted.encoded`), for exporters that send bytes."""
        return self.convert_many((raw,), now, encoded)[0]

    def convert_many(self, raws: Iterable[RawTraceMessage], now: float = 0.0,
                     encoded: bool = False, observed: Sequence[Observed] | None = None) -> list[Converted | Rejected]:
        """`convert` each of a batch (observed with `observe_many` or `observe`, or not; or
        with `observe_held`, its entries given back as `observed`: checked whole to be those
        of `raws`, in order, before any is converted, else ValueError).

        A list given as `observed` is consumed: each entry is replaced by its result as soon
        as its message is converted, and that list is what is returned. So each entry, and
        the ~30 objects of the message it decoded, is freed right after the conversion read
        them, not a whole batch later, cold (docs/performance.md, session 46)."""
        pending, linker, options = self._pending, self.linker, self.options
        if observed is not None:
            entries = _aligned(raws, observed, 2)
            linker.index.expire(now)
            results = cast(list[Converted | Rejected], entries)  # the same list, filled in place
            for at, (_, prepared) in enumerate(entries):
                results[at] = prepared if type(prepared) is Rejected else python_finish(prepared, linker, options,
                                                                                        encoded)
            return results
        linker.index.expire(now)
        out: list[Converted | Rejected] = []
        for raw in raws:
            entry = pending.pop(id(raw), None)
            if entry is not None and entry[0] is raw:
                result = entry[1]
            else:  # never observed (or forgotten): its evidence is new, the bounds apply again
                result = self._prepare(raw, now)
                linker.index.expire(now)
            out.append(result if type(result) is Rejected else python_finish(result, linker, options, encoded))
        return out

    def convert_encoded(self, raws: Sequence[RawTraceMessage], now: float = 0.0,
                        observed: Sequence[Observed] | None = None) -> EncodedBatch:
        """`convert_many(raws, now, True, observed)` made into one export request, with what
        the bridge counts of it: the bridge's path where every exporter sends bytes."""
        return EncodedBatch(self.convert_many(raws, now, True, observed))

    def _prepare(self, raw: RawTraceMessage, now: float) -> Prepared | Rejected:
        try:
            prepared = prepare(raw, self.limits)
        except DecodeError as exc:
            return Rejected(exc.reason, exc.detail, raw.subject)
        self.linker.observe(prepared, now)
        return prepared


def _aligned(raws: Iterable[RawTraceMessage], observed: Sequence[Observed], size: int) -> list[Observed]:
    """`observed` as a list (itself if it is one: `convert_many` consumes it), checked to be
    `observe_held`'s entries (tuples of `size`) of `raws`, in order."""
    entries = observed if type(observed) is list else list(observed)
    messages = list(raws)
    if len(entries) != len(messages):
        raise ValueError(f"{len(entries)} observed entries for {len(messages)} messages")
    for at, (entry, raw) in enumerate(zip(entries, messages, strict=True)):
        if type(entry) is not tuple or len(entry) != size or entry[0] is not raw:
            raise ValueError(f"observed entry {at} is not observe_held's entry of that message")
    return entries


# The references of the kernel's `finish` and `Converter` (`_stage_convert.pxi`).
python_finish = finish
Converter = PythonConverter


def observed(converter: Converter, raws: Iterable[RawTraceMessage]) -> list[Prepared]:
    """The decoded form of each of `raws` that `converter` observed and has not converted
    yet (either twin keeps them in `_pending`, by the raw's id): what the bridge shares with
    other bridges (`evidence`)."""
    return [prepared for _, prepared in observed_at(converter, raws)]


def observed_entries(entries: Iterable[Observed]) -> list[tuple[int, Prepared]]:
    """The decoded forms among `observe_held`'s entries (of either twin), each with its
    position: `observed_at` of a batch whose entries the caller holds."""
    return [(at, entry[1]) for at, entry in enumerate(entries) if type(entry[1]) is Prepared]


def observed_at(converter: Converter, raws: Iterable[RawTraceMessage]) -> list[tuple[int, Prepared]]:
    """`observed`, each with its position in `raws`."""
    pending = converter._pending
    found = []
    for at, raw in enumerate(raws):
        entry = pending.get(id(raw))
        if entry is not None and entry[0] is raw and type(entry[1]) is Prepared:
            found.append((at, entry[1]))
    return found


def convert_batch(
    raws: Iterable[RawTraceMessage | Rejected],
    options: MappingOptions = MappingOptions(),
    limits: DecodeLimits = DecodeLimits(),
    link: LinkSettings = LinkSettings(),
    report_runs: dict[str, Sequence[tuple[int, int, int, int]]] | None = None,
) -> list[Converted | Rejected]:
    """Whole-input conversion (`convert`, backfill): the result ignores the input order.

    Rejected items passed in (e.g. archive lines that did not parse) are passed through.
    `report_runs` (`report_ledger.report_runs`): which reports of each server the whole input
    holds, when `raws` is only part of it (the backfill converts one context at a time).
    """
    # The whole input is the window here: nothing is forgotten, nothing expires.
    linker = Linker(link, bounded=False)
    if report_runs is not None:
        linker.index.sequences.ledger.use_runs(report_runs)
    prepared: list[Prepared | Rejected] = []
    for raw in raws:
        if isinstance(raw, Rejected):
            prepared.append(raw)
            continue
        try:
            p = prepare(raw, limits)
        except DecodeError as exc:
            prepared.append(Rejected(exc.reason, exc.detail, raw.subject))
            continue
        linker.observe(p)
        prepared.append(p)
    return [p if isinstance(p, Rejected) else finish(p, linker, options) for p in prepared]
