"""OTLP/JSON in pieces: each span encoded once where it is mapped, traces assembled later.

`nats-otel convert` writes one line per trace: `to_otlp_json_line(trace)`, the trace's
spans sorted by (start, end, span id) and grouped by resource in order of first
appearance. Encoding a span is most of that work, and it needs the `SpanRecord`; the
backfill has the record only in the transform, before the shuffle that brings a trace's
spans together. So the transform keeps each span's OTLP/JSON object (and its resource's)
as text, and the sink only sorts, groups and splices them with `orjson.Fragment`: the
same bytes as `to_otlp_json_line`, whose own output is the source of every piece.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import orjson

from nats_otel.core.encode import group_by_resource, to_otlp_json
from nats_otel.core.records import Resource, SpanRecord

__all__ = ["TracePiece", "span_pieces", "trace_line"]

# (start ns, end ns, span id hex, resource key, resource OTLP/JSON, span OTLP/JSON): one
# span of a trace, as the sink needs it. Hex span ids sort like the bytes they encode.
TracePiece = tuple[int, int, str, object, str, str]


def span_pieces(spans: Sequence[SpanRecord]) -> list[tuple[str, str]]:
    """(resource OTLP/JSON, span OTLP/JSON) of each span, in the order given."""
    doc = to_otlp_json(spans)
    out: dict[int, tuple[str, str]] = {}
    for (_, group), entry in zip(group_by_resource(spans), doc["resourceSpans"], strict=True):
        resource = orjson.dumps(entry["resource"]).decode()
        for span, span_doc in zip(group, entry["scopeSpans"][0]["spans"], strict=True):
            out[id(span)] = (resource, orjson.dumps(span_doc).decode())
    return [out[id(span)] for span in spans]


@functools.cache
def _scope() -> orjson.Fragment:
    probe = SpanRecord(b"\x01" * 16, b"\x01" * 8, b"", "probe", 1, 0, 0, Resource(()))
    return orjson.Fragment(orjson.dumps(to_otlp_json([probe])["resourceSpans"][0]["scopeSpans"][0]["scope"]))


def trace_line(pieces: list[TracePiece], resource_key: Callable[[object], object] = lambda key: key) -> str:
    """The OTLP/JSON line (no newline) of one trace, byte-equal to `to_otlp_json_line`.

    `resource_key` turns a piece's resource key into what groups spans: resources that
    `Resource.__eq__` calls equal must share a group, exactly as in `group_by_resource`.
    """
    pieces.sort(key=lambda p: (p[0], p[1], p[2]))
    groups: dict[object, tuple[str, list[orjson.Fragment]]] = {}
    for _, _, _, key, resource, span in pieces:
        group = groups.get(resource_key(key))
        if group is None:
            group = groups[resource_key(key)] = (resource, [])
        group[1].append(orjson.Fragment(span))
    scope = _scope()
    doc = {
        "resourceSpans": [
            {"resource": orjson.Fragment(resource), "scopeSpans": [{"scope": scope, "spans": spans}]}
            for resource, spans in groups.values()
        ]
    }
    return orjson.dumps(doc).decode()
