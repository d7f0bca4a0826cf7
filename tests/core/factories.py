"""Small builders of trace-message JSON for table and property tests."""

from __future__ import annotations

import orjson

from nats_otel.core.decode import RawTraceMessage

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"


def ts(ns_offset: int, base: str = "2026-11-22T02:16:30") -> str:
    return f"{base}.{ns_offset:09d}Z"


def message(
    *events: dict,
    server: str = "s1",
    server_id: str | None = None,
    headers: dict | None = None,
    hops: int | None = None,
    cluster: str = "c1",
) -> dict:
    doc = {
        "server": {"name": server, "id": server_id or f"ID-{server}", "cluster": cluster, "ver": "2.15.1",
                   "host": "127.0.0.1"},
        "request": {"header": headers if headers is not None else {"traceparent": [TRACEPARENT]}, "msgsize": 100},
        "events": list(events),
    }
    if hops:
        doc["hops"] = hops
    return doc


def ingress(t: int = 100, kind: int = 0, name: str = "pub", subj: str = "orders.new", acc: str = "A", **extra) -> dict:
    return {"type": "in", "ts": ts(t), "kind": kind, "cid": 5, "name": name, "acc": acc, "subj": subj, **extra}


def egress(t: int = 200, kind: int = 0, name: str = "sub", **extra) -> dict:
    event = {"type": "eg", "ts": ts(t), "kind": kind, "cid": 7, "name": name, **extra}
    if kind == 0 and "sub" not in event:
        event["sub"] = "orders.>"
    return event


def raw(doc: dict | bytes, subject: str = "trace.a", headers: dict | None = None) -> RawTraceMessage:
    payload = doc if isinstance(doc, bytes) else orjson.dumps(doc)
    return RawTraceMessage(subject=subject, headers=headers or {}, payload=payload)
