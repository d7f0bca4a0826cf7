"""One local SparkSession for the whole test session, and the corpus converted once."""

from __future__ import annotations

import glob
import gzip
import os
import shutil
import sys
from pathlib import Path

import orjson
import pytest

CORPUS = Path(__file__).resolve().parents[1] / "data" / "corpus"
# Batches of 100 messages under one traceparent, from real servers (tests/data/hop_batches/NOTES.md).
HOP_ARCHIVES = sorted((CORPUS.parent / "hop_batches").glob("*.jsonl.gz"))

# The report's picture needs Graphviz's `dot`, which the README's commands do not install:
# tests of the picture skip without it, saying how to get it.
needs_dot = pytest.mark.skipif(shutil.which("dot") is None,
                               reason="Graphviz's dot not found on PATH: apt-get install -y graphviz "
                                      "(.ci/run installs it)")

# Lines no archive reader can use, each for a different reason.
GARBAGE_LINES = [
    b"this is not json",
    b"[1, 2, 3]",
    b'{"subject": "trace.a", "headers": {}, "payload_b64": "!!!not-base64!!!"}',
    b'{"subject": "trace.a", "headers": {}, "payload_b64": "bm90IGpzb24="}',
    b'{"subject": "trace.a", "headers": {}, "payload_b64": "eyJzZXJ2ZXIiOiB7fX0="}',
    b'{"subject": "trace.a", "headers": {"Content-Encoding": ["gzip"]}, "payload_b64": "bm90IGd6aXA="}',
]


def corpus_files() -> list[str]:
    return sorted(glob.glob(str(CORPUS / "*.jsonl")))


def archive_lines(path: Path) -> list[str]:
    """The lines of an archive file (`.gz` or not)."""
    data = path.read_bytes()
    return (gzip.decompress(data) if path.suffix == ".gz" else data).decode().splitlines()


@pytest.fixture(scope="session")
def spark():
    pytest.importorskip("pyspark")
    from spark_backfill.session import build_session

    os.environ["PYSPARK_PYTHON"] = sys.executable
    session = build_session(
        "local[2]",
        app_name="nats-otel-tests",
        shuffle_partitions=2,
        extra_conf={"spark.ui.enabled": "false", "spark.default.parallelism": "2"},
    )
    yield session
    session.stop()


@pytest.fixture(scope="session")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("spark-backfill")


@pytest.fixture(scope="session")
def garbage_file(workdir) -> str:
    path = workdir / "garbage.jsonl"
    path.write_bytes(b"\n".join(GARBAGE_LINES) + b"\n")
    return str(path)


PRODUCER, CONSUMER = 4, 5  # OTLP span kinds: egress spans, server spans
HOP, LINK = "messaging.nats.trace.hop", "messaging.nats.trace.link"


def hop_spans(otlp: bytes) -> tuple[int, int]:
    """(downstream server spans, those under an upstream egress span) of OTLP/JSON lines;
    checks that exactly the unlinked ones say so (`messaging.nats.trace.link`)."""
    spans = [span for line in otlp.splitlines() for resource in orjson.loads(line)["resourceSpans"]
             for scope in resource["scopeSpans"] for span in scope["spans"]]
    keys = [{a["key"] for a in span["attributes"]} for span in spans]
    egresses = {span["spanId"] for span, k in zip(spans, keys, strict=True) if span["kind"] == PRODUCER and HOP in k}
    downstream = [(span, k) for span, k in zip(spans, keys, strict=True) if span["kind"] == CONSUMER and HOP in k]
    linked = [span for span, k in downstream if span.get("parentSpanId") in egresses]
    assert len(linked) == sum(LINK not in k for _, k in downstream)
    return len(downstream), len(linked)


def nats_otel_convert(inputs: list[str], out: Path) -> bytes:
    """What `nats-otel convert INPUT... -o OUT` writes (the reference output)."""
    from nats_otel.cli import main

    assert main(["convert", *inputs, "-o", str(out), "--quiet"]) == 0
    return out.read_bytes()


def read_parts(folder: Path) -> bytes:
    """The part files of a Spark text output, in order (range-partitioned by trace id)."""
    return b"".join(p.read_bytes() for p in sorted(folder.glob("part-*")))


@pytest.fixture(scope="session")
def corpus_run(spark, workdir, garbage_file):
    """The corpus plus garbage lines through `python -m spark_backfill convert`, all outputs."""
    from spark_backfill.__main__ import run

    out = workdir / "corpus"
    inputs = [*corpus_files(), garbage_file]
    status = run(
        spark,
        ["convert", "--input", *inputs, "--otlp-json-out", str(out / "otlp"), "--parquet-out", str(out / "spans"),
         "--rejects-out", str(out / "rejects"), "--otlp-json-partitions", "3"],
    )
    assert status == 0
    return {"inputs": inputs, "out": out}
