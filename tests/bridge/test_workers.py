"""Sharding of the worker processes: every message of one trace goes to one worker."""

from __future__ import annotations

import gzip
import json

import cramjam
import pytest

from nats_otel.bridge.sharding import shard_key, shard_of
from nats_otel.core.decode import RawTraceMessage

TID = "4bf92f3577b34da6a3ce929d0e0e4736"


def payload(header: dict) -> bytes:
    return json.dumps({"server": {"name": "s", "id": "X"}, "request": {"header": header, "msgsize": 1},
                       "events": []}, separators=(",", ":")).encode()


@pytest.mark.parametrize(("header", "encoding", "subject", "want"), [
    ({"traceparent": [f"00-{TID}-00f067aa0ba902b7-01"]}, None, "trace.a", bytes.fromhex(TID)),
    ({"TraceParent": [f"00-{TID.upper()}-00f067aa0ba902b7-01"]}, None, "trace.a", bytes.fromhex(TID)),
    ({"traceparent": [f"00-{TID}-00f067aa0ba902b7-01"]}, "gzip", "trace.a", bytes.fromhex(TID)),
    ({"traceparent": [f"00-{TID}-00f067aa0ba902b7-01"]}, "snappy", "trace.a", bytes.fromhex(TID)),
    ({"Nats-Trace-Dest": ["adhoc.x"]}, None, "adhoc.x", b"adhoc.x"),          # ad-hoc: by subject
    ({"traceparent": ["not-a-traceparent"]}, None, "trace.b", b"trace.b"),   # unusable: by subject
    ({"traceparent": [f"00-{'0' * 32}-00f067aa0ba902b7-01"]}, None, "t", b"t"),  # all-zero id
])
def test_shard_key(header: dict, encoding: str | None, subject: str, want: bytes) -> None:
    body = payload(header)
    headers = {}
    if encoding == "gzip":
        body, headers = gzip.compress(body), {"Content-Encoding": ["gzip"]}
    elif encoding == "snappy":
        body, headers = bytes(cramjam.snappy.compress(body)), {"Content-Encoding": ["snappy"]}
    assert shard_key(RawTraceMessage(subject, headers, body)) == want


def test_undecompressable_falls_back_to_subject() -> None:
    raw = RawTraceMessage("trace.z", {"Content-Encoding": ["gzip"]}, b"not gzip")
    assert shard_key(raw) == b"trace.z"


def test_same_trace_same_worker_and_spread() -> None:
    same = [RawTraceMessage(f"trace.{i}", {}, payload({"traceparent": [f"00-{TID}-{i:016x}-01"]}))
            for i in range(1, 20)]
    assert len({shard_of(r, 4) for r in same}) == 1
    many = [RawTraceMessage("t", {}, payload({"traceparent": [f"00-{i:032x}-00f067aa0ba902b7-01"]}))
            for i in range(1, 200)]
    counts = [sum(1 for r in many if shard_of(r, 2) == w) for w in range(2)]
    assert min(counts) > 60, counts


def test_other_bridges_evidence_reaches_the_worker_of_its_trace(corpus_raws) -> None:
    """With the link exchange and worker processes, a report another bridge observed must
    be recorded by the worker that maps its trace (`evidence_shard` agrees with `shard_of`);
    ad-hoc evidence (sharded by a subject it does not carry) goes to every worker."""
    from nats_otel.bridge.sharding import evidence_shard
    from nats_otel.core.decode import DecodeError
    from nats_otel.core.evidence import evidence_of
    from nats_otel.core.pipeline import prepare

    checked = adhoc = 0
    for raw in corpus_raws:
        try:
            report = evidence_of(prepare(raw))
        except DecodeError:
            continue
        for workers in (2, 3, 7):
            want = None if report.adhoc else shard_of(raw, workers)
            assert evidence_shard(report, workers) == want, (raw.subject, workers)
        checked += 1
        adhoc += report.adhoc
    assert checked > 50 and 0 < adhoc < checked, (checked, adhoc)
