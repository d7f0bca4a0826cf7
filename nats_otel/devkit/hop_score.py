"""A bridge's or `convert`'s hop links scored against `devkit.hop_truth`'s truth.

`score` classifies each hop of the truth by the downstream server span an output holds for
it: right (its parent is the true egress), unmatched or ambiguous (the span says so, in
`messaging.nats.trace.link`), wrong (any other parent), missing (no such span). The readers
turn the outputs the project writes (OTLP/JSON lines, OTLP protobuf as a receiver recorded
it, `SpanRecord`s) into the `SpanView`s it needs. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import orjson

from nats_otel.core.records import SpanKind, SpanRecord
from nats_otel.devkit.hop_truth import Hop, Truth

__all__ = [
    "AMBIGUOUS",
    "MISSING",
    "RIGHT",
    "UNMATCHED",
    "WRONG",
    "Score",
    "SpanView",
    "read_otlp_json_lines",
    "read_otlp_spans",
    "score",
    "spans_from_records",
]

RIGHT = "right"
WRONG = "wrong"
UNMATCHED = "unmatched"
AMBIGUOUS = "ambiguous"
MISSING = "missing"

_LINK_ATTRIBUTE = "messaging.nats.trace.link"


class SpanView(NamedTuple):
    """What scoring needs of an output span."""

    span_id: bytes
    parent_span_id: bytes
    kind: int
    link: str  # `messaging.nats.trace.link` ("" when linked or an origin)


def read_otlp_json_lines(lines: Iterable[bytes | str]) -> Iterator[SpanView]:
    """The server spans (CONSUMER) of OTLP/JSON lines: the bridge's `--output`, `nats-otel convert -o`."""
    for line in lines:
        if not line.strip():
            continue
        request: dict[str, Any] = orjson.loads(line)
        for resource_spans in request.get("resourceSpans", ()):
            for scope_spans in resource_spans.get("scopeSpans", ()):
                for span in scope_spans.get("spans", ()):
                    if span.get("kind") != SpanKind.CONSUMER:
                        continue
                    link = ""
                    for attribute in span.get("attributes", ()):
                        if attribute.get("key") == _LINK_ATTRIBUTE:
                            link = attribute.get("value", {}).get("stringValue", "")
                    yield SpanView(bytes.fromhex(span["spanId"]), bytes.fromhex(span.get("parentSpanId", "")),
                                   SpanKind.CONSUMER, link)


def read_otlp_spans(spans: Iterable[tuple[Any, Any]]) -> Iterator[SpanView]:
    """The server spans (CONSUMER) of OTLP protobuf spans as a receiver recorded them
    (`receivers.OTLPGrpcReceiver.spans()`: (resource, span) pairs)."""
    for _resource, span in spans:
        if span.kind != SpanKind.CONSUMER:
            continue
        link = next((attribute.value.string_value for attribute in span.attributes
                     if attribute.key == _LINK_ATTRIBUTE), "")
        yield SpanView(bytes(span.span_id), bytes(span.parent_span_id), SpanKind.CONSUMER, link)


def spans_from_records(records: Iterable[SpanRecord]) -> Iterator[SpanView]:
    """The server spans of span records (e.g. `pipeline.convert_batch`'s)."""
    for record in records:
        if record.kind == SpanKind.CONSUMER:
            link = next((str(value) for key, value in record.attributes if key == _LINK_ATTRIBUTE), "")
            yield SpanView(record.span_id, record.parent_span_id, record.kind, link)


@dataclass(slots=True)
class Score:
    """How an output's downstream server spans compare with the truth."""

    counts: Counter[str] = field(default_factory=Counter)
    #: Span ids output more than once with different parents (several bridges, redeliveries).
    conflicting_duplicates: int = 0
    #: Some wrongly linked hops, for the report.
    wrong_examples: list[tuple[Hop, bytes]] = field(default_factory=list)
    #: Of the wrong ones: how far (in messages along the connection) the chosen egress was.
    wrong_offsets: Counter[int] = field(default_factory=Counter)
    #: The hops left unmatched or ambiguous, (result, hop): where in the traffic a failed
    #: run lost its links (its start, a stretch of one connection, its end) says why.
    unlinked: list[tuple[str, Hop]] = field(default_factory=list)
    #: The first hop's arrival (ns): the traffic's start, for `describe_unlinked`.
    first_arrival_ns: int = 0

    @property
    def hops(self) -> int:
        return sum(self.counts.values())

    @property
    def present(self) -> int:
        return self.hops - self.counts[MISSING]

    def describe_unlinked(self, limit: int = 6) -> str:
        """Where the unlinked hops were: per result and connection, the messages' positions
        along it (first and last few) and their arrivals in ms from the traffic's first."""
        if not self.unlinked:
            return "none unlinked"
        groups: dict[tuple[str, str], list[Hop]] = {}
        for result, hop in self.unlinked:
            groups.setdefault((result, hop.link.label()), []).append(hop)
        parts = []
        for (result, label), hops in sorted(groups.items()):
            hops.sort(key=lambda hop: hop.index)
            shown = hops if len(hops) <= limit else hops[:limit // 2] + hops[-(limit // 2):]
            where = ", ".join(f"#{hop.index} @{(hop.arrival_ts_ns - self.first_arrival_ns) / 1e6:.0f}" for hop in shown)
            parts.append(f"{len(hops)} {result} on {label}: {where}")
        return "; ".join(parts)

    def fraction(self, result: str) -> float:
        """Of the hops whose span is present: what fraction had this result."""
        return self.counts[result] / self.present if self.present else 0.0


def score(truth: Truth, spans: Iterable[SpanView], only: Collection[bytes] | None = None) -> Score:
    """Classify every hop of the truth (or of `only`: downstream identities) in an output.

    right: its server span's parent is the true egress; unmatched / ambiguous: the span says
    so (`messaging.nats.trace.link`) and hangs under the producer's span; wrong: any other
    parent (another message's egress); missing: no server span with its id.
    """
    by_span_id = {hop.downstream_span_id: hop for hop in truth.hops.values()}
    parents: dict[bytes, SpanView] = {}
    result = Score()
    for span in spans:
        seen = parents.get(span.span_id)
        if seen is None:
            parents[span.span_id] = span
        elif (seen.parent_span_id, seen.link) != (span.parent_span_id, span.link):
            result.conflicting_duplicates += 1
            owner = by_span_id.get(span.span_id)
            if owner is not None and seen.parent_span_id == owner.parent_span_id:
                parents[span.span_id] = span  # keep the worse copy: a wrong or lost link must show
    egress_index = {hop.parent_span_id: hop for hop in truth.hops.values()}
    result.first_arrival_ns = min((hop.arrival_ts_ns for hop in truth.hops.values()), default=0)
    for ident, hop in truth.hops.items():
        if only is not None and ident not in only:
            continue
        output = parents.get(hop.downstream_span_id)
        if output is None:
            result.counts[MISSING] += 1
        elif output.parent_span_id == hop.parent_span_id:
            result.counts[RIGHT] += 1
        elif output.link in (UNMATCHED, AMBIGUOUS):
            result.counts[output.link] += 1
            result.unlinked.append((output.link, hop))
        else:
            result.counts[WRONG] += 1
            chosen = egress_index.get(output.parent_span_id)
            if chosen is not None and chosen.link == hop.link:
                result.wrong_offsets[chosen.index - hop.index] += 1
            if len(result.wrong_examples) < 10:
                result.wrong_examples.append((hop, output.parent_span_id))
    return result
