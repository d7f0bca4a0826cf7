"""`nats-otel demo` end to end as a user runs it (a subprocess), judged only by its OTLP/JSON
file; and `examples/traced_app.py` alone against a real server."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import nats
import pytest
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from nats_otel.devkit.processes import start_topology
from nats_otel.devkit.receivers import OTLPGrpcReceiver
from nats_otel.devkit.topology import single_server

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

ROOT = Path(__file__).resolve().parents[2]
APP_SCOPE = "nats-otel.examples.traced_app"
NATS_SCOPE = "nats-otel"
PRODUCER, CONSUMER = 4, 5


def _value(v: dict) -> object:
    (kind, value), = v.items()
    return int(value) if kind == "intValue" else value


def _attrs(kvs: list[dict]) -> dict:
    return {kv["key"]: _value(kv["value"]) for kv in kvs or []}


def read_spans(path: Path) -> list[dict]:
    """Every span of the file, flattened with its resource and scope. Each line must also
    parse as an ExportTraceServiceRequest with the official parser (hex ids -> bytes)."""
    spans = []
    for line in path.read_text().splitlines():
        doc = json.loads(line)
        for rs in doc["resourceSpans"]:
            resource = _attrs(rs["resource"]["attributes"])
            for ss in rs["scopeSpans"]:
                for span in ss["spans"]:
                    assert re.fullmatch(r"[0-9a-f]{32}", span["traceId"]), span["traceId"]
                    assert re.fullmatch(r"[0-9a-f]{16}", span["spanId"]), span["spanId"]
                    spans.append({**span, "resource": resource, "scope": ss["scope"]["name"],
                                  "attrs": _attrs(span.get("attributes", []))})
        _parse_otlp_json(doc)
    return spans


def _parse_otlp_json(doc: dict) -> ExportTraceServiceRequest:
    for rs in doc["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for span in ss["spans"]:
                for key in ("traceId", "spanId", "parentSpanId"):
                    if span.get(key):
                        span[key] = base64.b64encode(bytes.fromhex(span[key])).decode()
    return json_format.ParseDict(doc, ExportTraceServiceRequest())


def _alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "State:\tZ" not in status


def _processes_mentioning(text: str) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if text.encode() in (entry / "cmdline").read_bytes():
                    out.append(int(entry.name))
            except OSError:
                continue
    return out


def test_demo_writes_complete_traces_and_leaves_nothing_running(tmp_path: Path) -> None:
    output, workdir = tmp_path / "out" / "demo.otlp.jsonl", tmp_path / "servers"
    proc = subprocess.run(
        [sys.executable, "-m", "nats_otel.cli", "demo", "--messages", "3", "--output", str(output),
         "--workdir", str(workdir), "--color", "never"],
        capture_output=True, text=True, timeout=90, cwd=tmp_path,
        env={**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"},  # must be ignored
    )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert "every trace complete" in proc.stdout

    # Nothing it started outlives it.
    pids = [int(p) for p in re.search(r"nats-server pids \[([\d, ]+)\]", proc.stdout).group(1).split(",")]
    assert len(pids) == 4
    assert [p for p in pids if _alive(p)] == []
    assert _processes_mentioning(str(workdir)) == []

    spans = read_spans(output)
    by_trace: dict[str, list[dict]] = defaultdict(list)
    for span in spans:
        by_trace[span["traceId"]].append(span)
    assert len(by_trace) == 3, "one trace per message, nothing else"

    for trace_id, trace in by_trace.items():
        app = [s for s in trace if s["scope"] == APP_SCOPE]
        nats_spans = [s for s in trace if s["scope"] == NATS_SCOPE]
        assert len(app) + len(nats_spans) == len(trace)

        producers = [s for s in app if s["kind"] == PRODUCER]
        assert len(producers) == 1, trace_id
        producer = producers[0]
        assert producer["name"] == "send demo.orders"
        assert producer["resource"]["service.name"] == "demo-producer"
        assert not producer.get("parentSpanId")

        # The producer's context reached the consumers through the NATS headers.
        consumers = [s for s in app if s["kind"] == CONSUMER]
        assert sorted(s["resource"]["service.instance.id"] for s in consumers) == [
            "consumer@east-3", "consumer@leaf-1"]
        for c in consumers:
            assert c["parentSpanId"] == producer["spanId"]
            assert c["name"] == "process demo.orders"

        # ... and the servers: the origin server span is the producer span's child.
        servers = {s["resource"]["messaging.nats.server.name"]: s for s in nats_spans if s["kind"] == CONSUMER}
        assert sorted(servers) == ["east-1", "east-2", "east-3", "leaf-1"]
        origin = servers["east-2"]
        assert origin["parentSpanId"] == producer["spanId"]
        assert "messaging.nats.trace.hop" not in origin["attrs"]
        assert origin["attrs"]["messaging.destination.name"] == "demo.orders"

        # Each downstream server span hangs under the upstream egress with its hop id.
        egress_by_hop = {s["attrs"]["messaging.nats.trace.hop"]: s for s in nats_spans
                         if s["kind"] == PRODUCER and "messaging.nats.trace.hop" in s["attrs"]}
        # east-2 numbers its two route egresses 1 and 2 in the order it serves them (either
        # server may be first); east-1 then forwards to leaf-1 one level down.
        east1_hop = servers["east-1"]["attrs"]["messaging.nats.trace.hop"]
        assert east1_hop in ("1", "2")
        assert sorted(egress_by_hop) == sorted(["1", "2", f"{east1_hop}.1"])
        span_by_id = {s["spanId"]: s for s in nats_spans}
        expected_upstream = {"east-3": "east-2", "east-1": "east-2", "leaf-1": "east-1"}
        for name, upstream in expected_upstream.items():
            server = servers[name]
            hop = server["attrs"]["messaging.nats.trace.hop"]
            egress = egress_by_hop[hop]
            assert server["parentSpanId"] == egress["spanId"], (name, hop)
            assert span_by_id[egress["parentSpanId"]] is servers[upstream]
        assert servers["leaf-1"]["attrs"]["messaging.nats.trace.hop"] == f"{east1_hop}.1"

        # Deliveries to the two consumer connections are egress spans too.
        delivered = sorted(s["attrs"].get("messaging.nats.connection.name") for s in nats_spans
                           if s["kind"] == PRODUCER and "messaging.nats.trace.hop" not in s["attrs"])
        assert delivered == ["demo-consumer@east-3", "demo-consumer@leaf-1"]
        assert all(s.get("status", {}).get("code", 0) != 2 for s in trace)


async def test_example_app_alone_propagates_through_nats(tmp_path: Path) -> None:
    """The example as a user runs it: its producer span is the parent the server reports."""
    with start_topology(single_server(), tmp_path / "srv") as topo, OTLPGrpcReceiver() as receiver:
        url = topo.client_url("n1", "a")
        watcher = await nats.connect(url)
        trace_msgs = await watcher.subscribe("trace.a")
        await watcher.flush()
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, str(ROOT / "examples" / "traced_app.py"), "--nats-url", url,
                "--subject", "example.orders", "--messages", "2", "--otlp-endpoint", receiver.endpoint,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
            out, err = await asyncio.wait_for(proc.communicate(), 60)
            assert proc.returncode == 0, (out, err)
            events = [json.loads((await trace_msgs.next_msg(timeout=5)).data) for _ in range(2)]
        finally:
            await watcher.close()
        spans = receiver.wait_for_spans(4, timeout=10)
    producers = {s.span_id.hex(): s for _, s in spans if s.kind == PRODUCER}
    consumers = [s for _, s in spans if s.kind == CONSUMER]
    assert len(producers) == 2 and len(consumers) == 2
    assert {c.parent_span_id.hex() for c in consumers} == set(producers)
    for event in events:
        headers = {k.lower(): v for k, v in event["request"]["header"].items()}
        _, trace_id, parent, flags = headers["traceparent"][0].split("-")
        assert parent in producers and producers[parent].trace_id.hex() == trace_id
        assert int(flags, 16) & 1  # sampled (the SDK also sets bit 1, "random trace id")
