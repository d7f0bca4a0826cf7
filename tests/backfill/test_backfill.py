"""Backfill output equals `nats-otel convert`, byte for byte; bad records go to rejects."""

from __future__ import annotations

import json

import orjson
import pytest

from nats_otel.archive import read_archive
from nats_otel.core.decode import parse_archive_line
from nats_otel.core.encode import split_by_trace, to_otlp_json_line
from nats_otel.core.pipeline import Converted, convert_batch
from tests.backfill.conftest import CORPUS, GARBAGE_LINES, corpus_files, nats_otel_convert, read_parts

pytestmark = pytest.mark.spark


def test_otlp_json_is_byte_equal_to_nats_otel_convert(corpus_run, workdir):
    reference = nats_otel_convert(corpus_run["inputs"], workdir / "reference.jsonl")
    produced = read_parts(corpus_run["out"] / "otlp")
    assert len(reference.splitlines()) > 100
    # Part files are range-partitioned and sorted by trace id: concatenated, the same file.
    assert produced == reference
    assert len(list((corpus_run["out"] / "otlp").glob("part-*"))) >= 2


def test_reused_traceparent_scenario_links_like_convert(corpus_run):
    lines = [parse_archive_line(line) for line in (CORPUS / "22_traceparent_reused_3x.jsonl").read_bytes().splitlines()]
    expected = convert_batch(lines)
    trace_ids = {s.trace_id.hex() for r in expected if isinstance(r, Converted) for s in r.spans}
    by_trace = {}
    for line in read_parts(corpus_run["out"] / "otlp").splitlines():
        doc = orjson.loads(line)
        trace_id = doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["traceId"]
        by_trace[trace_id] = line + b"\n"
    spans = [s for r in expected if isinstance(r, Converted) for s in r.spans]
    assert len({s.span_id for s in spans}) == len(spans) == 12  # three messages, one traceparent
    assert sorted(r.link for r in expected if isinstance(r, Converted)) == ["", "", "", "matched", "matched", "matched"]
    for trace in split_by_trace(spans):
        assert by_trace[trace[0].trace_id.hex()] == to_otlp_json_line(trace)
    assert trace_ids <= set(by_trace)


def test_rejects_have_reasons_and_are_counted(corpus_run, workdir):
    from nats_otel.cli import main

    rows = [json.loads(line) for p in (corpus_run["out"] / "rejects").glob("part-*")
            for line in p.read_text().splitlines()]
    assert len(rows) == len(GARBAGE_LINES)
    reference = workdir / "reference-rejects.jsonl"
    assert main(["convert", *corpus_run["inputs"], "-o", str(workdir / "r.jsonl"), "--rejects", str(reference),
                 "--quiet"]) == 0
    expected = [json.loads(line)["reason"] for line in reference.read_text().splitlines()]
    assert sorted(r["reason"] for r in rows) == sorted(expected)
    assert {"bad_record", "bad_json", "bad_compression"} <= {r["reason"] for r in rows}
    assert all(r["detail"] and r["source"].endswith("garbage.jsonl") and r["record"] for r in rows)


def test_parquet_span_table_has_one_row_per_span_with_flat_columns(spark, corpus_run):
    table = spark.read.parquet(str(corpus_run["out"] / "spans"))
    results = convert_batch(read_archive(corpus_files()))
    spans = [s for r in results if isinstance(r, Converted) for s in r.spans]
    assert table.count() == len(spans)
    for column in ("trace_id", "span_id", "parent_span_id", "name", "kind", "start_ns", "end_ns", "status_code",
                   "status_message", "server_name", "cluster", "account", "subject", "hop", "attributes",
                   "resource_attributes"):
        assert column in table.columns
    assert dict(table.schema["attributes"].dataType.jsonValue()) == {
        "type": "map", "keyType": "string", "valueType": "string", "valueContainsNull": True
    }
    errors = table.filter("status_code = 2").count()
    assert errors == sum(1 for s in spans if s.status_code == 2) > 0
    hops = {r["hop"] for r in table.filter("role = 'server'").select("hop").distinct().collect()}
    assert {"", "1"} <= hops
