"""The report's edges, errors and picture; completeness marking; OTLP export from executors."""

from __future__ import annotations

import csv
import threading
import xml.etree.ElementTree as ET
from collections import Counter
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import ClassVar

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from nats_otel.archive import read_archive
from nats_otel.core.pipeline import Converted, convert_batch
from nats_otel.core.records import SpanKind
from spark_backfill.network import edge_id
from tests.backfill.conftest import CORPUS, corpus_files, needs_dot

pytestmark = pytest.mark.spark


def _expected_edges() -> Counter:
    """Edges counted from `convert_batch` spans, without Spark: egress -> its child server span."""
    spans = [s for r in convert_batch(read_archive(corpus_files())) if isinstance(r, Converted) for s in r.spans]
    by_id = {(s.trace_id, s.span_id): s for s in spans}
    edges = Counter()
    for s in spans:
        parent = by_id.get((s.trace_id, s.parent_span_id))
        if s.kind == SpanKind.CONSUMER and parent is not None and parent.attribute("messaging.nats.trace.hop"):
            edges[(parent.resource.get("messaging.nats.server.name"), s.resource.get("messaging.nats.server.name"),
                   parent.attribute("messaging.nats.connection.kind"))] += 1
    return edges


def test_report_edges_and_errors(spark, corpus_run, workdir):
    """The tables: no Graphviz needed (`--no-picture`); the picture is the next test's."""
    from spark_backfill.__main__ import run

    out = workdir / "report-tables"
    assert run(spark, ["report", "--spans", str(corpus_run["out"] / "spans"), "--out", str(out),
                       "--no-picture"]) == 0
    with open(out / "edges.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    got = Counter({(r["source"], r["target"], r["kind"]): int(r["count"]) for r in rows})
    expected = _expected_edges()
    assert got == expected
    assert {k for _, _, k in expected} >= {"router", "gateway", "leaf"}
    assert all(float(r["p50_ms"]) <= float(r["p99_ms"]) <= float(r["max_ms"]) for r in rows)
    with open(out / "errors.csv", newline="") as f:
        errors = list(csv.DictReader(f))
    assert errors and all(int(e["count"]) > 0 and e["account"] for e in errors)
    text = (out / "report.md").read_text()
    assert "| source | target | kind |" in text and "network.svg" not in text
    assert sorted(p.name for p in out.iterdir()) == ["edges.csv", "errors.csv", "report.md"]


@needs_dot
def test_report_draws_every_edge(spark, corpus_run, workdir):
    from spark_backfill.__main__ import run

    out = workdir / "report"
    assert run(spark, ["report", "--spans", str(corpus_run["out"] / "spans"), "--out", str(out)]) == 0
    expected = _expected_edges()
    # Every edge drawn once, as its own SVG element, labelled with its kind and count.
    svg = ET.parse(out / "network.svg").getroot()
    drawn = {g.get("id"): "".join(t.text or "" for t in g.iter("{http://www.w3.org/2000/svg}text"))
             for g in svg.iter("{http://www.w3.org/2000/svg}g") if g.get("class") == "edge"}
    assert set(drawn) == {edge_id(*key) for key in expected}
    for (source, target, kind), count in expected.items():
        assert f"{kind} n={count}" in drawn[edge_id(source, target, kind)]
    assert (out / "network.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = (out / "report.md").read_text()
    assert "| source | target | kind |" in text and "](network.svg)" in text
    assert sorted(p.name for p in out.iterdir()) == ["edges.csv", "errors.csv", "network.dot", "network.png",
                                                     "network.svg", "report.md"]


def test_missing_downstream_hop_is_marked_with_a_placeholder(spark, workdir):
    from spark_backfill.__main__ import run

    lines = (CORPUS / "02_route_hop.jsonl").read_bytes().splitlines()
    whole, cut = workdir / "whole.jsonl", workdir / "cut.jsonl"
    whole.write_bytes(b"\n".join(lines) + b"\n")
    results = convert_batch(read_archive([str(whole)]))
    downstream = [i for i, r in enumerate(results) if r.spans[0].attribute("messaging.nats.trace.hop")]
    assert downstream
    cut.write_bytes(b"\n".join(line for i, line in enumerate(lines) if i != downstream[0]) + b"\n")
    # The egress whose downstream message is gone: its id is the dropped server span's parent.
    lost_parent = results[downstream[0]].spans[0].parent_span_id.hex()
    for name, path in (("whole", whole), ("cut", cut)):
        assert run(spark, ["convert", "--input", str(path), "--parquet-out", str(workdir / f"pq-{name}"),
                           "--mark-incomplete", "--placeholders"]) == 0
    complete = spark.read.parquet(str(workdir / "pq-whole"))
    assert complete.filter("trace_incomplete").count() == 0
    assert complete.filter("role = 'placeholder'").count() == 0
    table = spark.read.parquet(str(workdir / "pq-cut"))
    marked = table.filter("attributes['messaging.nats.trace.downstream_missing'] = 'true'").collect()
    assert [r["span_id"] for r in marked] == [lost_parent]
    holders = table.filter("role = 'placeholder'").collect()
    assert [r["parent_span_id"] for r in holders] == [lost_parent]
    trace = holders[0]["trace_id"]
    assert table.filter(f"trace_id = '{trace}' and not trace_incomplete").count() == 0


class _Collector(BaseHTTPRequestHandler):
    requests: ClassVar[list] = []
    failures_left = 1

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if type(self).failures_left > 0:  # one transient failure: the exporter must retry
            type(self).failures_left -= 1
            self.send_response(503)
            self.end_headers()
            return
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        type(self).requests.append(request)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()
        self.wfile.write(b"")

    def log_message(self, *args):
        pass


def test_otlp_export_from_executors_retries_and_delivers_every_span(spark, workdir):
    from spark_backfill.__main__ import run

    server = HTTPServer(("127.0.0.1", 0), _Collector)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        files = corpus_files()[:6]
        status = run(spark, ["convert", "--input", *files, "--otlp-endpoint", f"http://127.0.0.1:{server.server_port}",
                             "--otlp-batch", "50"])
    finally:
        server.shutdown()
        server.server_close()
    assert status == 0
    got = Counter(s.span_id.hex() for req in _Collector.requests for rs in req.resource_spans
                  for ss in rs.scope_spans for s in ss.spans)
    expected = Counter(s.span_id.hex() for r in convert_batch(read_archive(files)) if isinstance(r, Converted)
                       for s in r.spans)
    assert got == expected
    assert _Collector.failures_left == 0
    assert all(sum(len(ss.spans) for rs in r.resource_spans for ss in rs.scope_spans) <= 50
               for r in _Collector.requests)
