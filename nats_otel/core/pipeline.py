"""decode -> trace context -> reuse numbering -> map, for one raw trace message.

The one path every program uses (bridge, `convert`, the Spark backfill), so they cannot
drift apart. Still pure: the only state is the caller's `ReuseDetector`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from nats_otel.core.decode import DecodeError, DecodeLimits, RawTraceMessage, decode
from nats_otel.core.ids import TraceContext, trace_context, upstream_hop
from nats_otel.core.mapping import MappingOptions, map_message
from nats_otel.core.model import TraceMessage
from nats_otel.core.records import SpanRecord
from nats_otel.core.reuse import ReuseDetector, ReuseKey, assign_occurrences

__all__ = ["Converted", "Converter", "Prepared", "Rejected", "convert_batch", "prepare"]


@dataclass(frozen=True, slots=True)
class Prepared:
    """A decoded trace message with its trace context: ready to be numbered and mapped."""

    raw: RawTraceMessage
    msg: TraceMessage
    ctx: TraceContext
    issues: tuple[str, ...] = ()

    @property
    def reuse_key(self) -> ReuseKey:
        """What two messages share when their traceparent was reused (see `reuse`)."""
        return (self.ctx.trace_id, self.ctx.parent_span_id, self.msg.server.id, upstream_hop(self.msg))


@dataclass(frozen=True, slots=True)
class Converted:
    """The spans of one trace message, and what was odd about it (logged and counted)."""

    spans: list[SpanRecord]
    issues: list[str] = field(default_factory=list)
    occurrence: int = 0


@dataclass(frozen=True, slots=True)
class Rejected:
    """A trace message that gave no spans: `reason` is a metric label, `detail` the why."""

    reason: str
    detail: str
    subject: str | None = None


def prepare(raw: RawTraceMessage, limits: DecodeLimits = DecodeLimits()) -> Prepared:
    """Decode and find the trace context; raises `DecodeError` (with a reason)."""
    msg = decode(raw, limits)
    ctx = trace_context(msg, raw.subject)
    issues: tuple[str, ...] = ()
    if ctx.adhoc_key is not None and msg.header("traceparent") is not None:
        issues = ("bad_traceparent: malformed traceparent, correlated by ad-hoc destination",)
    return Prepared(raw, msg, ctx, issues)


def finish(prepared: Prepared, occurrence: int, options: MappingOptions) -> Converted:
    """Map a prepared message as occurrence number `occurrence` of its reuse key."""
    ctx = prepared.ctx
    if occurrence and ctx.adhoc_key is not None:
        # A reused ad-hoc destination: each reuse becomes a trace of its own.
        ctx = trace_context(prepared.msg, prepared.raw.subject, occurrence)
    result = map_message(prepared.msg, ctx, options, occurrence)
    issues = [*prepared.issues, *result.issues]
    if occurrence:
        issues.append(f"reused_traceparent: occurrence {occurrence} of its trace context on this server")
    return Converted(result.spans, issues, occurrence)


class Converter:
    """Streaming conversion (the live bridge): arrival order, bounded reuse memory."""

    def __init__(
        self,
        options: MappingOptions = MappingOptions(),
        limits: DecodeLimits = DecodeLimits(),
        reuse_capacity: int = 100_000,
    ) -> None:
        self.options = options
        self.limits = limits
        self.reuse = ReuseDetector(reuse_capacity)

    def convert(self, raw: RawTraceMessage) -> Converted | Rejected:
        """Spans of one received trace message, or why it gave none. Never raises on input."""
        try:
            prepared = prepare(raw, self.limits)
        except DecodeError as exc:
            return Rejected(exc.reason, exc.detail, raw.subject)
        occurrence = self.reuse.occurrence(prepared.reuse_key, prepared.msg.ingress.ts_ns)
        return finish(prepared, occurrence, self.options)


def convert_batch(
    raws: Iterable[RawTraceMessage | Rejected],
    options: MappingOptions = MappingOptions(),
    limits: DecodeLimits = DecodeLimits(),
) -> list[Converted | Rejected]:
    """Whole-input conversion (`convert`, backfill): the result ignores the input order.

    Rejected items passed in (e.g. archive lines that did not parse) are passed through.
    """
    prepared: list[Prepared | Rejected] = []
    for raw in raws:
        if isinstance(raw, Rejected):
            prepared.append(raw)
            continue
        try:
            prepared.append(prepare(raw, limits))
        except DecodeError as exc:
            prepared.append(Rejected(exc.reason, exc.detail, raw.subject))
    good = [p for p in prepared if isinstance(p, Prepared)]
    occurrences = iter(assign_occurrences((p.reuse_key, p.msg.ingress.ts_ns) for p in good))
    return [p if isinstance(p, Rejected) else finish(p, next(occurrences), options) for p in prepared]
