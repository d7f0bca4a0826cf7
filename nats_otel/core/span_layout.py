"""The attribute keys of every span `mapping` makes, read from mapping.py itself.

The compiled mapper (`_mapping.pyx`) writes the spans `mapping.map_message` would make
straight into protobuf bytes. It knows which value goes where, but not the attribute
names: those (and the constant values) it takes from here, where one probe message with
every optional attribute present is mapped by mapping.py and the keys are read back in
order. Renaming an attribute in mapping.py changes both cores at once. A change of layout
(an attribute added, removed or moved, a span renamed) is caught by checking the probe's
values position by position: the compiled mapper is then not used (`layouts` raises
`LayoutChanged`, `accel` reports why) until `_mapping.pyx` learns the new layout.
"""

from __future__ import annotations

from typing import Any

import orjson

from nats_otel.core.decode import RawTraceMessage, decode
from nats_otel.core.ids import TraceContext, identity
from nats_otel.core.mapping import _NOT_FAILURES, HEADER_ATTRIBUTE_PREFIX, MappingOptions, Placement, map_message
from nats_otel.core.records import AttrValue

__all__ = ["ROLES", "LayoutChanged", "layouts"]

# The spans of one trace message, in the order the probe maps them.
ROLES = ("server", "egress", "mapping", "export", "import", "jetstream")

_NOTE = _NOT_FAILURES[0] + " (probe)"
_SUBJECT = "probe.subject"
_CONST = object()  # a constant: its value is taken from the probe as it is

# What `_mapping.pyx` writes at each position of each span, as the probe's value there
# (`_CONST`: a constant). Must change together with `_mapping.pyx`.
_EXPECTED: dict[str, tuple[Any, ...]] = {
    "server": (_CONST, _CONST, _CONST, _SUBJECT, 4242, "probe-acc", "router", 777, "probe-in", 3,
               "probe-hop", True, "probe.adhoc", "ambiguous", 2, 1, _NOTE),
    "egress": (_CONST, _CONST, _CONST, _SUBJECT, "probe-eg-acc", "gateway", 778, "probe-eg", "probe.sub",
               "probe-queue", "probe-eg-hop", "probe-eg", _NOTE),
    "mapping": (_SUBJECT, "probe.mapped"),
    "export": ("probe-se-acc", "probe.se.to"),
    "import": ("probe-si-acc", "probe.si.from", "probe.si.to"),
    "jetstream": ("PROBE", "probe.js.subject", True, _NOTE),
}
_NAMES = ("receive probe.subject", "send probe.subject", "map probe.mapped", "stream export probe-se-acc",
          "service import probe-si-acc", "store PROBE")


class LayoutChanged(Exception):
    """mapping.py makes spans `_mapping.pyx` does not know how to write."""


def _probe() -> list[Any]:
    def ts(n: int) -> str:
        return f"2026-11-22T02:16:30.{n:09d}Z"

    doc = {
        "server": {"name": "probe-server", "id": "PROBE-ID"},
        "request": {"msgsize": 4242, "header": {
            "traceparent": ["00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"],
            "Nats-Trace-Hop": ["probe-hop"], "Nats-Trace-Dest": ["probe.dest"], "Nats-Trace-Only": ["true"]}},
        "hops": 3,
        "events": [
            {"type": "in", "ts": ts(1), "kind": 1, "cid": 777, "name": "probe-in", "acc": "probe-acc",
             "subj": _SUBJECT, "error": _NOTE},
            {"type": "eg", "ts": ts(2), "kind": 2, "cid": 778, "name": "probe-eg", "hop": "probe-eg-hop",
             "acc": "probe-eg-acc", "sub": "probe.sub", "queue": "probe-queue", "error": _NOTE},
            {"type": "sm", "ts": ts(3), "to": "probe.mapped"},
            {"type": "se", "ts": ts(4), "acc": "probe-se-acc", "to": "probe.se.to"},
            {"type": "si", "ts": ts(5), "acc": "probe-si-acc", "from": "probe.si.from", "to": "probe.si.to"},
            {"type": "js", "ts": ts(6), "stream": "PROBE", "subject": "probe.js.subject", "nointerest": True,
             "error": _NOTE},
            {"type": "probe-unknown", "ts": ts(7)},
        ],
    }
    msg = decode(RawTraceMessage("probe.trace", {}, orjson.dumps(doc)))
    ctx = TraceContext(b"\x01" * 16, b"\x02" * 8, "", True, "probe.adhoc")
    placement = Placement(identity(msg), b"\x03" * 16, b"\x02" * 8, "ambiguous", 2)
    return map_message(msg, ctx, placement, MappingOptions()).spans


def layouts() -> dict[str, list[tuple[str, AttrValue]]]:
    """Per span role, its attribute (key, probe value) pairs in mapping.py's order (copied
    message headers left out); `LayoutChanged` if they are not what `_mapping.pyx` writes."""
    spans = _probe()
    if len(spans) != len(ROLES):
        raise LayoutChanged(f"the probe message gave {len(spans)} spans, not {len(ROLES)}")
    out: dict[str, list[tuple[str, AttrValue]]] = {}
    for role, span, name in zip(ROLES, spans, _NAMES, strict=True):
        pairs = [pair for pair in span.attributes if not pair[0].startswith(HEADER_ATTRIBUTE_PREFIX)]
        expected = _EXPECTED[role]
        values = tuple(value for _, value in pairs)
        if span.name != name or len(values) != len(expected) or any(
                want is not _CONST and (got != want or type(got) is not type(want))
                for got, want in zip(values, expected, strict=True)):
            raise LayoutChanged(f"the {role} span's layout changed: {span.name!r}, {pairs!r}")
        out[role] = pairs
    return out
