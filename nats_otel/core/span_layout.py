"""The attribute keys of every span `mapping` makes, read from mapping.py itself.

The kernel's mapping stage (`_stage_map.pxi`) writes the spans `mapping.map_message` would
make straight into protobuf bytes. It knows which value goes where, but not the attribute
names: those (and the constant values) it takes from here, where two probe messages that
between them show every optional attribute are mapped by mapping.py and the keys are read
back in order. Renaming an attribute in mapping.py changes both cores at once. A change of
layout (an attribute added, removed or moved, a span renamed) is caught by checking the
probe's values position by position: the kernel then refuses to import (`layouts` raises
`LayoutChanged`, `accel` reports why) and the reference runs, until the mapping stage
learns the new layout."""

from __future__ import annotations

from typing import Any

import orjson

from nats_otel.core.decode import RawTraceMessage, decode
from nats_otel.core.ids import TraceContext, identity
from nats_otel.core.mapping import _NOT_FAILURES, HEADER_ATTRIBUTE_PREFIX, MappingOptions, Placement, map_message
from nats_otel.core.records import AttrValue

__all__ = ["ROLES", "SLOT_NAMES", "LayoutChanged", "layouts"]

_NOTE = _NOT_FAILURES[0] + " (probe)"
_SUBJECT = "probe.subject"
_CONST = object()  # a constant: its value is taken from the probe as it is

# Every attribute the kernel's mapping stage (`_stage_map.pxi`) writes, per span role, in
# mapping.py's order: a name for the slot and the value the probes show there (`_CONST`: a
# constant, any value). The stage finds each slot it writes by its name here (`SLOT_NAMES`):
# an attribute added in mapping.py is one line here and one write there.
_SLOTS: dict[str, tuple[tuple[str, Any], ...]] = {
    "server": (("system", _CONST), ("operation.type", _CONST), ("operation.name", _CONST),
               ("destination", _SUBJECT), ("size", 4242), ("account", "probe-acc"), ("kind", "router"),
               ("cid", 777), ("name", "probe-in"), ("hops", 3), ("client.id", "776"), ("hop", "probe-hop"),
               ("only", True), ("adhoc", "probe.adhoc"), ("link", "ambiguous"), ("candidates", 2),
               ("unmapped", 1), ("note", _NOTE)),
    "egress": (("system", _CONST), ("operation.type", _CONST), ("operation.name", _CONST),
               ("destination", _SUBJECT), ("account", "probe-eg-acc"), ("kind", "gateway"), ("cid", 778),
               ("name", "probe-eg"), ("client.id", "779"), ("subscription", "probe.sub"), ("queue", "probe-queue"),
               ("hop", "probe-eg-hop"), ("peer", "probe-eg"), ("note", _NOTE)),
    "mapping": (("from", _SUBJECT), ("to", "probe.mapped")),
    "export": (("account", "probe-se-acc"), ("subject", "probe.se.to")),
    "import": (("account", "probe-si-acc"), ("from", "probe.si.from"), ("to", "probe.si.to")),
    "jetstream": (("system", _CONST), ("operation.type", _CONST), ("operation.name", _CONST),
                  ("destination", "probe.js.subject"), ("stream", "PROBE"), ("no_interest", True),
                  ("note", _NOTE)),
}
# The probes' spans: (role, name, slots absent there, values that differ from _SLOTS').
# Some attributes exclude each other (a client's id, a route's hop), hence two probes.
_Shape = tuple[str, str, set[str], dict[str, Any]]
_FORWARDED: _Shape = ("server", "receive probe.subject", {"client.id"}, {})
_PUBLISHED: _Shape = ("server", "receive probe.subject", {"hop"}, {"kind": "client", "cid": 776})
_EVENTS: list[_Shape] = [
    ("egress", "send probe.subject", {"client.id"}, {}),
    ("egress", "send probe.subject", {"hop", "peer"}, {"kind": "client", "cid": 779, "name": "probe-client"}),
    ("mapping", "map probe.mapped", set(), {}),
    ("export", "stream export probe-se-acc", set(), {}),
    ("import", "service import probe-si-acc", set(), {}),
    ("jetstream", "store PROBE", set(), {}),
]
#: The roles, in the order the kernel numbers them (`_stage_pairs.pxi`, for its mapping stage).
ROLES = tuple(_SLOTS)
#: Per role, the slots' names in order: the mapping stage finds where it writes by name.
SLOT_NAMES = {role: tuple(name for name, _ in slots) for role, slots in _SLOTS.items()}


class LayoutChanged(Exception):
    """mapping.py makes spans the kernel's mapping stage (`_stage_map.pxi`) does not know how to write."""


def _probe(ingress_kind: int, cid: int) -> list[Any]:
    def ts(n: int) -> str:
        return f"2026-11-22T02:16:30.{n:09d}Z"

    doc = {
        "server": {"name": "probe-server", "id": "PROBE-ID"},
        "request": {"msgsize": 4242, "header": {
            "traceparent": ["00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"],
            "Nats-Trace-Hop": ["probe-hop"], "Nats-Trace-Dest": ["probe.dest"], "Nats-Trace-Only": ["true"]}},
        "hops": 3,
        "events": [
            {"type": "in", "ts": ts(1), "kind": ingress_kind, "cid": cid, "name": "probe-in", "acc": "probe-acc",
             "subj": _SUBJECT, "error": _NOTE},
            {"type": "eg", "ts": ts(2), "kind": 2, "cid": 778, "name": "probe-eg", "hop": "probe-eg-hop",
             "acc": "probe-eg-acc", "sub": "probe.sub", "queue": "probe-queue", "error": _NOTE},
            {"type": "eg", "ts": ts(2), "kind": 0, "cid": 779, "name": "probe-client", "acc": "probe-eg-acc",
             "sub": "probe.sub", "queue": "probe-queue", "error": _NOTE},
            {"type": "sm", "ts": ts(3), "to": "probe.mapped"},
            {"type": "se", "ts": ts(4), "acc": "probe-se-acc", "to": "probe.se.to"},
            {"type": "si", "ts": ts(5), "acc": "probe-si-acc", "from": "probe.si.from", "to": "probe.si.to"},
            {"type": "js", "ts": ts(6), "stream": "PROBE", "subject": "probe.js.subject", "nointerest": True,
             "error": _NOTE},
            {"type": "probe-unknown", "ts": ts(7)},
        ],
    }
    msg = decode(RawTraceMessage("probe.trace", {}, orjson.dumps(doc)))
    ctx = TraceContext.of(b"\x01" * 16, b"\x02" * 8, "", True, "probe.adhoc")
    placement = Placement(identity(msg), b"\x03" * 16, b"\x02" * 8, "ambiguous", 2)
    return map_message(msg, ctx, placement, MappingOptions()).spans


def layouts() -> dict[str, list[tuple[str, AttrValue]]]:
    """Per span role, (attribute name, probe value) of each slot in mapping.py's order
    (copied message headers left out); `LayoutChanged` if the probes' spans are not what
    the kernel's mapping stage (`_stage_map.pxi`) writes."""
    forwarded, published = _probe(1, 777), _probe(0, 776)
    shapes = [_FORWARDED, *_EVENTS, _PUBLISHED, *_EVENTS]
    spans = forwarded + published
    if len(spans) != len(shapes):
        raise LayoutChanged(f"the probe messages gave {len(spans)} spans, not {len(shapes)}")
    keys: dict[tuple[str, str], tuple[str, AttrValue]] = {}
    for (role, name, absent, differ), span in zip(shapes, spans, strict=True):
        pairs = [pair for pair in span.attributes if not pair[0].startswith(HEADER_ATTRIBUTE_PREFIX)]
        slots = [(slot, differ.get(slot, want)) for slot, want in _SLOTS[role] if slot not in absent]
        if span.name != name or len(pairs) != len(slots):
            raise LayoutChanged(f"the {role} span's layout changed: {span.name!r}, {pairs!r}")
        for (slot, want), (key, value) in zip(slots, pairs, strict=True):
            if want is not _CONST and (value != want or type(value) is not type(want)):
                raise LayoutChanged(f"the {role} span's layout changed at {key!r}: {pairs!r}")
            if keys.setdefault((role, slot), (key, value))[0] != key:
                raise LayoutChanged(f"the {role} span names its {slot} two ways: {key!r}")
    return {role: [keys[role, slot] for slot, _ in slots] for role, slots in _SLOTS.items()}
