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
from tests.backfill.conftest import corpus_files, nats_otel_convert, read_parts
from tests.backfill.spark_servers import REPO, connect_server

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.timeout(400)]


@pytest.fixture(scope="module")
def remote(tmp_path_factory):
    with connect_server(tmp_path_factory.mktemp("connect")) as url:
        yield url


def _backfill(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "spark_backfill", *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=300)


def test_convert_and_report_through_spark_connect(remote, tmp_path):
    out = tmp_path / "out"
    done = _backfill("convert", "--remote", remote, "--input", str(corpus_files()[0].rsplit("/", 1)[0]),
                     "--otlp-json-out", str(out / "otlp"), "--parquet-out", str(out / "spans"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "spark connect" in done.stderr and "0 rejected" in done.stderr
    assert read_parts(out / "otlp") == nats_otel_convert(corpus_files(), tmp_path / "reference.jsonl")

    done = _backfill("report", "--remote", remote, "--spans", str(out / "spans"), "--out", str(out / "report"),
                     cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    with open(out / "report" / "edges.csv", newline="") as f:
        kinds = {row["kind"] for row in csv.DictReader(f)}
    assert kinds >= {"router", "gateway", "leaf"}
    assert (out / "report" / "network.png").exists()

    # The server's paths are checked by the server, still before the job writes anything.
    done = _backfill("convert", "--remote", remote, "--input", corpus_files()[0], "--otlp-json-out",
                     str(out / "otlp"), cwd=tmp_path)
    assert done.returncode == 2
    assert f"error: output {out / 'otlp'} exists; pass --overwrite to replace it" in done.stderr
    assert "Traceback" not in done.stderr and "converted" not in done.stderr


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
