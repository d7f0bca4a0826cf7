"""Transform: archive lines -> span rows, by the nats_otel core running in the executors.

Which upstream egress a downstream server span hangs under is decided from the reports
of the same trace context (`nats_otel.core.linking`: hop id, server names, time, size),
so the records are grouped by trace context before they are converted:

1. `_key_batches` decodes each record for its context key (trace id + parent span id, or
   the ad-hoc group; rejects get the empty key) and its report's server, seq and time;
2. `runs.report_runs` works out which reports of each server the whole input holds (a
   pass of its own: crowded hops are linked only where no report was lost, and one
   context alone would see every other context's reports as lost);
3. the lines are partitioned by context key and sorted within partitions, so each
   context's records are contiguous in one partition;
4. `_convert_groups` runs `convert_batch` - the very function of `nats-otel convert` - on
   each context's records, with the whole input's runs: the same spans, byte for byte, in
   any input order.

A context's records meet in one executor: a traceparent reused by millions of messages
is one group (its memory: ~1.5 KB per trace message while it converts).

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
from nats_otel.core.engine import convert_batch, prepare
from nats_otel.core.mapping import MappingOptions
from nats_otel.core.pipeline import Converted, Rejected
from nats_otel.core.records import AttrValue, Resource, SpanKind, SpanRecord
from spark_backfill import runs
from spark_backfill.fragments import span_pieces

__all__ = [
    "ENCODED_COLUMNS",
    "KEYED_SCHEMA",
    "ROW_SCHEMA",
    "SPAN_COLUMNS",
    "Conversion",
    "ConvertSettings",
    "arrow_batch",
    "convert",
    "convert_lines",
    "ddl",
    "key_lines",
    "resource_from_json",
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
    "reject_reason string, reject_detail string, record string"
)
_TYPES = dict(part.strip().split(" ", 1) for part in ROW_SCHEMA.split(", "))
_COLUMNS = list(_TYPES)
_INTERNAL = ("row_type", "otlp_resource", "otlp_span", "reject_reason", "reject_detail", "record")
# The columns of the Parquet span table (and what `row_to_span` needs).
SPAN_COLUMNS = [c for c in _COLUMNS if c not in _INTERNAL]
# Each span's resource and span as OTLP/JSON text: what the OTLP/JSON sink splices.
ENCODED_COLUMNS = ["otlp_resource", "otlp_span"]


@dataclass(frozen=True, slots=True)
class ConvertSettings:
    """What the executors need to convert: shipped to them, so plain and picklable."""

    options: MappingOptions = field(default_factory=MappingOptions)
    limits: DecodeLimits = field(default_factory=DecodeLimits)


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
    server_account = _text(server.attribute("messaging.nats.account"))
    server_subject = _text(server.attribute("messaging.destination.name"))
    pieces = span_pieces(converted.spans)
    resource_texts: dict[Resource, tuple[list[tuple[str, str]], str]] = {}
    rows = []
    for index, span in enumerate(converted.spans):
        resource = span.resource
        if resource not in resource_texts:
            resource_texts[resource] = (_string_map(resource.attributes), orjson.dumps(resource.attributes).decode())
        resource_map, resource_json = resource_texts[resource]
        account = span.attribute("messaging.nats.account")
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
                "server_name": _text(resource.get("messaging.nats.server.name")),
                "server_id": _text(resource.get("service.instance.id")),
                "cluster": _text(resource.get("messaging.nats.server.cluster")),
                "account": server_account if account is None else _text(account),
                "subject": server_subject if subject is None else _text(subject),
                "hop": _text(span.attribute("messaging.nats.trace.hop")),
                "connection_kind": _text(span.attribute("messaging.nats.connection.kind")),
                "peer": _text(span.attribute("messaging.nats.connection.name")),
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


def convert_lines(lines: Sequence[str], sources: Sequence[str], settings: ConvertSettings,
                  report_runs: runs.Runs | None = None) -> list[dict[str, Any]]:
    """Rows of the archive lines of one trace context (or of any lines, linked among
    themselves); `report_runs`: the whole input's, when the lines are part of it. Pure: the
    same lines give the same rows, in any order."""
    raws: list[Any] = []
    for line in lines:
        try:
            raws.append(parse_archive_line(line))
        except DecodeError as exc:
            raws.append(Rejected(exc.reason, exc.detail))
    rows: list[dict[str, Any]] = []
    results = convert_batch(raws, settings.options, settings.limits, report_runs=report_runs)
    for line, source, result in zip(lines, sources, results, strict=True):
        if isinstance(result, Rejected):
            rows.append(reject_row(result, source, line))
        else:
            rows.extend(span_rows(result, source))
    return rows


class LineKey(NamedTuple):
    """What the grouping and the report runs need of a record."""

    ctx_key: bytes
    server_id: str | None
    seq: int | None
    ts_ns: int | None


def line_key(line: str, settings: ConvertSettings) -> LineKey:
    """A record's trace context (b"" for a record that gives no spans) and its report's
    server id, seq (None when not numbered: seq 0) and ingress time, as the linker's
    ledger observes them."""
    try:
        prepared = prepare(parse_archive_line(line), settings.limits)
    except DecodeError:
        return LineKey(b"", None, None, None)
    msg = prepared.msg
    if msg.server.seq <= 0:
        return LineKey(prepared.ctx.id_fields, None, None, None)
    return LineKey(prepared.ctx.id_fields, msg.server.id, msg.server.seq, msg.ingress.ts_ns)


def context_key(line: str, settings: ConvertSettings) -> bytes:
    """The trace context a record belongs to (b"" for a record that gives no spans)."""
    return line_key(line, settings).ctx_key


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


KEYED_SCHEMA = "value string, source string, ctx_key binary, server_id string, seq long, ts_ns long"


def _key_batches(batches: Iterable[Any], settings: ConvertSettings) -> Iterator[Any]:
    import pyarrow as pa

    for batch in batches:
        keys = [line_key(v, settings) for v in batch.column("value").to_pylist()]
        # uint64 seqs and times, shifted into Spark's signed long (`runs.SHIFT`).
        yield pa.RecordBatch.from_arrays(
            [batch.column("value"), batch.column("source"), pa.array([k.ctx_key for k in keys], type=pa.binary()),
             pa.array([k.server_id for k in keys], type=pa.string()),
             pa.array([None if k.seq is None else k.seq - runs.SHIFT for k in keys], type=pa.int64()),
             pa.array([None if k.ts_ns is None else k.ts_ns - runs.SHIFT for k in keys], type=pa.int64())],
            names=["value", "source", "ctx_key", "server_id", "seq", "ts_ns"])


def key_lines(lines_df: Any, settings: ConvertSettings) -> Any:
    """`lines_df` (`value`, `source`) with each record's context key and report (KEYED_SCHEMA)."""
    return lines_df.mapInArrow(functools.partial(_key_batches, settings=settings), KEYED_SCHEMA)


def _convert_groups(batches: Iterable[Any], settings: ConvertSettings,
                    run_index: runs.RunIndex | None = None) -> Iterator[Any]:
    """Rows of a partition sorted by context key: each stretch of one key is converted
    together (it may span Arrow batches, so the current one is carried over), with the runs
    of the whole input that hold its reports (`server_id`, `seq` columns)."""
    key: bytes | None = None
    lines: list[str] = []
    sources: list[str] = []
    reports: list[tuple[str, int]] = []

    def converted() -> Any:
        report_runs = None if run_index is None else run_index.covering(reports)
        return arrow_batch(convert_lines(lines, sources, settings, report_runs), ROW_SCHEMA)

    for batch in batches:
        columns = batch.to_pydict()
        for value, source, ctx_key, server_id, seq in zip(columns["value"], columns["source"], columns["ctx_key"],
                                                          columns["server_id"], columns["seq"], strict=True):
            if ctx_key != key and lines:
                yield converted()
                lines, sources, reports = [], [], []
            key = ctx_key
            lines.append(value)
            sources.append(source)
            if seq is not None:
                reports.append((server_id, seq + runs.SHIFT))
    if lines:
        yield converted()


def _input_partitions(df: Any) -> int | None:
    """As many groups as input splits (the input's size decides); None under Spark Connect,
    which has no RDDs to ask: there the shuffle partitions decide, coalesced by AQE."""
    from spark_backfill.session import is_remote

    if is_remote(df.sparkSession):
        return None
    return df.rdd.getNumPartitions() or 1


class Conversion(NamedTuple):
    """What `convert` gives: the rows and the persisted frame (the caller unpersists it)."""

    rows: Any
    persisted: Any


def convert(lines_df: Any, settings: ConvertSettings, persist: Any = None) -> Conversion:
    """Rows (ROW_SCHEMA) of every record of `lines_df` (columns `value`, `source`).

    The whole input's report runs are worked out first (a job: every record is read and
    decoded for them, then again to be converted) and go to every context's conversion.
    The mapping is persisted with `persist` (a StorageLevel; default memory and disk): the
    counts and every sink read it instead of mapping again (and range partitioning samples
    it). The caller unpersists it when done.
    """
    from pyspark import StorageLevel

    keyed = key_lines(lines_df, settings)
    run_index = runs.RunIndex(runs.report_runs(keyed.select("server_id", "seq", "ts_ns")))
    keyed = keyed.select("value", "source", "ctx_key", "server_id", "seq")
    partitions = _input_partitions(keyed)
    grouped = (keyed.repartition(partitions, "ctx_key") if partitions else keyed.repartition("ctx_key")
               ).sortWithinPartitions("ctx_key")
    rows = grouped.mapInArrow(functools.partial(_convert_groups, settings=settings, run_index=run_index),
                             ROW_SCHEMA)
    rows = rows.persist(persist or StorageLevel.MEMORY_AND_DISK)
    return Conversion(rows, rows)


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
