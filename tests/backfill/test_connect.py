"""The backfill through Spark Connect (`--remote sc://HOST:PORT`), against pyspark's own
Connect server: DataFrame APIs only, archives and a JetStream stream, as a user runs it."""

from __future__ import annotations

import asyncio
import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nats_otel.core.decode import parse_archive_line
from tests.backfill.conftest import HOP_ARCHIVES, corpus_files, hop_spans, nats_otel_convert, needs_dot, read_parts
from tests.backfill.spark_servers import REPO, connect_server

# One worker for the module: its Connect server (a JVM) is started once, beside the session's.
pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.timeout(400), pytest.mark.xdist_group("connect")]


@pytest.fixture(scope="module")
def remote(tmp_path_factory):
    with connect_server(tmp_path_factory.mktemp("connect")) as url:
        yield url


def _backfill(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "spark_backfill", *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=300)


@pytest.fixture(scope="module")
def converted(remote, tmp_path_factory) -> tuple[Path, str]:
    """The corpus converted through the Connect server: (its outputs' folder, stderr)."""
    folder = tmp_path_factory.mktemp("connect-convert")
    out = folder / "out"
    done = _backfill("convert", "--remote", remote, "--input", str(corpus_files()[0].rsplit("/", 1)[0]),
                     "--otlp-json-out", str(out / "otlp"), "--parquet-out", str(out / "spans"), cwd=folder)
    assert done.returncode == 0, done.stderr[-3000:]
    return out, done.stderr


def test_convert_through_spark_connect(remote, converted, tmp_path):
    out, stderr = converted
    assert "spark connect" in stderr and "0 rejected" in stderr
    assert read_parts(out / "otlp") == nats_otel_convert(corpus_files(), tmp_path / "reference.jsonl")

    # The server's paths are checked by the server, still before the job writes anything.
    done = _backfill("convert", "--remote", remote, "--input", corpus_files()[0], "--otlp-json-out",
                     str(out / "otlp"), cwd=tmp_path)
    assert done.returncode == 2
    assert f"error: output {out / 'otlp'} exists; pass --overwrite to replace it" in done.stderr
    assert "Traceback" not in done.stderr and "converted" not in done.stderr


def test_crowded_hops_through_spark_connect(remote, tmp_path):
    """The report runs' pass (window functions, a collect, the runs shipped with the UDF)
    on a Connect server: crowded hops linked as `convert` links them."""
    archive = next(str(path) for path in HOP_ARCHIVES if path.name.startswith("batches_2ms"))
    done = _backfill("convert", "--remote", remote, "--input", archive, "--otlp-json-out", str(tmp_path / "otlp"),
                     cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    produced = read_parts(tmp_path / "otlp")
    assert produced == nats_otel_convert([archive], tmp_path / "reference.jsonl")
    assert hop_spans(produced)[1] >= 750


def _edge_kinds(report: Path) -> set[str]:
    with open(report / "edges.csv", newline="") as f:
        return {row["kind"] for row in csv.DictReader(f)}


def test_report_through_spark_connect(remote, converted, tmp_path):
    """The tables (`--no-picture`: no Graphviz needed); the picture is the next test's."""
    out, _ = converted
    done = _backfill("report", "--remote", remote, "--spans", str(out / "spans"), "--out", str(tmp_path / "report"),
                     "--no-picture", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert _edge_kinds(tmp_path / "report") >= {"router", "gateway", "leaf"}
    assert sorted(p.name for p in (tmp_path / "report").iterdir()) == ["edges.csv", "errors.csv", "report.md"]


@needs_dot
def test_report_picture_through_spark_connect(remote, converted, tmp_path):
    out, _ = converted
    done = _backfill("report", "--remote", remote, "--spans", str(out / "spans"), "--out", str(tmp_path / "report"),
                     cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert _edge_kinds(tmp_path / "report") >= {"router", "gateway", "leaf"}
    assert (tmp_path / "report" / "network.png").exists()


STREAM = "TRACES"


async def _fill(url: str, raws) -> None:
    import nats

    nc = await nats.connect(url)
    js = nc.jetstream()
    await js.add_stream(name=STREAM, subjects=["trace.>", "adhoc.trace.>"])
    for raw in raws:
        await js.publish(raw.subject, raw.payload, headers={k: v[0] for k, v in raw.headers.items()} or None)
    await nc.close()


def test_jetstream_through_spark_connect(remote, tmp_path):
    from nats_otel.devkit.processes import start_topology
    from nats_otel.devkit.topology import single_server

    files = corpus_files()
    raws = [parse_archive_line(line) for f in files for line in Path(f).read_bytes().splitlines() if line.strip()]
    with start_topology(single_server(jetstream=True)) as topo:
        url = topo.client_url("n1", user="a")
        asyncio.run(_fill(url, raws))
        done = _backfill("convert", "--remote", remote, "--jetstream-url", url, "--stream", STREAM,
                         "--jetstream-ranges", "3", "--otlp-json-out", str(tmp_path / "otlp"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "3 ranges" in done.stderr
    assert read_parts(tmp_path / "otlp") == nats_otel_convert(files, tmp_path / "reference.jsonl")
