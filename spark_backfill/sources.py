"""Extract: every source becomes what the key pass reads (`keys.key_lines`).

Archive records are parsed in the executors by `parse_archive_line`, the same as
`nats-otel convert`:

- archive JSON Lines: local files and folders (expanded like `convert` does, globs too),
  read by the key pass's tasks themselves in byte ranges (`splits`, `keys.LocalArchive`);
  any Hadoop-compatible URI (`s3a://`, `hdfs://`, `.gz` decompressed by Spark) and any
  input of a Spark Connect session as a DataFrame of archive lines (`value`, `source`);
- Parquet files of archive records (`subject`, `headers`, `payload_b64` or binary `payload`,
  optional `received_at`), turned back into archive lines by Spark;
- a JetStream stream, read in parallel by sequence ranges by the `nats-jetstream` data
  source (`jetstream`), as messages (`subject`, `headers`, `data`), not archive lines.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from nats_otel.archive import archive_record
from nats_otel.core.decode import RawTraceMessage
from spark_backfill import splits
from spark_backfill.checks import UsageError, is_local, local_inputs
from spark_backfill.jetstream import JetStreamRange, JetStreamSource, read_messages
from spark_backfill.keys import LocalArchive

__all__ = [
    "read_archive",
    "read_inputs",
    "read_jetstream",
    "read_parquet",
    "read_range",
]

log = logging.getLogger("spark_backfill")

# The names `nats_otel.archive.expand_inputs` takes from a folder, as a Hadoop glob.
ARCHIVE_GLOB = "*.{jsonl,ndjson,jsonl.gz,ndjson.gz}"

# --- archive files -----------------------------------------------------------------------


def _is_parquet(path: str) -> bool:
    if path.endswith(".parquet"):
        return True
    local = Path(path.removeprefix("file://"))
    return is_local(path) and local.is_dir() and any(local.rglob("*.parquet"))


def read_archive(spark: Any, paths: Sequence[str]) -> list[Any]:
    """Archive JSON Lines (DESIGN §5): local files as a `keys.LocalArchive` (the key pass
    reads them itself, as `convert` does: `splits`), remote URIs (and all of a Spark
    Connect session's) as a DataFrame of lines (`value`, `source`), blank lines dropped
    like `convert`."""
    from spark_backfill.session import is_remote

    if is_remote(spark):
        # A Connect server reads its own file system: it expands folders (to their archive
        # files, like `convert`) and globs.
        return [_nonblank(spark.read.options(recursiveFileLookup="true", pathGlobFilter=ARCHIVE_GLOB)
                          .text(list(paths)))]
    found = local_inputs(paths)  # local files as resolved paths, remote URIs as given
    local = [path for path in found if is_local(path)]
    remote = [path for path in found if not is_local(path)]
    frames: list[Any] = []
    if local:
        frames.append(_local_archive(spark, local))
    if remote:
        frames.append(_nonblank(spark.read.text(remote)))
    return frames


def _nonblank(df: Any) -> Any:
    """A text source's lines (`value`) and their file (`source`), blank lines dropped."""
    from pyspark.sql import functions as F

    return df.filter(F.trim("value") != "").select("value", F.input_file_name().alias("source"))


def _local_archive(spark: Any, files: list[str]) -> LocalArchive:
    """The key pass's tasks for local archive files, planned as Spark plans a file scan
    (its split size and open cost, over the cores)."""
    from spark_backfill.session import default_parallelism

    conf = spark._jsparkSession.sessionState().conf()
    tasks = splits.plan(files, int(conf.filesMaxPartitionBytes()), default_parallelism(spark),
                        int(conf.filesOpenCostInBytes()))
    return LocalArchive(spark.range(0, len(tasks), numPartitions=len(tasks)), tasks)


def read_parquet(spark: Any, paths: Sequence[str]) -> Any:
    """Parquet files of archive records, back into archive lines."""
    from pyspark.sql import functions as F

    df = spark.read.parquet(*paths)
    columns = set(df.columns)
    if "payload_b64" in columns:
        payload = F.col("payload_b64")
    elif "payload" in columns:
        payload = F.base64("payload")
    else:
        raise ValueError(f"Parquet archive {list(paths)} has neither 'payload_b64' nor 'payload'")
    fields = [payload.alias("payload_b64")]
    for name in ("subject", "headers", "received_at"):
        if name in columns:
            fields.append(F.col(name))
    return df.select(F.to_json(F.struct(*fields)).alias("value"), F.input_file_name().alias("source"))


def read_inputs(spark: Any, paths: Sequence[str], input_format: str = "auto") -> list[Any]:
    """All `--input` paths, as the frames the key pass reads (`keys.key_lines`)."""
    parquet = [p for p in paths if input_format == "parquet" or (input_format == "auto" and _is_parquet(p))]
    text = [p for p in paths if p not in parquet]
    frames = []
    if text:
        frames.extend(read_archive(spark, text))
    if parquet:
        frames.append(read_parquet(spark, parquet))
    return frames


# --- JetStream ---------------------------------------------------------------------------


def read_jetstream(spark: Any, url: str, stream: str, creds: str | None = None, parts: int | None = None) -> Any:
    """The stream's messages (`subject`, `headers`, `data`, `source`), through the
    `nats-jetstream` data source (`jetstream`): one task per sequence range, `parts` ranges
    (default: by size, at least one per core). The plan is made here first, to log it and
    to answer a missing stream in one line before any job (`UsageError`)."""
    from pyspark.sql import functions as F

    from spark_backfill.jetstream import NAME, JetStreamDataSource, JetStreamReader, StreamNotFound
    from spark_backfill.session import default_parallelism

    options = {"servers": url, "stream": stream}
    if creds:
        options["creds"] = creds
    # At least a range per core: a small stream still keeps every core busy in the key pass.
    options.update({"partitions": str(parts)} if parts else {"minPartitions": str(default_parallelism(spark))})
    try:
        ranges, count = JetStreamReader(options).plan()
    except StreamNotFound as exc:
        raise UsageError(str(exc)) from None
    log.info("jetstream %s: %d messages, %d ranges%s", stream, count, len(ranges),
             f" (sequences {ranges[0].first}..{ranges[-1].last})" if ranges else "")
    spark.dataSource.register(JetStreamDataSource)
    frame = spark.read.format(NAME).options(**options).load()
    source = F.concat(F.lit(f"jetstream:{stream}:"), F.col("seq").cast("string"))
    return frame.select("subject", "headers", "data", source.alias("source"))


def read_range(part: JetStreamRange, source: JetStreamSource) -> Iterator[tuple[str, str]]:
    """(archive line, source) of one range, read here (no Spark): what `nats-otel convert`
    would read from an archive of those messages."""
    for messages in read_messages(source, part):
        for seq, subject, headers, data, published in messages:
            raw = RawTraceMessage(subject, headers, data, published.isoformat() if published else None)
            yield archive_record(raw).decode().rstrip("\n"), f"jetstream:{source.stream}:{seq}"
