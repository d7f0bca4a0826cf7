"""Transform: archive lines -> span rows, by the nats_otel core running in the executors.

One decode per record. `convert_batch` numbers reused traceparents over the whole input
(`nats_otel.core.reuse.assign_occurrences`: per reuse key, distinct ingress times ranked in time
order), which a partition cannot know; but reuse is rare (an application bug). So:

1. every record is mapped as occurrence 0, and its server row also carries its reuse key,
   ingress time and a hash of its archive line (`line_hash`, computed by Spark);
2. a small aggregation finds the keys seen with several ingress times; only those come
   back to the driver, as {(key, ingress ns): occurrence > 0};
3. if there are any, the rows of those records (by line hash) are dropped, and just those
   lines are read and mapped again with their true occurrence. A hash collision only
   re-maps an innocent line to the very rows it had.

Batches are Arrow record batches built from column lists (`mapInArrow`): no pandas, no
per-row dicts. Each span's OTLP/JSON is encoded here, while its `SpanRecord` exists
(see `fragments`). Everything handed to Spark is a module-level function bound with
picklable arguments (`functools.partial`), never a client or a session.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import orjson

from nats_otel.core.decode import DecodeError, DecodeLimits, parse_archive_line
from nats_otel.core.mapping import MappingOptions
from nats_otel.core.pipeline import Converted, Rejected, finish, prepare
from nats_otel.core.records import AttrValue, Resource, SpanKind, SpanRecord
from nats_otel.core.reuse import ReuseKey

from spark_backfill.fragments import span_pieces

__all__ = [
    "ENCODED_COLUMNS",
    "ROW_SCHEMA",
    "SPAN_COLUMNS",
    "Conversion",
    "ConvertSettings",
    "arrow_batch",
    "convert",
    "convert_lines",
    "ddl",
    "occurrence_table",
    "resource_from_json",
    "reuse_key_text",
    "with_line_hash",
    "row_to_span",
    "span_rows",
]

# A record is kept in the rejects as at most this much of its archive line.
RECORD_EXCERPT = 2000

# One row per span (row_type 'span') or per rejected record (row_type 'reject').
ROW_SCHEMA = (
    "row_type string, trace_id string, span_id string, parent_span_id string, name string, kind int, "
    "start_ns long, end_ns long, status_code int, status_message string, trace_state string, "
    "role string, server_name string, server_id string, cluster string, account string, subject string, "
    "hop string, connection_kind string, peer string, "
    "attributes map<string,string>, resource_attributes map<string,string>, "
    "attributes_json string, resource_json string, issues array<string>, source string, "
    "otlp_resource string, otlp_span string, "
    "reuse_key string, ingress_ns long, line_hash long, "
    "reject_reason string, reject_detail string, record string"
)
_TYPES = dict(part.strip().split(" ", 1) for part in ROW_SCHEMA.split(", "))
_COLUMNS = list(_TYPES)
_INTERNAL = ("row_type", "otlp_resource", "otlp_span", "reuse_key", "ingress_ns", "line_hash",
             "reject_reason", "reject_detail", "record")  # fmt: skip
# The columns of the Parquet span table (and what `row_to_span` needs).
SPAN_COLUMNS = [c for c in _COLUMNS if c not in _INTERNAL]
# Each span's resource and span as OTLP/JSON text: what the OTLP/JSON sink splices.
ENCODED_COLUMNS = ["otlp_resource", "otlp_span"]


@dataclass(frozen=True, slots=True)
class ConvertSettings:
    """What the executors need to convert: shipped to them, so plain and picklable."""

    options: MappingOptions = field(default_factory=MappingOptions)
    limits: DecodeLimits = field(default_factory=DecodeLimits)


def reuse_key_text(key: ReuseKey) -> str:
    """A reuse key as one string column (fields never contain the unit separator)."""
    trace_id, parent, server_id, hop = key
    return "\x1f".join((trace_id.hex(), parent.hex(), server_id, hop))


def _text(value: AttrValue | None) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return orjson.dumps(list(value)).decode()
    return str(value)


def _string_map(attributes: Sequence[tuple[str, AttrValue]]) -> list[tuple[str, str]]:
    # Through a dict: a repeated key keeps its last value, as a Spark map must.
    return list({key: _text(value) for key, value in attributes}.items())


def _role(index: int, span: SpanRecord) -> str:
    if index == 0:
        return "server"
    return "egress" if span.kind == SpanKind.PRODUCER else "event"


def span_rows(converted: Converted, source: str) -> list[dict[str, Any]]:
    """The rows of one converted trace message: server span first, then its event spans."""
    server = converted.spans[0]
    server_account = _text(server.attribute("nats.account"))
    server_subject = _text(server.attribute("messaging.destination.name"))
    pieces = span_pieces(converted.spans)
    resource_texts: dict[Resource, tuple[list[tuple[str, str]], str]] = {}
    rows = []
    for index, span in enumerate(converted.spans):
        resource = span.resource
        if resource not in resource_texts:
            resource_texts[resource] = (_string_map(resource.attributes), orjson.dumps(resource.attributes).decode())
        resource_map, resource_json = resource_texts[resource]
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
                "resource_attributes": resource_map,
                # Lossless (bool/int/float/array kept apart): what `row_to_span` rebuilds from.
                "attributes_json": orjson.dumps(span.attributes).decode(),
                "resource_json": resource_json,
                "issues": list(converted.issues) if index == 0 else [],
                "source": source,
                "otlp_resource": pieces[index][0],
                "otlp_span": pieces[index][1],
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
    hashes: Sequence[int] | None = None,
) -> list[dict[str, Any]]:
    """Rows of a batch of archive lines. Pure: the same lines give the same rows.

    A record's server row carries its reuse key and ingress time; every row of a record
    carries `hashes[i]` (Spark's hash of the line) as `line_hash`.
    """
    rows: list[dict[str, Any]] = []
    for i, (line, source) in enumerate(zip(lines, sources, strict=True)):
        line_hash = hashes[i] if hashes is not None else None
        try:
            raw = parse_archive_line(line)
        except DecodeError as exc:
            row = reject_row(Rejected(exc.reason, exc.detail), source, line)
            row["line_hash"] = line_hash
            rows.append(row)
            continue
        try:
            prepared = prepare(raw, settings.limits)
        except DecodeError as exc:
            row = reject_row(Rejected(exc.reason, exc.detail, raw.subject), source, line)
            row["line_hash"] = line_hash
            rows.append(row)
            continue
        key = reuse_key_text(prepared.reuse_key)
        ingress_ns = prepared.msg.ingress.ts_ns
        occurrence = occurrences.get((key, ingress_ns), 0) if occurrences else 0
        converted = span_rows(finish(prepared, occurrence, settings.options), source)
        converted[0]["reuse_key"] = key
        converted[0]["ingress_ns"] = ingress_ns
        for row in converted:
            row["line_hash"] = line_hash
        rows.extend(converted)
    return rows


def ddl(columns: Sequence[str]) -> str:
    """The Spark DDL schema of some of ROW_SCHEMA's columns (plus `name type` items as given)."""
    return ", ".join(c if " " in c else f"{c} {_TYPES[c]}" for c in columns)


@functools.cache
def _arrow_schema(schema: str) -> Any:
    import pyarrow as pa

    types = {"string": pa.string(), "int": pa.int32(), "long": pa.int64(), "boolean": pa.bool_(),
             "map<string,string>": pa.map_(pa.string(), pa.string()), "array<string>": pa.list_(pa.string())}
    fields = [part.strip().split(" ", 1) for part in schema.split(", ")]
    return pa.schema([pa.field(name, types[kind]) for name, kind in fields])


def arrow_batch(rows: Sequence[Mapping[str, Any]], schema: str) -> Any:
    """One Arrow record batch of `schema` (Spark DDL) from rows; absent values are null."""
    import pyarrow as pa

    arrow = _arrow_schema(schema)
    return pa.RecordBatch.from_arrays(
        [pa.array([r.get(f.name) for r in rows], type=f.type) for f in arrow], schema=arrow
    )


def _convert_batches(batches: Iterable[Any], settings: ConvertSettings, occurrences: Any) -> Iterator[Any]:
    table = occurrences.value if hasattr(occurrences, "value") else occurrences
    for batch in batches:
        columns = batch.to_pydict()
        rows = convert_lines(columns["value"], columns["source"], settings, table, columns.get("line_hash"))
        yield arrow_batch(rows, ROW_SCHEMA)


def _map(lines_df: Any, settings: ConvertSettings, table: Any) -> Any:
    fn = functools.partial(_convert_batches, settings=settings, occurrences=table)
    return lines_df.mapInArrow(fn, ROW_SCHEMA)


def with_line_hash(lines_df: Any) -> Any:
    """`lines_df` (`value`, `source`) with the hash that finds a record again."""
    from pyspark.sql import functions as F

    return lines_df.select("value", "source", F.xxhash64("value").alias("line_hash"))


def occurrence_table(rows: Any) -> dict[tuple[str, int], int]:
    """{(reuse key, ingress ns): occurrence} for the occurrences > 0 in the whole input."""
    from pyspark.sql import functions as F

    reused = (
        rows.filter(F.col("reuse_key").isNotNull())
        .groupBy("reuse_key")
        .agg(F.array_sort(F.collect_set("ingress_ns")).alias("times"))
        .filter(F.size("times") > 1)
    )
    table: dict[tuple[str, int], int] = {}
    for row in reused.toLocalIterator():
        for rank, ns in enumerate(row["times"]):
            if rank:
                table[(row["reuse_key"], ns)] = rank
    return table


class Conversion(NamedTuple):
    """What `convert` gives: the rows, reused occurrences numbered, the persisted frame."""

    rows: Any
    reused: int
    persisted: Any


def convert(lines_df: Any, settings: ConvertSettings, persist: Any = None) -> Conversion:
    """Rows (ROW_SCHEMA) of every record of `lines_df` (columns `value`, `source`).

    The first mapping is persisted with `persist` (a StorageLevel; default memory and disk):
    the reuse check, the counts and every sink read it instead of mapping again (and
    range partitioning samples it). The caller unpersists it when done.
    """
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    hashed = with_line_hash(lines_df)
    first = _map(hashed, settings, {}).persist(persist or StorageLevel.MEMORY_AND_DISK)
    table = occurrence_table(first)
    if not table:
        return Conversion(first, 0, first)
    spark = lines_df.sparkSession
    redo = {h for (h,) in first.filter(F.col("reuse_key").isin(list({k for k, _ in table})))
            .select("line_hash").distinct().collect()}
    shipped = spark.sparkContext.broadcast(table)
    kept = first.filter(~F.col("line_hash").isin(list(redo)))
    again = _map(hashed.filter(F.col("line_hash").isin(list(redo))), settings, shipped)
    return Conversion(kept.unionByName(again), len(table), first)


# --- back to span records ----------------------------------------------------------------


def _attributes(text: str) -> tuple[tuple[str, AttrValue], ...]:
    return tuple((key, tuple(value) if isinstance(value, list) else value) for key, value in orjson.loads(text))


def resource_from_json(text: str) -> Resource:
    """The Resource a row's `resource_json` was made from."""
    return Resource(_attributes(text))


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
        resource=resource_from_json(row["resource_json"]),
        attributes=_attributes(row["attributes_json"]),
        status_code=int(row["status_code"]),
        status_message=row["status_message"] or "",
        trace_state=row["trace_state"] or "",
    )
