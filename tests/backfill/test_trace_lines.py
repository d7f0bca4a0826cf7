"""OTLP/JSON straight from the records (`spark_backfill.traces`: what a run writing only
OTLP/JSON and rejects takes) equals `nats-otel convert` byte for byte: for any input order,
with ad-hoc traces (whose ids are known only once linked) among traceparent ones, a trace
longer than one request, and lines that give no spans."""

from __future__ import annotations

import base64
import random
from pathlib import Path

import orjson
import pytest

from nats_otel.core.encode import MAX_SPANS_PER_REQUEST
from tests.backfill.conftest import CORPUS, GARBAGE_LINES, HOP_ARCHIVES, archive_lines, nats_otel_convert, read_parts

pytestmark = pytest.mark.spark


def _long_trace(count: int) -> list[str]:
    """`count` reports of one traceparent, each its own message (its own server seq and time)."""
    line = (CORPUS / "22_traceparent_reused_3x.jsonl").read_bytes().splitlines()[0]
    record = orjson.loads(line)
    doc = orjson.loads(base64.b64decode(record["payload_b64"]))
    out = []
    for n in range(count):
        doc["server"]["seq"] = 10_000 + n
        doc["events"][0]["ts"] = f"2026-11-22T03:00:{n // 1000:02d}.{n % 1000:03d}000000Z"
        out.append(orjson.dumps({**record, "payload_b64": base64.b64encode(orjson.dumps(doc)).decode()}).decode())
    return out


@pytest.fixture(scope="module")
def shuffled(workdir) -> list[str]:
    """The corpus, the crowded-hop archives, a long trace and garbage, shuffled into 5 files."""
    lines = [line for path in sorted(CORPUS.glob("*.jsonl")) for line in archive_lines(path) if line.strip()]
    lines += [line for path in HOP_ARCHIVES for line in archive_lines(path)]
    lines += _long_trace(MAX_SPANS_PER_REQUEST // 2 + 100)  # two spans each: more than one request
    lines += [line.decode() for line in GARBAGE_LINES]
    random.Random(38).shuffle(lines)
    folder = workdir / "shuffled"
    folder.mkdir()
    for n in range(5):
        (folder / f"part-{n}.jsonl").write_text("".join(line + "\n" for line in lines[n::5]))
    return sorted(str(p) for p in folder.iterdir())


@pytest.mark.parametrize("files", [1, 4])
def test_lines_equal_convert_in_any_order(spark, workdir, shuffled, files):
    from spark_backfill.__main__ import run

    out = workdir / f"lines-{files}"
    assert run(spark, ["convert", "--input", *shuffled, "--otlp-json-out", str(out / "otlp"),
                       "--rejects-out", str(out / "rejects"), "--otlp-json-files", str(files)]) == 0
    reference = nats_otel_convert(shuffled, workdir / f"lines-reference-{files}.jsonl")
    produced = read_parts(out / "otlp")
    assert produced == reference
    docs = [orjson.loads(line) for line in reference.splitlines()]
    ids = [doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["traceId"] for doc in docs]
    assert len(ids) - len(set(ids)) >= 1, "no trace was long enough to need two requests"
    adhoc = {line.split('"traceId":"')[1][:32] for line in reference.decode().splitlines() if "adhoc" in line}
    assert adhoc, "no ad-hoc trace in the input"
    assert len(list((out / "otlp").glob("part-*"))) == files
    rejects = [orjson.loads(line) for p in (out / "rejects").glob("part-*") for line in p.read_bytes().splitlines()]
    assert len(rejects) == len(GARBAGE_LINES)
    assert {"bad_record", "bad_json", "bad_compression"} <= {r["reason"] for r in rejects}
    assert all(r["record"] and r["source"].endswith(".jsonl") for r in rejects)


def test_the_counts_come_back_from_the_tasks(spark, workdir, shuffled, caplog):
    """The accumulator's totals: every message converted, its spans, its issues."""
    import logging

    from nats_otel.archive import read_archive
    from nats_otel.core.pipeline import Converted, convert_batch
    from spark_backfill.__main__ import run

    expected = [r for r in convert_batch(read_archive(shuffled)) if isinstance(r, Converted)]
    with caplog.at_level(logging.INFO, logger="spark_backfill"):
        assert run(spark, ["convert", "--input", *shuffled, "--otlp-json-out", str(workdir / "counted")]) == 0
    spans = sum(len(r.spans) for r in expected)
    assert f"converted {len(expected)} trace messages to {spans} spans; {len(GARBAGE_LINES)} rejected" in caplog.text
    assert Path(workdir / "counted").is_dir()
