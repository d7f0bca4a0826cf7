"""`spark-submit` to a real Spark standalone cluster, the project shipped as a packed venv.

The recipe of docs/backfill.md, as a user runs it: master and worker JVMs through pyspark's
`spark-class`, a fresh virtualenv holding the project's wheel (not this tree), packed with
`venv-pack` and shipped with `--archives` (the way the PySpark docs recommend), executors
told to run `./environment/bin/python`. Nothing of this tree is on any process's path: an
executor without the packed venv could not import the project at all.
"""

from __future__ import annotations

import subprocess
import time

import pytest

from tests.backfill.conftest import GARBAGE_LINES, corpus_files, nats_otel_convert, read_parts
from tests.backfill.spark_servers import packed_venv, spark_env, spark_home, standalone_cluster

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.timeout(600)]


def test_spark_submit_to_a_standalone_cluster_with_a_packed_venv(tmp_path_factory):
    work = tmp_path_factory.mktemp("cluster")
    started = time.monotonic()
    venv, archive = packed_venv(work)
    python = venv / "bin" / "python"
    # The app as the docs find it: the installed package's __main__.py.
    where = "import spark_backfill, os; print(os.path.dirname(spark_backfill.__file__))"
    package = subprocess.run([str(python), "-c", where], capture_output=True, text=True, check=True,
                             env=spark_env(), cwd=work).stdout.strip()
    assert package.startswith(str(venv)), package
    garbage = work / "garbage.jsonl"
    garbage.write_bytes(b"\n".join(GARBAGE_LINES) + b"\n")
    inputs = [*corpus_files(), str(garbage)]
    out = work / "out"
    packed = time.monotonic()
    with standalone_cluster(work) as master:
        done = subprocess.run(
            [str(spark_home() / "bin" / "spark-submit"), "--master", master,
             "--archives", f"{archive}#environment",
             "--conf", "spark.pyspark.python=./environment/bin/python",
             "--conf", f"spark.pyspark.driver.python={python}",
             "--conf", "spark.executor.memory=1g", "--conf", "spark.ui.enabled=false",
             f"{package}/__main__.py", "convert", "--input", *inputs, "--otlp-json-out", str(out / "otlp"),
             "--rejects-out", str(out / "rejects"), "--shuffle-partitions", "4", "--target-file-bytes", "256K"],
            capture_output=True, text=True, env=spark_env(), cwd=work, timeout=420)
    print(f"pack {packed - started:.0f}s, cluster and job {time.monotonic() - packed:.0f}s")
    assert done.returncode == 0, done.stderr[-5000:]
    assert "spark://127.0.0.1" in done.stderr  # the session's master, as logged
    parts = sorted((out / "otlp").glob("part-*"))
    assert [p.name for p in parts] == [f"part-{i:05d}.jsonl" for i in range(len(parts))] and len(parts) >= 2
    assert read_parts(out / "otlp") == nats_otel_convert(inputs, work / "reference.jsonl")
    assert len((out / "rejects" / "part-00000.jsonl").read_text().splitlines()) == len(GARBAGE_LINES)
    # The executors ran the interpreter of the unpacked archive, in the worker's app folder.
    unpacked = list((work / "worker").glob("app-*/*/environment/bin/python"))
    assert unpacked, sorted(str(p) for p in (work / "worker").rglob("*"))[:50]
