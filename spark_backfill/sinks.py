"""Load: span rows -> OTLP/JSON lines files, a Parquet span table, an OTLP endpoint; rejects.

The OTLP/JSON files are the Collector file-exporter format, one request per trace, the
bytes of `nats-otel convert`'s `split_by_trace` + `to_otlp_json_line`, spliced from the
spans the transform encoded (`fragments`): range-partitioned and sorted by trace id, so
`cat part-*` is byte-identical to `convert`'s output file (the caller picks the file count
by size, `outputs.otlp_json_files`, and names the files, `outputs.jsonl_name`).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import random
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from nats_otel.core.encode import MAX_SPANS_PER_REQUEST, to_protobuf
from nats_otel.core.records import Resource, SpanRecord
from spark_backfill.fragments import TracePiece, span_pieces, trace_line
from spark_backfill.transform import ENCODED_COLUMNS, REJECT_COLUMNS, SPAN_COLUMNS, resource_from_json, row_to_span

__all__ = [
    "OtlpExportSettings",
    "export_otlp",
    "otlp_json_lines",
    "span_table",
    "write_otlp_json",
    "write_parquet",
    "write_rejects",
]

log = logging.getLogger("spark_backfill")

# What OTLP/JSON needs to rebuild a span exactly.
_REBUILD_COLUMNS = [
    "trace_id", "span_id", "parent_span_id", "name", "kind", "start_ns", "end_ns",
    "status_code", "status_message", "trace_state", "attributes_json", "resource_json",
]  # fmt: skip

_REJECT_COLUMNS = ["reject_reason", "reject_detail", "subject", "source", "record"]


def span_table(rows: Any) -> Any:
    """The span table's columns and each span's OTLP/JSON (those of them the rows have)."""
    return rows.select(*[c for c in (*SPAN_COLUMNS, *ENCODED_COLUMNS) if c in rows.columns])


def _spans_of(batch: Any) -> list[SpanRecord]:
    return [row_to_span(row) for row in batch.to_pylist()]


def _batch(columns: dict[str, list[Any]], schema: str) -> Any:
    from spark_backfill.transform import arrow_batch

    names = list(columns)
    rows = [dict(zip(names, values, strict=True)) for values in zip(*columns.values(), strict=True)]
    return arrow_batch(rows, schema)


# --- OTLP/JSON files ---------------------------------------------------------------------


# What the OTLP/JSON sink reads: the encoded span, and (only where that is null, i.e. a span
# the completeness marking changed) what rebuilds the span to encode it again.
_PIECE_COLUMNS = ["trace_id", "span_id", "start_ns", "end_ns", "resource_json", *ENCODED_COLUMNS]


def _pieces(batch: Any) -> Iterator[tuple[str, TracePiece]]:
    columns = batch.to_pydict()
    rebuild = [c for c in _REBUILD_COLUMNS if c not in _PIECE_COLUMNS]
    for i, (trace_id, span_id, start_ns, end_ns, resource_json, resource, span) in enumerate(
        zip(*(columns[c] for c in _PIECE_COLUMNS), strict=True)
    ):
        if span is None:
            row = {c: columns[c][i] for c in _PIECE_COLUMNS + rebuild}
            ((resource, span),) = span_pieces([row_to_span(row)])
        yield trace_id, (start_ns, end_ns, span_id, resource_json, resource, span)


def otlp_json_lines(batches: Iterator[Any]) -> Iterator[Any]:
    """One OTLP/JSON line per trace (per `MAX_SPANS_PER_REQUEST` spans of it) from Arrow
    batches sorted by trace id, then by each span's (start, end, id).

    A trace may straddle two batches of the partition: its spans are held back until a
    batch shows the next trace id (or the partition ends).
    """
    import pyarrow as pa

    # Spans group by `Resource` equality, as `group_by_resource` does: rebuilt once per text.
    resources: dict[object, Resource] = {}

    def resource_key(text: object) -> Resource:
        resource = resources.get(text)
        if resource is None:
            # Each piece's resource key is its row's resource_json text.
            resource = resources[text] = resource_from_json(text)  # type: ignore[arg-type]
        return resource

    pending: list[TracePiece] = []
    current = None
    for batch in batches:
        lines: list[str] = []
        for trace_id, piece in _pieces(batch):
            if pending and (trace_id != current or len(pending) >= MAX_SPANS_PER_REQUEST):
                lines.append(trace_line(pending, resource_key))
                pending = []
            current = trace_id
            pending.append(piece)
        yield pa.RecordBatch.from_arrays([pa.array(lines, pa.string())], names=["value"])
    if pending:
        yield pa.RecordBatch.from_arrays([pa.array([trace_line(pending, resource_key)], pa.string())], names=["value"])


def write_otlp_json(spans: Any, out: str, partitions: int, mode: str = "error",
                    compression: str = "none") -> None:
    """OTLP/JSON lines, `partitions` files range-partitioned by trace id, each sorted."""
    from pyspark.sql import functions as F

    # A lean conversion (no completeness marking) has no span to rebuild: nulls stand in.
    rebuild = [F.when(F.col("otlp_span").isNull(), F.col(c) if c in spans.columns else F.lit(None)).alias(c)
               for c in _REBUILD_COLUMNS if c not in _PIECE_COLUMNS]
    df = spans.select(*_PIECE_COLUMNS, *rebuild)
    # Spans in their order within each trace, so that a long trace splits where `convert` splits it.
    df = df.repartitionByRange(partitions, F.col("trace_id")).sortWithinPartitions(
        "trace_id", "start_ns", "end_ns", "span_id")
    lines = df.mapInArrow(otlp_json_lines, "value string")
    lines.write.mode(mode).option("compression", compression).text(out)


# --- Parquet -----------------------------------------------------------------------------


def write_parquet(spans: Any, out: str, mode: str = "error", files: int | None = None) -> None:
    """The Parquet span table: one row per span, flat columns, attributes as maps; at most
    `files` files (fewer, larger files than the input's splits give)."""
    table = spans.drop(*ENCODED_COLUMNS)
    (table.coalesce(files) if files else table).write.mode(mode).parquet(out)


def write_rejects(rejects: Any, out: str, mode: str = "error", compression: str = "none") -> None:
    """Rejected records (`transform.REJECT_COLUMNS`) as JSON Lines in one file: reason,
    detail, subject, source, the record."""
    rejects.select(*REJECT_COLUMNS).coalesce(1).write.mode(mode).option("compression", compression).json(out)


# --- OTLP export from the executors ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OtlpExportSettings:
    """OTLP/HTTP protobuf export: shipped to executors, each builds its own client."""

    endpoint: str
    headers: tuple[tuple[str, str], ...] = ()
    batch_spans: int = 512
    max_attempts: int = 5
    timeout: float = 10.0
    spans_per_second: float = 0.0  # per task; 0 = unlimited
    backoff: tuple[float, float] = (0.5, 8.0)  # first and longest pause between attempts

    @property
    def url(self) -> str:
        base = self.endpoint.rstrip("/")
        return base if base.endswith("/v1/traces") else base + "/v1/traces"


_EXPORT_SCHEMA = "sent long, failed long, error string"

# Answers worth another attempt (the OTLP/HTTP spec's retryable codes).
_RETRYABLE = frozenset({429, 502, 503, 504})


@dataclass(slots=True)
class _Exporter:
    """A minimal OTLP/HTTP client with bounded, jittered retries and a rate limit."""

    settings: OtlpExportSettings
    _next_send: float = 0.0
    _rand: random.Random = field(default_factory=random.Random)

    def send(self, spans: Sequence[SpanRecord]) -> tuple[bool, str]:
        self._pace(len(spans))
        body = to_protobuf(list(spans)).SerializeToString()
        headers = {"Content-Type": "application/x-protobuf", **dict(self.settings.headers)}
        pause, longest = self.settings.backoff
        error = ""
        for attempt in range(1, self.settings.max_attempts + 1):
            request = urllib.request.Request(self.settings.url, data=body, headers=headers, method="POST")
            try:
                with urllib.request.urlopen(request, timeout=self.settings.timeout) as response:
                    response.read()
                return True, ""
            except urllib.error.HTTPError as exc:
                error = f"HTTP {exc.code}"
                if exc.code not in _RETRYABLE:
                    return False, error
            except (urllib.error.URLError, OSError) as exc:
                error = str(exc)
            if attempt < self.settings.max_attempts:
                time.sleep(min(longest, pause * 2 ** (attempt - 1)) * (0.5 + self._rand.random() / 2))
        return False, error

    def _pace(self, count: int) -> None:
        rate = self.settings.spans_per_second
        if rate <= 0:
            return
        now = time.monotonic()
        if self._next_send > now:
            time.sleep(self._next_send - now)
        self._next_send = max(now, self._next_send) + count / rate


def _export_batches(batches: Iterator[Any], settings: OtlpExportSettings) -> Iterator[Any]:
    exporter = _Exporter(settings)  # built here, in the executor: nothing from the driver
    sent = failed = 0
    errors: list[str] = []
    for pdf in batches:
        spans = _spans_of(pdf)
        for start in range(0, len(spans), settings.batch_spans):
            chunk = spans[start : start + settings.batch_spans]
            ok, error = exporter.send(chunk)
            if ok:
                sent += len(chunk)
            else:
                failed += len(chunk)
                errors.append(error)
    yield _batch({"sent": [sent], "failed": [failed], "error": [errors[-1] if errors else ""]}, _EXPORT_SCHEMA)


def export_otlp(spans: Any, settings: OtlpExportSettings, partitions: int) -> tuple[int, int, str]:
    """Export every span; returns (sent, failed, last error). Failures are counted, not raised."""
    df = spans.select(*_REBUILD_COLUMNS).repartition(partitions, "trace_id")
    # The flag is a total: every concurrent task gets its share.
    per_task = dataclasses.replace(settings, spans_per_second=settings.spans_per_second / partitions)
    stats = df.mapInArrow(functools.partial(_export_batches, settings=per_task), _EXPORT_SCHEMA)
    sent = failed = 0
    error = ""
    for row in stats.collect():
        sent += row["sent"]
        failed += row["failed"]
        error = row["error"] or error
    return sent, failed, error
