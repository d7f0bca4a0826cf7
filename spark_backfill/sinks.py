"""Load: span rows -> OTLP/JSON lines files, a Parquet span table, an OTLP endpoint; rejects.

The OTLP/JSON files are the Collector file-exporter format, one request per trace, made by
the same `split_by_trace` + `to_otlp_json_line` as `nats-otel convert`: range-partitioned
and sorted by trace id, so `cat part-*` is byte-identical to `convert`'s output file.
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

from nats_otel.encode import split_by_trace, to_otlp_json_line, to_protobuf
from nats_otel.records import SpanRecord

from .transform import SPAN_COLUMNS, row_to_span

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
    """The span rows only, with the span table's columns."""
    return rows.filter(rows.row_type == "span").select(*SPAN_COLUMNS)


def _spans_of(pdf: Any) -> list[SpanRecord]:
    return [row_to_span(row) for row in pdf.to_dict("records")]


# --- OTLP/JSON files ---------------------------------------------------------------------


def otlp_json_lines(batches: Iterator[Any]) -> Iterator[Any]:
    """One OTLP/JSON line per trace from batches sorted by trace id.

    A trace may straddle two Arrow batches of the partition: its spans are held back until
    a batch shows the next trace id (or the partition ends).
    """
    import pandas as pd

    pending: list[SpanRecord] = []
    for pdf in batches:
        lines: list[str] = []
        for span in _spans_of(pdf):
            if pending and pending[-1].trace_id != span.trace_id:
                lines.extend(_trace_lines(pending))
                pending = []
            pending.append(span)
        yield pd.DataFrame({"value": pd.Series(lines, dtype=object)})
    if pending:
        yield pd.DataFrame({"value": pd.Series(_trace_lines(pending), dtype=object)})


def _trace_lines(spans: list[SpanRecord]) -> list[str]:
    return [to_otlp_json_line(trace).decode().rstrip("\n") for trace in split_by_trace(spans)]


def write_otlp_json(spans: Any, out: str, partitions: int, mode: str = "errorifexists", compression: str = "none") -> None:
    """OTLP/JSON lines, `partitions` files range-partitioned by trace id, each sorted."""
    from pyspark.sql import functions as F

    df = spans.select(*_REBUILD_COLUMNS)
    df = df.repartitionByRange(partitions, F.col("trace_id")).sortWithinPartitions("trace_id")
    lines = df.mapInPandas(otlp_json_lines, "value string")
    lines.write.mode(mode).option("compression", compression).text(out)


# --- Parquet -----------------------------------------------------------------------------


def write_parquet(spans: Any, out: str, mode: str = "errorifexists") -> None:
    """The Parquet span table: one row per span, flat columns, attributes as maps."""
    spans.write.mode(mode).parquet(out)


def write_rejects(rows: Any, out: str, mode: str = "errorifexists") -> None:
    """Rejected records as JSON Lines: reason, detail, subject, source, the record itself."""
    rejects = rows.filter(rows.row_type == "reject").select(*_REJECT_COLUMNS)
    rejects.withColumnRenamed("reject_reason", "reason").withColumnRenamed("reject_detail", "detail").coalesce(
        1
    ).write.mode(mode).json(out)


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
    import pandas as pd

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
    yield pd.DataFrame({"sent": [sent], "failed": [failed], "error": [errors[-1] if errors else ""]})


def export_otlp(spans: Any, settings: OtlpExportSettings, partitions: int) -> tuple[int, int, str]:
    """Export every span; returns (sent, failed, last error). Failures are counted, not raised."""
    df = spans.select(*_REBUILD_COLUMNS).repartition(partitions, "trace_id")
    # The flag is a total: every concurrent task gets its share.
    per_task = dataclasses.replace(settings, spans_per_second=settings.spans_per_second / partitions)
    stats = df.mapInPandas(functools.partial(_export_batches, settings=per_task), "sent long, failed long, error string")
    sent = failed = 0
    error = ""
    for row in stats.collect():
        sent += row["sent"]
        failed += row["failed"]
        error = row["error"] or error
    return sent, failed, error
