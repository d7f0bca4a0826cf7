"""Extract: every source becomes one DataFrame of archive lines (`value`, `source`).

One shape for all sources means one parse path in the executors (`parse_archive_line`,
the same as `nats-otel convert`):

- archive JSON Lines: local files and folders (expanded like `convert` does), globs and any
  Hadoop-compatible URI (`s3a://`, `hdfs://`, `.gz` decompressed by Spark);
- Parquet files of archive records (`subject`, `headers`, `payload_b64` or binary `payload`,
  optional `received_at`), turned back into archive lines by Spark;
- a JetStream stream, read in parallel by sequence ranges (see `read_range`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nats_otel.archive import archive_record
from nats_otel.core.decode import RawTraceMessage
from spark_backfill.checks import is_local, local_inputs

__all__ = [
    "JetStreamRange",
    "JetStreamSource",
    "plan_ranges",
    "read_archive",
    "read_inputs",
    "read_jetstream",
    "read_parquet",
    "read_range",
    "stream_bounds",
]

log = logging.getLogger("spark_backfill")

# The names `nats_otel.archive.expand_inputs` takes from a folder, as a Hadoop glob.
ARCHIVE_GLOB = "*.{jsonl,ndjson,jsonl.gz,ndjson.gz}"

# Headers the server adds to messages it hands out of a stream; not the trace message's own.
_STREAM_HEADERS = frozenset(
    {"nats-stream", "nats-sequence", "nats-subject", "nats-time-stamp", "nats-num-pending", "nats-last-sequence"}
)


# --- archive files -----------------------------------------------------------------------


def _is_parquet(path: str) -> bool:
    if path.endswith(".parquet"):
        return True
    local = Path(path.removeprefix("file://"))
    return is_local(path) and local.is_dir() and any(local.rglob("*.parquet"))


def read_archive(spark: Any, paths: Sequence[str]) -> Any:
    """Archive JSON Lines (DESIGN §5) as (`value`, `source`); blank lines dropped like `convert`."""
    from pyspark.sql import functions as F

    from spark_backfill.session import is_remote

    if is_remote(spark):
        # A Connect server reads its own file system: it expands folders (to their archive
        # files, like `convert`) and globs.
        df = spark.read.options(recursiveFileLookup="true", pathGlobFilter=ARCHIVE_GLOB).text(list(paths))
    else:
        df = spark.read.text(local_inputs(paths))
    return df.filter(F.trim("value") != "").select("value", F.input_file_name().alias("source"))


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


def read_inputs(spark: Any, paths: Sequence[str], input_format: str = "auto") -> Any:
    """All `--input` paths as one DataFrame of archive lines."""
    parquet = [p for p in paths if input_format == "parquet" or (input_format == "auto" and _is_parquet(p))]
    text = [p for p in paths if p not in parquet]
    frames = []
    if text:
        frames.append(read_archive(spark, text))
    if parquet:
        frames.append(read_parquet(spark, parquet))
    df = frames[0]
    for other in frames[1:]:
        df = df.unionByName(other)
    return df


# --- JetStream ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class JetStreamSource:
    """Where the stream is: shipped to the executors, which connect themselves."""

    url: str
    stream: str
    creds: str | None = None
    fetch_batch: int = 512
    timeout: float = 5.0


@dataclass(frozen=True, slots=True)
class JetStreamRange:
    """Stream sequences `first`..`last` (inclusive): one task's share."""

    first: int
    last: int


def plan_ranges(first: int, last: int, parts: int) -> list[JetStreamRange]:
    """Split `first..last` into at most `parts` contiguous, non-overlapping ranges."""
    if last < first or first <= 0:
        return []
    total = last - first + 1
    size = math.ceil(total / max(1, parts))
    return [JetStreamRange(start, min(last, start + size - 1)) for start in range(first, last + 1, size)]


async def _connect(source: JetStreamSource) -> Any:
    import nats

    kwargs: dict[str, Any] = {"servers": [source.url], "connect_timeout": source.timeout, "allow_reconnect": False}
    if source.creds:
        kwargs["user_credentials"] = source.creds
    return await nats.connect(**kwargs)


async def _bounds(source: JetStreamSource) -> tuple[int, int, int]:
    nc = await _connect(source)
    try:
        info = await nc.jetstream(timeout=source.timeout).stream_info(source.stream)
        return info.state.first_seq, info.state.last_seq, info.state.messages
    finally:
        await nc.close()


def stream_bounds(source: JetStreamSource) -> tuple[int, int, int]:
    """(first sequence, last sequence, message count) of the stream, asked by the driver."""
    return asyncio.run(_bounds(source))


def _raw(msg: Any) -> RawTraceMessage:
    headers = {k: [v] for k, v in (msg.headers or {}).items() if k.lower() not in _STREAM_HEADERS}
    stamp = msg.metadata.timestamp
    return RawTraceMessage(msg.subject, headers, msg.data, stamp.isoformat() if stamp else None)


async def _read(source: JetStreamSource, part: JetStreamRange) -> list[tuple[str, str]]:
    """Archive lines of the messages with sequences in `part`.

    An ephemeral pull consumer starting at `part.first`, no acks, in memory, deleted when
    done (and by the server after `inactive_threshold` should this task die first): reads
    only this range and leaves no consumer state behind. Gaps (deleted messages) are
    skipped by the server.
    """
    from nats.errors import TimeoutError as NatsTimeout
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

    nc = await _connect(source)
    js = nc.jetstream(timeout=source.timeout)
    out: list[tuple[str, str]] = []
    consumer = None
    try:
        config = ConsumerConfig(
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=part.first,
            ack_policy=AckPolicy.NONE,
            inactive_threshold=60.0,
            mem_storage=True,
            num_replicas=1,
        )
        info = await js.add_consumer(source.stream, config)
        consumer = info.name
        sub = await js.pull_subscribe_bind(consumer=consumer, stream=source.stream)
        done = False
        while not done:
            try:
                msgs = await sub.fetch(batch=source.fetch_batch, timeout=source.timeout)
            except (TimeoutError, NatsTimeout):
                break  # nothing more in the stream
            for msg in msgs:
                seq = msg.metadata.sequence.stream
                if seq > part.last:
                    done = True
                    break
                line = archive_record(_raw(msg)).decode().rstrip("\n")
                out.append((line, f"jetstream:{source.stream}:{seq}"))
                if seq == part.last or msg.metadata.num_pending == 0:
                    done = True
                    break
        await sub.unsubscribe()
    finally:
        if consumer is not None:
            try:
                await js.delete_consumer(source.stream, consumer)
            except Exception as exc:  # noqa: BLE001 - the inactive threshold removes it anyway
                log.warning("could not delete ephemeral consumer %s: %s", consumer, exc)
        await nc.close()
    return out


def read_range(part: JetStreamRange, source: JetStreamSource) -> Iterator[tuple[str, str]]:
    """(archive line, source) of one range; runs in an executor, connects by itself."""
    yield from asyncio.run(_read(source, part))


def _read_ranges(batches: Iterator[Any], ranges: tuple[JetStreamRange, ...], source: JetStreamSource) -> Iterator[Any]:
    """Arrow batches of archive lines of the ranges whose indexes arrive in `batches`."""
    import pyarrow as pa

    for batch in batches:
        for index in batch.column("id").to_pylist():
            rows = list(read_range(ranges[index], source))
            yield pa.RecordBatch.from_arrays([pa.array([r[0] for r in rows], pa.string()),
                                              pa.array([r[1] for r in rows], pa.string())],
                                             names=["value", "source"])


def read_jetstream(spark: Any, source: JetStreamSource, parts: int | None = None) -> Any:
    """The stream as (`value`, `source`), one Spark task per sequence range.

    DataFrame APIs only (no RDD), so it runs under Spark Connect too: a range of range
    indexes, one per partition, each mapped to its messages in an executor.
    """
    from spark_backfill.session import default_parallelism

    first, last, count = stream_bounds(source)
    if parts is None:
        parts = max(default_parallelism(spark), math.ceil(count / 50_000))
    ranges = plan_ranges(first, last, parts)
    log.info("jetstream %s: %d messages, sequences %d..%d, %d ranges", source.stream, count, first, last, len(ranges))
    if not ranges:
        return spark.createDataFrame([], "value string, source string")
    indexes = spark.range(0, len(ranges), 1, numPartitions=len(ranges))
    return indexes.mapInArrow(functools.partial(_read_ranges, ranges=tuple(ranges), source=source),
                              "value string, source string")
