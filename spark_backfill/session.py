"""The SparkSession: embedded local Spark by default, the cluster's under spark-submit."""

from __future__ import annotations

import logging
import os
import sys
import warnings
from typing import Any

__all__ = [
    "LOCAL_JAVA_OPTIONS",
    "QUIET_LOGGERS",
    "build_session",
    "default_parallelism",
    "is_remote",
    "local_cores",
    "local_defaults",
    "local_driver_memory",
    "under_spark_submit",
]

log = logging.getLogger("spark_backfill")

# py4j logs every gateway call at INFO; Spark itself is set to WARN once started.
QUIET_LOGGERS = ("py4j", "py4j.clientserver", "py4j.java_gateway")


def under_spark_submit() -> bool:
    """True when this Python driver was launched by spark-submit (the JVM came first)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


# Input split size. A 1 KB trace message becomes ~5 KB of rows (spans, OTLP/JSON, the
# Parquet columns), and a cached partition is read back whole: with Spark's 128 MB splits a
# 65 MB archive file was one partition and the local JVM ran out of heap. Small splits keep
# the memory a task needs the same however large the input grows.
LOCAL_MAX_PARTITION_BYTES = "8m"


def local_driver_memory(total_bytes: int | None = None) -> str:
    """Heap for the embedded (local mode) JVM: half the machine's memory, 1-8 GiB.

    In local mode the driver JVM is also the executor: Spark's 1 GiB default ran out of heap
    at 250k trace messages (bench/backfill_throughput.py, docs/backfill.md).
    """
    if total_bytes is None:
        try:
            total_bytes = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            total_bytes = 2 << 30
    gib = max(1, min(8, total_bytes // 2 // (1 << 30)))
    return f"{gib}g"


# The embedded JVM compiles with C1 only. A local run lives seconds to minutes, and the
# optimising compiler (C2) spent more CPU compiling Spark than its faster code saved: 200k
# trace messages at local[1], JVM 25 CPU-s with C1 only against 38-40 with both, the whole
# run faster (docs/backfill.md, "Where the time goes"). A cluster's long-lived executors
# are another matter: spark-submit runs never get it.
LOCAL_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1"


def local_cores(master: str) -> int:
    """The cores of a `local` (one), `local[N]`, `local[N,F]` or `local[*]` master."""
    if "[" not in master:
        return 1
    inside = master.partition("[")[2].partition("]")[0].split(",")[0].strip()
    return (os.cpu_count() or 1) if inside == "*" else max(1, int(inside))


def local_defaults(cores: int = 1) -> dict[str, str]:
    """Settings for an embedded local Spark of `cores` cores (`--conf` and
    `--shuffle-partitions` override them; spark-submit never sees them).

    Shuffle partitions: 4 per core, not Spark's 200. Adaptive execution merges small reduce
    partitions, but every map task still writes one file per partition: 200 for the 2 MB
    shuffle of a run's ad-hoc contexts cost more than moving them (JVM CPU 22.0 -> 20.6 s
    at 200k trace messages, local[1], docs/backfill.md)."""
    return {
        "spark.driver.memory": local_driver_memory(),
        "spark.sql.files.maxPartitionBytes": LOCAL_MAX_PARTITION_BYTES,
        "spark.driver.extraJavaOptions": LOCAL_JAVA_OPTIONS,
        "spark.sql.shuffle.partitions": str(4 * cores),
    }


def is_remote(spark) -> bool:  # spark: a classic or a Spark Connect SparkSession
    """True for a Spark Connect session (no SparkContext, no JVM in this process)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def default_parallelism(spark) -> int:
    """The cluster's default parallelism (its cores), for a classic or a Connect session."""
    if not is_remote(spark):
        return int(spark.sparkContext.defaultParallelism)
    from pyspark.sql import functions as F

    # Connect has no SparkContext to ask: Spark splits a range without a partition count
    # into that many partitions.
    return int(spark.range(0, 1 << 16).select(F.spark_partition_id()).distinct().count())


def _quiet() -> None:
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    # pyspark 4.3 warns on every pandas UDF that pandas 3 is "not fully supported"; the
    # features we use are covered by the tests.
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"pyspark\..*")


def _remote_session(remote: str, app_name: str, conf: dict[str, str]):
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.remote(remote).appName(app_name)
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    log.info("spark connect %s at %s", spark.version, remote)
    return spark


def build_session(
    master: str | None = None,
    app_name: str = "nats-otel-backfill",
    shuffle_partitions: int | None = None,
    extra_conf: dict[str, str] | None = None,
    remote: str | None = None,
    archive: Any = None,
):  # -> pyspark.sql.SparkSession (import kept lazy: `report --help` needs no JVM)
    """A SparkSession whose Python workers run this very interpreter.

    Executors start `python3` from PATH unless told otherwise (DESIGN §9), so a job started
    as `<venv>/bin/python -m spark_backfill` without an activated venv would fail in the
    workers: point them at `sys.executable`. Under spark-submit the cluster's settings win.
    With `remote` (`sc://HOST:PORT`), a Spark Connect session: the server's settings and
    Python workers are its own, only runtime settings (`extra_conf`) are passed.
    `archive`: a `jvm_archive.Archive` for an embedded JVM's start (unless `extra_conf`
    gives the JVM options itself).
    """
    _quiet()
    from pyspark.sql import SparkSession

    if remote:
        runtime = dict(extra_conf or {})
        if shuffle_partitions:
            runtime["spark.sql.shuffle.partitions"] = str(shuffle_partitions)
        return _remote_session(remote, app_name, runtime)
    if (master or "local").startswith("local"):
        # Local runs bind to loopback: no "hostname resolves to a loopback address" noise.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name)
    if master is None and not under_spark_submit():
        master = "local[*]"
    if master is not None:
        builder = builder.master(master)
        builder = builder.config("spark.pyspark.python", os.environ["PYSPARK_PYTHON"])
        builder = builder.config("spark.pyspark.driver.python", sys.executable)
    conf = {
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.adaptive.enabled": "true",
        # Spark's own progress bar fights with our log lines; counts are logged instead.
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.debug.maxToStringFields": "200",
    }
    if (master or "").startswith("local") and not under_spark_submit():
        conf.update(local_defaults(local_cores(master or "local[*]")))
        if archive is not None and "spark.driver.extraJavaOptions" not in (extra_conf or {}):
            conf["spark.driver.extraJavaOptions"] = f"{LOCAL_JAVA_OPTIONS} {archive.java_options()}".strip()
    if shuffle_partitions:
        conf["spark.sql.shuffle.partitions"] = str(shuffle_partitions)
    conf.update(extra_conf or {})
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    log.info("spark %s master=%s ui=%s", spark.version, spark.sparkContext.master, spark.sparkContext.uiWebUrl)
    return spark
