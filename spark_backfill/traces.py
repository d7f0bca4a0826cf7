"""OTLP/JSON lines straight from the keyed records: one exchange, no span rows.

When the OTLP/JSON files (and the rejects) are all a run writes, span rows are a detour:
rows persisted, counted, range-partitioned by trace id (a sampling job) and shuffled a
second time, for the sink to splice them into lines. Here the records are partitioned
once, by the trace their spans are in, so that each task holds whole traces and writes
them with `split_by_trace` + `to_otlp_json_line`, the very functions of `nats-otel
convert`: the same bytes by construction.

- A traceparent's context knows its trace (`keys`: `trace_key`). Its records go to the
  partition of their trace id's range, sorted by (trace, context): each context is
  converted (`transform.ContextGroup`), and each trace written when the next one starts.
- An ad-hoc context's traces are named by their origin's report, known once linked: those
  contexts are converted first (a small exchange by context key, the ad-hoc records only),
  and their lines join the same partitioning by their trace ids.

Partition `p` holds the trace ids of the `p`-th of `files` equal slices of the id space
(trace ids are random), so `cat part-*` is in trace id order without sampling the input:
`bucket_values` finds, once per run, an integer that Spark's hash partitioning sends to
each partition. The counts (`Tally`) come back through an accumulator.

`write_otlp_json` has the tasks write their files themselves when the output folder is on
this machine's file system (`_trace_files`): the lines never cross into the JVM, which
otherwise took each as a Python string through Arrow and wrote it again (~560 MB per 200k
trace messages). Elsewhere Spark's text writer writes the lines of `otlp_json_lines`.
"""

from __future__ import annotations

import functools
import os
import uuid
from collections.abc import Iterable, Iterator
from typing import Any

from nats_otel.core.encode import split_by_trace, to_otlp_json_line
from nats_otel.core.records import SpanRecord
from spark_backfill import runs
from spark_backfill.keys import ConvertSettings
from spark_backfill.transform import ContextGroup

__all__ = ["FILE_SCHEMA", "LINE_SCHEMA", "Tally", "bucket_values", "otlp_json_lines", "write_otlp_json"]

# Lines (`value`) with the trace they belong to and their place in it (a trace of more than
# MAX_SPANS_PER_REQUEST spans is several lines, in order).
LINE_SCHEMA = "trace_key binary, chunk int, value string"

# The keyed records' columns read here.
_COLUMNS = ["subject", "headers", "payload", "source", "ctx_key", "server_id", "seq"]


class Tally:
    """Messages, spans and issues by kind, added up over the tasks (an AccumulatorParam)."""

    @staticmethod
    def zero(value: dict[str, Any]) -> dict[str, Any]:
        return {"messages": 0, "spans": 0, "issues": {}}

    @staticmethod
    def addInPlace(total: dict[str, Any], more: dict[str, Any]) -> dict[str, Any]:  # noqa: N802 - Spark's name
        total["messages"] += more["messages"]
        total["spans"] += more["spans"]
        for name, n in more["issues"].items():
            total["issues"][name] = total["issues"].get(name, 0) + n
        return total


class _Writer:
    """Spans of whole traces in, OTLP/JSON lines out, counted: into `stream` (a binary
    file) when given, else as batches of LINE_SCHEMA (`batch_rows` at a time)."""

    __slots__ = ("chunks", "counts", "keys", "lines", "settings", "stream", "tally", "written")

    def __init__(self, settings: ConvertSettings, tally: Any, stream: Any = None) -> None:
        self.settings, self.tally, self.stream = settings, tally, stream
        self.keys: list[bytes] = []
        self.chunks: list[int] = []
        self.lines: list[str] = []
        self.counts: dict[str, Any] = Tally.zero({})
        self.written = 0  # lines into `stream`

    def converted(self, group: ContextGroup, run_index: runs.RunIndex | None) -> list[SpanRecord]:
        """The spans of one context's records, counted."""
        spans: list[SpanRecord] = []
        counts = self.counts
        for _, result in group.convert(self.settings, run_index):
            spans.extend(result.spans)
            counts["messages"] += 1
            for issue in result.issues:
                name = issue.split(":")[0]
                counts["issues"][name] = counts["issues"].get(name, 0) + 1
        counts["spans"] += len(spans)
        return spans

    def write(self, spans: list[SpanRecord]) -> None:
        """The lines of whole traces (`convert`'s: sorted by trace id, long ones split)."""
        for chunk, trace in enumerate(split_by_trace(spans)):
            if self.stream is not None:
                self.stream.write(to_otlp_json_line(trace))
                self.written += 1
                continue
            self.keys.append(trace[0].trace_id)
            self.chunks.append(chunk)
            self.lines.append(to_otlp_json_line(trace).decode().removesuffix("\n"))

    def passed(self, key: bytes, chunk: int, line: str) -> None:
        if self.stream is not None:
            self.stream.write(line.encode() + b"\n")
            self.written += 1
            return
        self.keys.append(key)
        self.chunks.append(chunk)
        self.lines.append(line)

    def full(self) -> bool:
        return len(self.lines) >= self.settings.batch_rows

    def batch(self) -> Any:
        import pyarrow as pa

        batch = pa.RecordBatch.from_arrays(
            [pa.array(self.keys, pa.binary()), pa.array(self.chunks, pa.int32()), pa.array(self.lines, pa.string())],
            names=["trace_key", "chunk", "value"])
        self.keys, self.chunks, self.lines = [], [], []
        return batch

    def close(self) -> None:
        if self.tally is not None:
            self.tally.add(self.counts)


def _adhoc_lines(batches: Iterable[Any], settings: ConvertSettings, run_index: runs.RunIndex | None,
                 tally: Any) -> Iterator[Any]:
    """Lines of the ad-hoc contexts of a partition sorted by context key: each context's
    traces are its own (their ids hash its key), so each is written when converted."""
    writer = _Writer(settings, tally)
    group = ContextGroup()
    key = None
    for batch in batches:
        for subject, headers, payload, source, ctx_key, server_id, seq in zip(
                *(batch.column(c).to_pylist() for c in _COLUMNS), strict=True):
            if ctx_key != key and group.raws:
                writer.write(writer.converted(group, run_index))
                if writer.full():
                    yield writer.batch()
            key = ctx_key
            group.add(subject, headers, payload, source, server_id, seq)
    if group.raws:
        writer.write(writer.converted(group, run_index))
    writer.close()
    yield writer.batch()


def _trace_lines(batches: Iterable[Any], settings: ConvertSettings, run_index: runs.RunIndex | None,
                 tally: Any) -> Iterator[Any]:
    """Lines (LINE_SCHEMA) of a partition sorted by (trace, context, chunk): `_convert_traces`."""
    writer = _Writer(settings, tally)
    yield from _convert_traces(batches, writer, run_index)
    yield writer.batch()


def _convert_traces(batches: Iterable[Any], writer: _Writer, run_index: runs.RunIndex | None) -> Iterator[Any]:
    """Into `writer`, the lines of a partition sorted by (trace, context, chunk): records of
    traceparent contexts (converted here, each trace written when the next begins) and the
    ad-hoc contexts' lines (`value` set: passed on in their place). Yields each full batch."""
    group = ContextGroup()
    spans: list[SpanRecord] = []
    trace = context = None
    for batch in batches:
        for trace_key, chunk, value, *record in zip(
                *(batch.column(c).to_pylist() for c in ["trace_key", "chunk", "value", *_COLUMNS]), strict=True):
            subject, headers, payload, source, ctx_key, server_id, seq = record
            if group.raws and (ctx_key != context or trace_key != trace):
                spans.extend(writer.converted(group, run_index))
            if spans and trace_key != trace:
                writer.write(spans)
                spans = []
                if writer.full():
                    yield writer.batch()
            trace, context = trace_key, ctx_key
            if value is not None:
                writer.passed(trace_key, chunk, value)
            else:
                group.add(subject, headers, payload, source, server_id, seq)
    if group.raws:
        spans.extend(writer.converted(group, run_index))
    if spans:
        writer.write(spans)
    writer.close()


# What each task that writes its own file says of it.
FILE_SCHEMA = "partition int, lines long"


def _trace_files(batches: Iterable[Any], settings: ConvertSettings, run_index: runs.RunIndex | None, tally: Any,
                 folder: str, name: str, gzip_level: int | None) -> Iterator[Any]:
    """As `_trace_lines`, the lines written by the task itself into `folder`, in the file
    Spark's text writer would name for this partition (`name`: a format of the partition's
    number). Written beside it first (a hidden name of this attempt's), then renamed: a
    retried task's file replaces the first's whole, with the same bytes."""
    import gzip

    import pyarrow as pa
    from pyspark import TaskContext

    context = TaskContext.get()
    assert context is not None  # a task's code
    partition = context.partitionId()
    final = os.path.join(folder, name.format(partition))
    temp = os.path.join(folder, f".{name.format(partition)}.{context.attemptNumber()}.tmp")
    with open(temp, "wb", buffering=1 << 20) as raw:
        stream = raw if gzip_level is None else gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=gzip_level,
                                                              mtime=0)
        with stream:
            writer = _Writer(settings, tally, stream)
            for _ in _convert_traces(batches, writer, run_index):
                pass  # a writer with a stream keeps no batch
    os.replace(temp, final)
    yield pa.RecordBatch.from_pydict({"partition": [partition], "lines": [writer.written]},
                                     schema=pa.schema([("partition", pa.int32()), ("lines", pa.int64())]))


def bucket_values(spark: Any, partitions: int) -> list[int]:
    """For each partition `p` < `partitions`, an integer that Spark's hash partitioning
    (`repartition(partitions, column)`) sends to `p`: asked of Spark itself (one small job),
    so it holds for any version's hash."""
    from pyspark.sql import functions as F

    found: dict[int, int] = {}
    tried = 0
    while len(found) < partitions:
        span = max(64, partitions * 16)
        rows = spark.range(tried, tried + span).select(
            F.col("id"), F.pmod(F.hash(F.col("id").cast("int")), F.lit(partitions)).alias("p")).collect()
        for row in rows:
            found.setdefault(row["p"], row["id"])
        tried += span
    return [found[p] for p in range(partitions)]


def _ordered(keyed: Any, settings: ConvertSettings, run_index: runs.RunIndex | None, files: int, spark: Any,
             tally: Any) -> Any:
    """The good keyed records (and the ad-hoc contexts' lines) in `files` partitions by
    trace id slice, each sorted by (trace, context, chunk): what `_convert_traces` reads."""
    from pyspark.sql import functions as F

    good = keyed.where(F.col("reject_reason").isNull())
    # Partitions left to adaptive execution, which merges them: ad-hoc records are mostly
    # few, and an empty task still costs a Python round trip.
    adhoc = good.where(F.col("trace_key").isNull()).select(*_COLUMNS).repartition("ctx_key")
    adhoc_lines = adhoc.sortWithinPartitions("ctx_key").mapInArrow(
        functools.partial(_adhoc_lines, settings=settings, run_index=run_index, tally=tally), LINE_SCHEMA)
    records = good.where(F.col("trace_key").isNotNull()).select("trace_key", *_COLUMNS)
    both = records.unionByName(adhoc_lines, allowMissingColumns=True)
    # The first 4 bytes of the trace id, as a fraction of the id space, pick the slice.
    high = F.conv(F.hex(F.substring("trace_key", 1, 4)), 16, 10).cast("long")
    slice_of = F.floor(high * F.lit(files) / F.lit(1 << 32)).cast("int")
    bucket = F.element_at(F.array(*[F.lit(v) for v in bucket_values(spark, files)]), slice_of + 1)
    placed = both.withColumn("bucket", bucket.cast("int")).repartition(files, "bucket")
    return placed.sortWithinPartitions("trace_key", "ctx_key", "chunk")


def otlp_json_lines(keyed: Any, settings: ConvertSettings, run_index: runs.RunIndex | None, files: int,
                    spark: Any, tally: Any = None) -> Any:
    """The OTLP/JSON lines (`value`) of the good keyed records, in `files` partitions
    ordered by trace id, each sorted: what `write.text` writes as `convert`'s file.
    `tally`: an accumulator of `Tally` (None: not counted)."""
    lines = _ordered(keyed, settings, run_index, files, spark, tally).mapInArrow(
        functools.partial(_trace_lines, settings=settings, run_index=run_index, tally=tally), LINE_SCHEMA)
    return lines.select("value")


def _local_path(path: str) -> str | None:
    """The path of this machine's file system that `path` (plain, `file:/...` as Hadoop
    writes it, or `file:///...`) names; None for any other file system."""
    if path.startswith("file:"):
        return "/" + path.removeprefix("file:").lstrip("/")
    return None if ":" in path.split("/", 1)[0] else path


def write_otlp_json(keyed: Any, settings: ConvertSettings, run_index: runs.RunIndex | None, files: int,
                    spark: Any, out: str, mode: str, compression: str, tally: Any = None) -> None:
    """`otlp_json_lines` written to the folder `out`, a file per partition: by the tasks
    themselves when `out` is on this machine's file system (the JVM then carries no line:
    ~560 MB for 200k trace messages), else by Spark's text writer. The same files either
    way: Spark's names (`outputs.jsonl_name` renames both), `_SUCCESS` once all are in."""
    from spark_backfill.session import is_remote

    folder = _local_path(out)
    if is_remote(spark) or folder is None:
        otlp_json_lines(keyed, settings, run_index, files, spark, tally).write.mode(mode).option(
            "compression", compression).text(out)
        return
    if os.path.exists(folder) and mode == "error":
        raise FileExistsError(f"output {out} exists")
    os.makedirs(folder, exist_ok=True)
    name = "part-{:05d}-" + uuid.uuid4().hex + "-c000.txt" + (".gz" if compression == "gzip" else "")
    write = functools.partial(_trace_files, settings=settings, run_index=run_index, tally=tally, folder=folder,
                              name=name, gzip_level=6 if compression == "gzip" else None)
    _ordered(keyed, settings, run_index, files, spark, tally).mapInArrow(write, FILE_SCHEMA).collect()
    for leftover in os.listdir(folder):  # a failed attempt's file, when a retry took its place
        if leftover.startswith(".part-") and leftover.endswith(".tmp"):
            os.remove(os.path.join(folder, leftover))
    with open(os.path.join(folder, "_SUCCESS"), "wb"):
        pass
