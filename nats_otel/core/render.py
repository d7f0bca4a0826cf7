"""Trace trees for the terminal (`nats-otel show`), like `nats trace` draws them.

Pure: spans in, text out. The tree is the span tree itself: a server span, its event
spans, and under each forwarding egress the downstream server span whose parent it is.
A forwarding egress with no downstream server span is marked missing.
"""

from __future__ import annotations

from collections.abc import Iterable

from nats_otel.core.encode import split_by_trace
from nats_otel.core.records import SpanKind, SpanRecord, StatusCode

__all__ = ["render_traces"]

_RED, _YELLOW, _DIM, _BOLD, _RESET = "\033[31m", "\033[33m", "\033[2m", "\033[1m", "\033[0m"


def render_traces(spans: Iterable[SpanRecord], color: bool = False) -> str:
    """All traces of the spans, one tree each, sorted by trace id."""
    paint = _painter(color)
    blocks = [_render_trace(trace, paint) for trace in split_by_trace(spans)]
    return "\n".join(blocks)


def _painter(color: bool):
    def paint(text: str, style: str) -> str:
        return f"{style}{text}{_RESET}" if color else text

    return paint


def _ms(ns: int) -> str:
    return f"{ns / 1e6:.3f} ms"


def _render_trace(spans: list[SpanRecord], paint) -> str:
    by_id = {span.span_id: span for span in spans}
    children: dict[bytes, list[SpanRecord]] = {}
    for span in spans:
        children.setdefault(span.parent_span_id, []).append(span)
    roots = [s for s in spans if s.kind == SpanKind.CONSUMER and s.parent_span_id not in by_id]
    lines = [paint(f"trace {spans[0].trace_id.hex()}", _BOLD)]
    for index, root in enumerate(roots):
        last = index == len(roots) - 1
        parent = root.parent_span_id.hex() if root.parent_span_id else "none (ad-hoc trace)"
        if root.attribute("messaging.nats.trace.hop"):
            parent = f"{parent} {paint('(upstream server span missing)', _YELLOW)}"
        lines.append(f"{'└─ ' if last else '├─ '}{paint('parent span', _DIM)} {parent}")
        _server(root, children, "   " if last else "│  ", lines, paint, None)
    return "\n".join(lines)


def _server(span, children, indent, lines, paint, upstream_egress) -> None:
    server = span.resource.get("messaging.nats.server.name")
    cluster = span.resource.get("messaging.nats.server.cluster")
    kind = span.attribute("messaging.nats.connection.kind")
    conn = span.attribute("messaging.nats.connection.name")
    head = f"{paint(str(server), _BOLD)}"
    if cluster and cluster != server:
        head += f" [{cluster}]"
    hop = span.attribute("messaging.nats.trace.hop")
    subject = span.attribute("messaging.destination.name")
    head += f"  in {kind} {conn!s}  acc {span.attribute('messaging.nats.account')}  subj {subject}"
    if hop:
        head += f"  hop {hop}"
    if upstream_egress is not None:
        head += f"  {paint('+' + _ms(span.start_ns - upstream_egress.end_ns) + ' on the wire', _DIM)}"
    head += f"  ({_ms(span.end_ns - span.start_ns)} in server)"
    if span.attribute("messaging.nats.trace.only"):
        head += "  trace-only"
    if span.status_code == StatusCode.ERROR:
        head += "  " + paint(f"ERROR: {span.status_message}", _RED)
    lines.append(f"{indent}{head}")
    events = [c for c in children.get(span.span_id, []) if c.kind != SpanKind.CONSUMER]
    for index, event in enumerate(events):
        last = index == len(events) - 1
        branch, cont = ("└─ ", "   ") if last else ("├─ ", "│  ")
        lines.append(f"{indent}{branch}{_event_text(event, paint)}")
        event_hop = event.attribute("messaging.nats.trace.hop")
        if event.kind == SpanKind.PRODUCER and event_hop:
            downstream = [c for c in children.get(event.span_id, []) if c.kind == SpanKind.CONSUMER]
            for child in downstream:
                _server(child, children, indent + cont, lines, paint, event)
            if not downstream:
                if event.attribute("messaging.nats.trace.note"):
                    text = "remote server does not trace"
                else:
                    peer = event.attribute("messaging.nats.peer.server.name")
                    text = f"MISSING: no trace message from {peer} (hop {event_hop})"
                lines.append(f"{indent}{cont}└─ {paint(text, _YELLOW)}")


def _event_text(event: SpanRecord, paint) -> str:
    after = paint(f"+{_ms(event.end_ns - event.start_ns)}", _DIM)
    if event.kind == SpanKind.PRODUCER:
        kind = event.attribute("messaging.nats.connection.kind")
        name = event.attribute("messaging.nats.connection.name")
        text = f"eg {kind} → {name}"
        if event.attribute("messaging.nats.trace.hop"):
            text += f" hop {event.attribute('messaging.nats.trace.hop')}"
        if event.attribute("messaging.nats.subscription.subject"):
            text += f"  sub {event.attribute('messaging.nats.subscription.subject')}"
        if event.attribute("messaging.consumer.group.name"):
            text += f"  queue {event.attribute('messaging.consumer.group.name')}"
        text += f"  acc {event.attribute('messaging.nats.account')}"
    else:
        text = event.name
        if event.attribute("messaging.nats.jetstream.no_interest"):
            text += "  (no interest)"
    text += f"  {after}"
    if event.status_code == StatusCode.ERROR:
        text += "  " + paint(f"ERROR: {event.status_message}", _RED)
    elif event.attribute("messaging.nats.trace.note"):
        text += "  " + paint(str(event.attribute("messaging.nats.trace.note")), _YELLOW)
    return text
