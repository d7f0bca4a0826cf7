"""Transform: archive lines -> span rows, by the nats_otel core running in the executors.

Two passes over the input, so the numbering of reused traceparents is the one
`convert_batch` gives (`nats_otel.reuse.assign_occurrences`: per reuse key, distinct
ingress times ranked in time order) across the whole dataset:

1. `reuse_keys`: every good record -> (reuse key, ingress ns). Spark groups them per key;
   only keys seen with more than one ingress time (rare: an application bug) come back
   to the driver, as {(key, ingress ns): occurrence > 0}, broadcast to the executors.
2. `convert`: every record -> its span rows (`prepare` + `finish` with that occurrence),
   or one reject row with the reason. A bad record never raises.

Everything handed to `mapInPandas` is a module-level function bound with picklable
arguments (`functools.partial`), never a client or a session.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from nats_otel.decode import DecodeError, DecodeLimits, parse_archive_line
from nats_otel.mapping import MappingOptions
from nats_otel.pipeline import Converted, Rejected, finish, prepare
from nats_otel.records import AttrValue, Resource, SpanKind, SpanRecord
from nats_otel.reuse import ReuseKey

__all__ = [
    "KEY_SCHEMA",
    "ROW_SCHEMA",
    "SPAN_COLUMNS",
    "ConvertSettings",
    "convert",
    "convert_lines",
    "frame",
    "key_lines",
    "occurrence_table",
    "reuse_key_text",
    "row_to_span",
    "span_rows",
]

# A record is kept in the rejects as at most this much of its archive line.
RECORD_EXCERPT = 2000

KEY_SCHEMA = "reuse_key string, ingress_ns long"

# One row per span (row_type 'span') or per rejected record (row_type 'reject').
ROW_SCHEMA = (
    "row_type string, trace_id string, span_id string, parent_span_id string, name string, kind int, "
    "start_ns long, end_ns long, status_code int, status_message string, trace_state string, "
    "role string, server_name string, server_id string, cluster string, account string, subject string, "
    "hop string, connection_kind string, peer string, "
    "attributes map<string,string>, resource_attributes map<string,string>, "
    "attributes_json string, resource_json string, issues array<string>, source string, "
    "reject_reason string, reject_detail string, record string"
)
_COLUMNS = [part.strip().split(" ", 1)[0] for part in ROW_SCHEMA.split(", ") if " " in part.strip()]
# The columns of the Parquet span table (and what `row_to_span` needs).
SPAN_COLUMNS = [c for c in _COLUMNS if c not in ("row_type", "reject_reason", "reject_detail", "record")]


@dataclass(frozen=True, slots=True)
class ConvertSettings:
    """What the executors need to convert: shipped to them, so plain and picklable."""

    options: MappingOptions = field(default_factory=MappingOptions)
    limits: DecodeLimits = field(default_factory=DecodeLimits)


def reuse_key_text(key: ReuseKey) -> str:
    """A reuse key as one string column (fields never contain the unit separator)."""
    trace_id, parent, server_id, hop = key
    return "\x1f".join((trace_id.hex(), parent.hex(), server_id, hop))


# --- pass 1: reuse keys ------------------------------------------------------------------


def key_lines(lines: Sequence[str], limits: DecodeLimits) -> tuple[list[str], list[int]]:
    """(reuse key, ingress ns) of every good record; bad ones are the second pass's job."""
    keys: list[str] = []
    times: list[int] = []
    for line in lines:
        try:
            prepared = prepare(parse_archive_line(line), limits)
        except DecodeError:
            continue
        keys.append(reuse_key_text(prepared.reuse_key))
        times.append(prepared.msg.ingress.ts_ns)
    return keys, times


def _key_batches(batches: Iterator[Any], limits: DecodeLimits) -> Iterator[Any]:
    import pandas as pd

    for pdf in batches:
        keys, times = key_lines(pdf["value"].tolist(), limits)
        yield pd.DataFrame({"reuse_key": pd.Series(keys, dtype=object), "ingress_ns": pd.Series(times, dtype="int64")})


def occurrence_table(lines_df: Any, settings: ConvertSettings) -> dict[tuple[str, int], int]:
    """{(reuse key, ingress ns): occurrence} for the occurrences > 0 in the whole input."""
    from pyspark.sql import functions as F

    keys = lines_df.select("value").mapInPandas(functools.partial(_key_batches, limits=settings.limits), KEY_SCHEMA)
    reused = (
        keys.groupBy("reuse_key")
        .agg(F.array_sort(F.collect_set("ingress_ns")).alias("times"))
        .filter(F.size("times") > 1)
    )
    table: dict[tuple[str, int], int] = {}
    for row in reused.toLocalIterator():
        for rank, ns in enumerate(row["times"]):
            if rank:
                table[(row["reuse_key"], ns)] = rank
    return table


# --- pass 2: convert ---------------------------------------------------------------------


def _text(value: AttrValue | None) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return orjson.dumps(list(value)).decode()
    return str(value)


def _string_map(attributes: Sequence[tuple[str, AttrValue]]) -> dict[str, str]:
    return {key: _text(value) for key, value in attributes}


def _role(index: int, span: SpanRecord) -> str:
    if index == 0:
        return "server"
    return "egress" if span.kind == SpanKind.PRODUCER else "event"


def span_rows(converted: Converted, source: str) -> list[dict[str, Any]]:
    """The rows of one converted trace message: server span first, then its event spans."""
    server = converted.spans[0]
    server_account = _text(server.attribute("nats.account"))
    server_subject = _text(server.attribute("messaging.destination.name"))
    rows = []
    for index, span in enumerate(converted.spans):
        resource = span.resource
        account = span.attribute("nats.account")
        subject = span.attribute("messaging.destination.name")
        rows.append(
            {
                "row_type": "span",
                "trace_id": span.trace_id.hex(),
                "span_id": span.span_id.hex(),
                "parent_span_id": span.parent_span_id.hex(),
                "name": span.name,
                "kind": span.kind,
                "start_ns": span.start_ns,
                "end_ns": span.end_ns,
                "status_code": span.status_code,
                "status_message": span.status_message,
                "trace_state": span.trace_state,
                "role": _role(index, span),
                "server_name": _text(resource.get("nats.server.name")),
                "server_id": _text(resource.get("service.instance.id")),
                "cluster": _text(resource.get("nats.cluster")),
                "account": server_account if account is None else _text(account),
                "subject": server_subject if subject is None else _text(subject),
                "hop": _text(span.attribute("nats.trace.hop")),
                "connection_kind": _text(span.attribute("nats.connection.kind")),
                "peer": _text(span.attribute("nats.connection.name")),
                "attributes": _string_map(span.attributes),
                "resource_attributes": _string_map(resource.attributes),
                # Lossless (bool/int/float/array kept apart): what `row_to_span` rebuilds from.
                "attributes_json": orjson.dumps(span.attributes).decode(),
                "resource_json": orjson.dumps(resource.attributes).decode(),
                "issues": list(converted.issues) if index == 0 else [],
                "source": source,
            }
        )
    return rows


def reject_row(rejected: Rejected, source: str, line: str) -> dict[str, Any]:
    """The row of one record that gave no spans."""
    return {
        "row_type": "reject",
        "subject": rejected.subject,
        "source": source,
        "reject_reason": rejected.reason,
        "reject_detail": rejected.detail,
        "record": line[:RECORD_EXCERPT],
        "issues": [],
    }


def convert_lines(
    lines: Sequence[str],
    sources: Sequence[str],
    settings: ConvertSettings,
    occurrences: Mapping[tuple[str, int], int],
) -> list[dict[str, Any]]:
    """Rows of a batch of archive lines. Pure: the same lines give the same rows."""
    rows: list[dict[str, Any]] = []
    for line, source in zip(lines, sources, strict=True):
        try:
            raw = parse_archive_line(line)
        except DecodeError as exc:
            rows.append(reject_row(Rejected(exc.reason, exc.detail), source, line))
            continue
        try:
            prepared = prepare(raw, settings.limits)
        except DecodeError as exc:
            rows.append(reject_row(Rejected(exc.reason, exc.detail, raw.subject), source, line))
            continue
        occurrence = occurrences.get((reuse_key_text(prepared.reuse_key), prepared.msg.ingress.ts_ns), 0)
        rows.extend(span_rows(finish(prepared, occurrence, settings.options), source))
    return rows


def frame(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> Any:
    """A pandas frame of plain Python objects; absent values are None (not NaN) for Arrow."""
    import pandas as pd

    return pd.DataFrame({c: pd.Series([r.get(c) for r in rows], dtype=object) for c in columns})


def _convert_batches(batches: Iterator[Any], settings: ConvertSettings, occurrences: Any) -> Iterator[Any]:
    table = occurrences.value if hasattr(occurrences, "value") else occurrences
    for pdf in batches:
        yield frame(convert_lines(pdf["value"].tolist(), pdf["source"].tolist(), settings, table), _COLUMNS)


def convert(lines_df: Any, settings: ConvertSettings) -> tuple[Any, int]:
    """Rows (ROW_SCHEMA) of every record of `lines_df` (columns `value`, `source`).

    Returns the DataFrame and how many reused-traceparent occurrences were numbered.
    """
    table = occurrence_table(lines_df, settings)
    spark = lines_df.sparkSession
    shipped = spark.sparkContext.broadcast(table)
    fn = functools.partial(_convert_batches, settings=settings, occurrences=shipped)
    return lines_df.select("value", "source").mapInPandas(fn, ROW_SCHEMA), len(table)


# --- back to span records ----------------------------------------------------------------


def _attributes(text: str) -> tuple[tuple[str, AttrValue], ...]:
    return tuple((key, tuple(value) if isinstance(value, list) else value) for key, value in orjson.loads(text))


def row_to_span(row: Mapping[str, Any]) -> SpanRecord:
    """The SpanRecord a span row was made from, exactly (ids, attribute types, order)."""
    return SpanRecord(
        trace_id=bytes.fromhex(row["trace_id"]),
        span_id=bytes.fromhex(row["span_id"]),
        parent_span_id=bytes.fromhex(row["parent_span_id"] or ""),
        name=row["name"],
        kind=int(row["kind"]),
        start_ns=int(row["start_ns"]),
        end_ns=int(row["end_ns"]),
        resource=Resource(_attributes(row["resource_json"])),
        attributes=_attributes(row["attributes_json"]),
        status_code=int(row["status_code"]),
        status_message=row["status_message"] or "",
        trace_state=row["trace_state"] or "",
    )
