"""Checks every test of span output shares: what a user's own verification would do.

Given the raw trace messages and the OTLP/JSON (or protobuf) that came out, verify the
span model independently of the mapping code: parse with the official protobuf JSON
parser, then check times, parents, hop links, ids and errors against the raw JSON.
"""

from __future__ import annotations

import base64
import json
from collections import Counter
from dataclasses import dataclass

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from nats_otel.core.decode import DecodeLimits, RawTraceMessage, decompress
from nats_otel.core.timestamps import parse_rfc3339_ns

_ID_FIELDS = ("traceId", "spanId", "parentSpanId")


@dataclass
class FlatSpan:
    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    kind: int
    start_ns: int
    end_ns: int
    attributes: dict
    resource: dict
    status_code: int
    status_message: str


def _hex_ids_to_base64(node):
    # OTLP/JSON uses hex ids where the generic protobuf JSON mapping expects base64.
    if isinstance(node, dict):
        return {
            k: (base64.b64encode(bytes.fromhex(v)).decode() if k in _ID_FIELDS and isinstance(v, str)
                else _hex_ids_to_base64(v))
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [_hex_ids_to_base64(v) for v in node]
    return node


def _value(any_value):
    which = any_value.WhichOneof("value")
    if which == "array_value":
        return tuple(_value(v) for v in any_value.array_value.values)
    return getattr(any_value, which) if which else None


def flatten(request: ExportTraceServiceRequest) -> list[FlatSpan]:
    spans = []
    for rs in request.resource_spans:
        resource = {kv.key: _value(kv.value) for kv in rs.resource.attributes}
        for ss in rs.scope_spans:
            for s in ss.spans:
                spans.append(
                    FlatSpan(
                        trace_id=s.trace_id.hex(),
                        span_id=s.span_id.hex(),
                        parent_span_id=s.parent_span_id.hex(),
                        name=s.name,
                        kind=s.kind,
                        start_ns=s.start_time_unix_nano,
                        end_ns=s.end_time_unix_nano,
                        attributes={kv.key: _value(kv.value) for kv in s.attributes},
                        resource=resource,
                        status_code=s.status.code,
                        status_message=s.status.message,
                    )
                )
    return spans


def parse_otlp_json_lines(data: bytes) -> list[FlatSpan]:
    """Parse OTLP/JSON lines strictly (unknown fields are errors) with the protobuf parser."""
    spans = []
    for line in data.splitlines():
        if not line.strip():
            continue
        request = ExportTraceServiceRequest()
        json_format.Parse(json.dumps(_hex_ids_to_base64(json.loads(line))), request)
        spans.extend(flatten(request))
    return spans


def raw_documents(raws: list[RawTraceMessage]) -> list[dict]:
    return [json.loads(decompress(r.payload, r.header("Content-Encoding"), DecodeLimits())) for r in raws]


def check_span_model(spans: list[FlatSpan], raws: list[RawTraceMessage]) -> None:
    """Assert the span model holds for these raw trace messages (raises AssertionError)."""
    ids = Counter(s.span_id for s in spans)
    dupes = [i for i, n in ids.items() if n > 1]
    assert not dupes, f"span ids shared by several spans: {dupes[:5]}"
    assert all(s.span_id != "0" * 16 and s.trace_id != "0" * 32 for s in spans)
    by_id = {s.span_id: s for s in spans}
    servers = [s for s in spans if s.kind == 5]
    docs = raw_documents(raws)
    assert len(servers) == len(docs), f"{len(servers)} server spans for {len(docs)} trace messages"
    # One server span per message: match by (server id, ingress ts), then check it.
    for doc in docs:
        ingress = doc["events"][0]
        start = parse_rfc3339_ns(ingress["ts"])
        end = max(parse_rfc3339_ns(e["ts"]) for e in doc["events"])
        matches = [s for s in servers
                   if s.resource["service.instance.id"] == doc["server"]["id"] and s.start_ns == start]
        assert matches, f"no server span for {doc['server']['name']} at {ingress['ts']}"
        # (several only for a reused traceparent with identical ingress time: not in data)
        span = matches[0]
        assert span.end_ns == end, "server span must end at the last event ts"
        children = [c for c in spans if c.parent_span_id == span.span_id and c.kind != 5]
        assert len(children) == len(doc["events"]) - 1, (
            f"{len(children)} event spans for {len(doc['events']) - 1} events")
        header = {k.lower(): v for k, v in doc["request"].get("header", {}).items()}
        hop = header.get("nats-trace-hop", [""])[0] if ingress["kind"] in (1, 2, 4) else ""
        if "traceparent" in header:
            _, trace_hex, parent_hex, _ = header["traceparent"][0].lower().split("-")
            assert span.trace_id == trace_hex
            if not hop:
                assert span.parent_span_id == parent_hex, "origin server span must be the traceparent's child"
        if hop:
            parent = by_id.get(span.parent_span_id)
            if parent is not None:
                assert parent.kind == 4 and parent.attributes.get("messaging.nats.trace.hop") == hop, (
                    "parent must be the egress with the same hop id")
        if ingress.get("error"):
            assert span.status_code == 2 and span.status_message == ingress["error"]
        for child in children:
            assert child.start_ns == start and child.end_ns >= start
        errors = [e["error"] for e in doc["events"][1:]
                  if e.get("error") and not e["error"].startswith("Message delivered")]
        assert sorted(c.status_message for c in children if c.status_code == 2) == sorted(errors)


def orphan_parents(spans: list[FlatSpan], external_parents: set[str]) -> list[FlatSpan]:
    """Spans whose parent is neither in the output nor an application span."""
    ids = {s.span_id for s in spans}
    return [s for s in spans
            if s.parent_span_id and s.parent_span_id not in ids and s.parent_span_id not in external_parents]
