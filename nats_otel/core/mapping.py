"""TraceMessage -> span records (DESIGN §3). Pure and deterministic.

One server span per trace message (the message's stay in that server), one child span per
later event. The origin server span is the child of the application's span named by the
traceparent; a downstream server span is the child of the upstream egress span that
forwarded that message, as `linking` decided (the `Placement` says where spans go).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from nats_otel import __version__
from nats_otel.core.ids import TraceContext, event_span_id, server_span_id, upstream_hop
from nats_otel.core.model import (
    ConnectionKind,
    Egress,
    JetStreamEvent,
    ServerInfo,
    ServiceImport,
    StreamExport,
    SubjectMapping,
    TraceEvent,
    TraceMessage,
    kind_label,
)
from nats_otel.core.records import AttrValue, Resource, SpanKind, SpanRecord, StatusCode

__all__ = [
    "DEFAULT_HEADER_ALLOWLIST",
    "HEADER_ATTRIBUTE_PREFIX",
    "SERVICE_NAME_FIELDS",
    "MappingOptions",
    "MappingResult",
    "Placement",
    "check_service_name",
    "is_failure",
    "map_message",
    "server_resource",
    "service_name_of",
]

# Trace headers and the dedup id: safe to export. Application headers (Authorization,
# cookies, tenant ids) are never copied unless a user adds them.
DEFAULT_HEADER_ALLOWLIST = frozenset(
    {"traceparent", "tracestate", "nats-msg-id", "nats-trace-dest", "nats-trace-hop", "nats-trace-only"}
)

# Span attributes copied from the traced message's headers: `messaging.nats.header.<lower-case name>`.
HEADER_ATTRIBUTE_PREFIX = "messaging.nats.header."

# Errors the servers report that are not failures: the message was delivered.
_NOT_FAILURES = ("Message delivered but remote does not support message tracing",)

SCOPE_NAME = "nats-otel"
SCOPE_VERSION = __version__


@dataclass(frozen=True, slots=True)
class MappingOptions:
    """What users may choose about the spans. Defaults are the documented span model."""

    #: The resource's `service.name`: fixed, or a template of the reporting server
    #: (`SERVICE_NAME_FIELDS`), e.g. "nats/{cluster}" to make each cluster a node of a
    #: service graph (docs/span-model.md, "service.name").
    service_name: str = "nats-server"
    header_allowlist: frozenset[str] = DEFAULT_HEADER_ALLOWLIST

    def __post_init__(self) -> None:
        check_service_name(self.service_name)


# What a `service.name` template may use, from the reporting server's own report.
SERVICE_NAME_FIELDS = ("server", "cluster", "domain")


def check_service_name(template: str) -> None:
    """Raise ValueError naming the problem if `template` is not a usable service.name."""
    try:
        name = template.format(server="s", cluster="c", domain="d")
    except (KeyError, IndexError, ValueError) as exc:
        fields = ", ".join("{" + f + "}" for f in SERVICE_NAME_FIELDS)
        raise ValueError(f"service name {template!r}: {type(exc).__name__} {exc}; "
                         f"a template may use only {fields}") from None
    if not name.strip():
        raise ValueError("service name is empty")


def service_name_of(server: ServerInfo, template: str) -> str:
    """`template` filled in for one server. A server outside any cluster (standalone, or a
    leafnode server) is a cluster of its own: `{cluster}` is then its name."""
    if "{" not in template:
        return template
    return template.format(server=server.name, cluster=server.cluster or server.name, domain=server.domain)


@dataclass(frozen=True, slots=True)
class MappingResult:
    """Spans of one trace message, server span first, and what was odd about it."""

    spans: list[SpanRecord]
    issues: list[str] = field(default_factory=list)


class Placement(NamedTuple):
    """Where one report's spans go, decided before mapping (`pipeline`, `linking`).

    `link` is "" for an origin report (its parent is the producer's span) and the linking
    result for a downstream one; `candidates` is how many egresses could have been its
    parent when that was `ambiguous`.
    """

    ident: bytes
    trace_id: bytes
    parent_span_id: bytes
    link: str = ""
    candidates: int = 0


@dataclass(slots=True)
class _State:
    """What the event mappers share while walking one server's events."""

    ctx: TraceContext
    msg: TraceMessage
    trace_id: bytes
    ident: bytes
    server_span_id: bytes
    resource: Resource
    subject: str
    account: str


def map_message(
    msg: TraceMessage,
    ctx: TraceContext,
    placement: Placement,
    options: MappingOptions = MappingOptions(),
) -> MappingResult:
    """Map one trace message to its spans. Same inputs, same spans, byte for byte."""
    hop = upstream_hop(msg)
    ingress = msg.ingress
    state = _State(
        ctx=ctx,
        msg=msg,
        trace_id=placement.trace_id,
        ident=placement.ident,
        server_span_id=server_span_id(ctx, placement.ident),
        resource=server_resource(msg.server, options.service_name),
        subject=ingress.subject,
        account=ingress.account,
    )
    issues = [f"unknown_event: {u['problem']} at position {u['position']}" for u in msg.unknown_events]
    children: list[SpanRecord] = []
    for position, event in enumerate(msg.events, start=1):
        mapper = _EVENT_MAPPERS[type(event)]
        children.append(mapper(event, position, state))
    status_code, status_message, note = _status(ingress.error)
    attributes: dict[str, AttrValue] = {
        "messaging.system": "nats",
        "messaging.operation.type": "receive",
        "messaging.operation.name": "receive",
        "messaging.destination.name": ingress.subject,
        # msgsize counts headers too: the envelope, not the body.
        "messaging.message.envelope.size": msg.msg_size,
        "messaging.nats.account": ingress.account,
        "messaging.nats.connection.kind": kind_label(ingress.kind),
        "messaging.nats.connection.id": ingress.cid,
        "messaging.nats.connection.name": ingress.name,
        "messaging.nats.trace.hops": msg.hops,
    }
    if ingress.kind == ConnectionKind.CLIENT:
        # The publishing client, as the server knows it (nats clients' `client_id` is this cid).
        attributes["messaging.client.id"] = str(ingress.cid)
    if hop:
        attributes["messaging.nats.trace.hop"] = hop
    if _trace_only(msg):
        attributes["messaging.nats.trace.only"] = True
    if ctx.adhoc_key is not None:
        attributes["messaging.nats.trace.adhoc_subject"] = ctx.adhoc_key
    if placement.link and placement.link != "matched":
        # Not linked to an upstream egress: the span hangs under the producer's span.
        attributes["messaging.nats.trace.link"] = placement.link
        if placement.candidates:
            attributes["messaging.nats.trace.link.candidates"] = placement.candidates
    if msg.unknown_events:
        attributes["messaging.nats.trace.unmapped_events"] = len(msg.unknown_events)
    if note:
        attributes["messaging.nats.trace.note"] = note
    for name, values in msg.headers.items():
        lowered = name.lower()
        if lowered in options.header_allowlist:
            attributes[HEADER_ATTRIBUTE_PREFIX + lowered] = tuple(values)
    server_span = SpanRecord(
        placement.trace_id,
        state.server_span_id,
        placement.parent_span_id,
        f"receive {ingress.subject}" if ingress.subject else "receive",
        SpanKind.CONSUMER,
        ingress.ts_ns,
        msg.end_ns,
        state.resource,
        tuple(attributes.items()),
        status_code,
        status_message,
        ctx.trace_state,
    )
    return MappingResult([server_span, *children], issues)


_resources: dict[tuple, Resource] = {}


def server_resource(server: ServerInfo, service_name: str) -> Resource:
    """The OTel resource of a server: who produced the spans (memoised: a pure function)."""
    key = (service_name, server.id, server.name, server.version, server.host, server.cluster,
           server.domain, tuple(server.tags), server.jetstream)
    resource = _resources.get(key)
    if resource is None:
        if len(_resources) > 4096:
            _resources.clear()
        resource = _resources[key] = _build_resource(server, service_name)
    return resource


def _build_resource(server: ServerInfo, service_name: str) -> Resource:
    attributes: list[tuple[str, AttrValue]] = [
        ("service.name", service_name_of(server, service_name)),
        ("service.instance.id", server.id),
    ]
    if server.version:
        attributes.append(("service.version", server.version))
    if server.host:
        attributes.append(("host.name", server.host))
    attributes.append(("messaging.nats.server.name", server.name))
    if server.cluster:
        attributes.append(("messaging.nats.server.cluster", server.cluster))
    if server.domain:
        attributes.append(("messaging.nats.server.domain", server.domain))
    if server.tags:
        attributes.append(("messaging.nats.server.tags", tuple(server.tags)))
    attributes.append(("messaging.nats.server.jetstream", server.jetstream))
    return Resource(tuple(attributes))


def _trace_only(msg: TraceMessage) -> bool:
    """Whether the server traced without delivering.

    Servers honour `Nats-Trace-Only` only on ad-hoc traces (with `Nats-Trace-Dest`); a
    message traced for its traceparent alone is delivered whatever that header says.
    """
    if not msg.header("Nats-Trace-Dest"):
        return False
    return (msg.header("Nats-Trace-Only") or "").lower() in ("1", "true", "on")


def is_failure(error: str) -> bool:
    """Whether a server-reported error text is a failure (status ERROR), not a note."""
    return bool(error) and not error.startswith(_NOT_FAILURES)


def _status(error: str) -> tuple[int, str, str]:
    """(status code, status message, note) for a server-reported error text."""
    if not error:
        return StatusCode.UNSET, "", ""
    if not is_failure(error):
        return StatusCode.UNSET, "", error
    return StatusCode.ERROR, error, ""


def _child(
    state: _State,
    span_id: bytes,
    name: str,
    kind: int,
    end_ns: int,
    attributes: dict[str, AttrValue],
    error: str = "",
) -> SpanRecord:
    status_code, status_message, note = _status(error)
    if note:
        attributes["messaging.nats.trace.note"] = note
    start_ns = state.msg.ingress.ts_ns
    # Positional: a NamedTuple is built faster so, and this runs for every span.
    return SpanRecord(
        state.trace_id,
        span_id,
        state.server_span_id,  # parent
        name,
        kind,
        start_ns,  # with the server span: the bar shows how long after arrival it happened
        end_ns if end_ns > start_ns else start_ns,
        state.resource,
        tuple(attributes.items()),
        status_code,
        status_message,
        state.ctx.trace_state,
    )


def _event_id(state: _State, position: int) -> bytes:
    return event_span_id(state.ctx, state.ident, position)


def _map_egress(event: Egress, position: int, state: _State) -> SpanRecord:
    attributes: dict[str, AttrValue] = {
        "messaging.system": "nats",
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
        "messaging.destination.name": state.subject,
        "messaging.nats.account": event.account or state.account,
        "messaging.nats.connection.kind": kind_label(event.kind),
        "messaging.nats.connection.id": event.cid,
        "messaging.nats.connection.name": event.name,
    }
    if event.kind == ConnectionKind.CLIENT:
        attributes["messaging.client.id"] = str(event.cid)  # the receiving client
    if event.subscription:
        attributes["messaging.nats.subscription.subject"] = event.subscription
    if event.queue:
        attributes["messaging.consumer.group.name"] = event.queue
    if event.forwards:
        attributes["messaging.nats.trace.hop"] = event.hop
        attributes["messaging.nats.peer.server.name"] = event.name
    span_id = _event_id(state, position)
    name = f"send {state.subject}" if state.subject else "send"
    return _child(state, span_id, name, SpanKind.PRODUCER, event.ts_ns, attributes, event.error)


def _map_subject_mapping(event: SubjectMapping, position: int, state: _State) -> SpanRecord:
    attributes: dict[str, AttrValue] = {
        "messaging.nats.mapping.from": state.subject,
        "messaging.nats.mapping.to": event.to,
    }
    state.subject = event.to  # later egresses deliver on the mapped subject
    return _child(state, _event_id(state, position), f"map {event.to}", SpanKind.INTERNAL, event.ts_ns, attributes)


def _map_stream_export(event: StreamExport, position: int, state: _State) -> SpanRecord:
    attributes: dict[str, AttrValue] = {
        "messaging.nats.export.account": event.account,
        "messaging.nats.export.subject": event.to,
    }
    name = f"stream export {event.account}"
    return _child(state, _event_id(state, position), name, SpanKind.INTERNAL, event.ts_ns, attributes)


def _map_service_import(event: ServiceImport, position: int, state: _State) -> SpanRecord:
    attributes: dict[str, AttrValue] = {
        "messaging.nats.import.account": event.account,
        "messaging.nats.import.from": event.from_subject,
        "messaging.nats.import.to": event.to,
    }
    # The message continues in the exporting account, on the service's subject.
    state.subject, state.account = event.to, event.account
    name = f"service import {event.account}"
    return _child(state, _event_id(state, position), name, SpanKind.INTERNAL, event.ts_ns, attributes)


def _map_jetstream(event: JetStreamEvent, position: int, state: _State) -> SpanRecord:
    attributes: dict[str, AttrValue] = {
        # The stream takes the message in: a consumer processing it, for the conventions.
        "messaging.system": "nats",
        "messaging.operation.type": "process",
        "messaging.operation.name": "store",
        "messaging.destination.name": event.subject or state.subject,
        "messaging.nats.jetstream.stream": event.stream,
        # No interest on an interest-retention stream is an outcome, not a failure.
        "messaging.nats.jetstream.no_interest": event.no_interest,
    }
    name = f"store {event.stream}" if event.stream else "store"
    return _child(state, _event_id(state, position), name, SpanKind.INTERNAL, event.ts_ns, attributes, event.error)


_EVENT_MAPPERS: dict[type, Callable[[TraceEvent, int, _State], SpanRecord]] = {
    Egress: _map_egress,  # type: ignore[dict-item]
    SubjectMapping: _map_subject_mapping,  # type: ignore[dict-item]
    StreamExport: _map_stream_export,  # type: ignore[dict-item]
    ServiceImport: _map_service_import,  # type: ignore[dict-item]
    JetStreamEvent: _map_jetstream,  # type: ignore[dict-item]
}
