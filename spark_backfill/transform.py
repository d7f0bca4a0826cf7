"""Transform: keyed records -> span rows, by the nats_otel core running in the executors.

Which upstream egress a downstream server span hangs under is decided from the reports
of the same trace context (`nats_otel.core.linking`: hop id, server names, time, size),
so the records are grouped by trace context before they are converted:

1. `keys.key_lines` reads and decodes each record once, for its context key, its report
   (server, seq, time) and its raw message as columns; rejects are decided there. The
   keyed records are persisted: the grouping reads them once the runs are known;
2. the runs say which reports of each server the whole input holds (crowded hops are
   linked only where no report was lost, and one context alone would see every other
   context's reports as lost): each key pass task's runs, merged by an accumulator
   (`runs.islands`), or under Spark Connect a job of their own (`runs.report_runs`);
3. the keyed records (raw message, context key, report: what the conversion needs, no
   more) are partitioned by context key and sorted within partitions, so each context's
   records are contiguous in one partition;
4. `_convert_groups` runs `convert_batch` - the very function of `nats-otel convert` - on
   each context's records, with the whole input's runs: the same spans, byte for byte, in
   any input order.

A context's records meet in one executor: a traceparent reused by millions of messages
is one group (its memory: ~1.5 KB per trace message while it converts).

Batches are Arrow record batches built from column lists (`mapInArrow`), `batch_rows`
rows each: no pandas, no per-row dicts, and only the columns the sinks read
(`LEAN_COLUMNS` when the OTLP/JSON files are all that is written). Each span's OTLP/JSON
is encoded here, while its `SpanRecord` exists (see `fragments`). Everything handed to
Spark is a module-level function bound with picklable arguments (`functools.partial`),
never a client or a session.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import orjson

from nats_otel.core.engine import convert_batch
from nats_otel.core.pipeline import Converted, Rejected
from nats_otel.core.records import AttrValue, Resource, SpanKind, SpanRecord
from spark_backfill import runs
from spark_backfill.fragments import span_pieces
from spark_backfill.keys import ConvertSettings, key_lines, raw_message

__all__ = [
    "ENCODED_COLUMNS",
    "LEAN_COLUMNS",
    "REJECT_COLUMNS",
    "ROW_COLUMNS",
    "SPAN_COLUMNS",
    "ContextGroup",
    "ConvertSettings",
    "Keyed",
    "arrow_batch",
    "ddl",
    "input_partitions",
    "keyed",
    "resource_from_json",
    "row_to_span",
    "span_rows",
    "span_rows_of",
]

# One row per span.
ROW_SCHEMA = (
    "trace_id string, span_id string, parent_span_id string, name string, kind int, "
    "start_ns long, end_ns long, status_code int, status_message string, trace_state string, "
    "role string, server_name string, server_id string, cluster string, account string, subject string, "
    "hop string, connection_kind string, peer string, "
    "attributes map<string,string>, resource_attributes map<string,string>, "
    "attributes_json string, resource_json string, issues array<string>, source string, "
    "otlp_resource string, otlp_span string, "
    "reason string, detail string, record string"
)
_TYPES = dict(part.strip().split(" ", 1) for part in ROW_SCHEMA.split(", "))
# Each span's resource and span as OTLP/JSON text: what the OTLP/JSON sink splices.
ENCODED_COLUMNS = ["otlp_resource", "otlp_span"]
# The rejected records (`keys`): why, and the record.
REJECT_COLUMNS = ["reason", "detail", "subject", "source", "record"]
# The columns of the Parquet span table (and what `row_to_span` needs).
SPAN_COLUMNS = [c for c in _TYPES if c not in (*ENCODED_COLUMNS, "reason", "detail", "record")]
# Every column a span row can have.
ROW_COLUMNS = [*SPAN_COLUMNS, *ENCODED_COLUMNS]
# What the OTLP/JSON sink and the counts read: a run that writes only OTLP/JSON (and the
# rejects) builds no more (the maps and JSON of the span table were most of a batch's cost).
LEAN_COLUMNS = ["trace_id", "span_id", "start_ns", "end_ns", "role", "resource_json", "issues", *ENCODED_COLUMNS]


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


class _Columns:
    """Span rows as one list per column, `columns` of ROW_COLUMNS filled (others left out)."""

    __slots__ = ("cols", "full", "names", "rows")

    def __init__(self, columns: Sequence[str]) -> None:
        self.names = list(columns)
        self.full = any(c not in LEAN_COLUMNS for c in self.names)
        self.cols: dict[str, list[Any]] = {c: [] for c in (ROW_COLUMNS if self.full else LEAN_COLUMNS)}
        self.rows = 0

    def add(self, converted: Converted, source: str) -> None:
        """The rows of one converted trace message: server span first, then its event spans."""
        cols, spans = self.cols, converted.spans
        pieces = span_pieces(spans)
        resource_texts: dict[Resource, str] = {}
        for index, span in enumerate(spans):
            resource = span.resource
            resource_json = resource_texts.get(resource)
            if resource_json is None:
                resource_json = resource_texts[resource] = orjson.dumps(resource.attributes).decode()
            cols["trace_id"].append(span.trace_id.hex())
            cols["span_id"].append(span.span_id.hex())
            cols["start_ns"].append(span.start_ns)
            cols["end_ns"].append(span.end_ns)
            cols["role"].append(_role(index, span))
            cols["resource_json"].append(resource_json)
            cols["issues"].append(list(converted.issues) if index == 0 else [])
            cols["otlp_resource"].append(pieces[index][0])
            cols["otlp_span"].append(pieces[index][1])
        self.rows += len(spans)
        if self.full:
            self._add_table(converted, source)

    def _add_table(self, converted: Converted, source: str) -> None:
        """The span table's other columns (Parquet, completeness, export)."""
        cols = self.cols
        server = converted.spans[0]
        server_account = _text(server.attribute("messaging.nats.account"))
        server_subject = _text(server.attribute("messaging.destination.name"))
        for span in converted.spans:
            resource = span.resource
            account = span.attribute("messaging.nats.account")
            subject = span.attribute("messaging.destination.name")
            for name, value in (
                ("parent_span_id", span.parent_span_id.hex()), ("name", span.name), ("kind", span.kind),
                ("status_code", span.status_code), ("status_message", span.status_message),
                ("trace_state", span.trace_state),
                ("server_name", _text(resource.get("messaging.nats.server.name"))),
                ("server_id", _text(resource.get("service.instance.id"))),
                ("cluster", _text(resource.get("messaging.nats.server.cluster"))),
                ("account", server_account if account is None else _text(account)),
                ("subject", server_subject if subject is None else _text(subject)),
                ("hop", _text(span.attribute("messaging.nats.trace.hop"))),
                ("connection_kind", _text(span.attribute("messaging.nats.connection.kind"))),
                ("peer", _text(span.attribute("messaging.nats.connection.name"))),
                ("attributes", _string_map(span.attributes)),
                ("resource_attributes", _string_map(resource.attributes)),
                # Lossless (bool/int/float/array kept apart): what `row_to_span` rebuilds from.
                ("attributes_json", orjson.dumps(span.attributes).decode()),
                ("source", source),
            ):
                cols[name].append(value)

    def batch(self) -> Any:
        """The rows so far as one Arrow batch (of `columns`), and a fresh start."""
        import pyarrow as pa

        schema = _arrow_schema(ddl(self.names))
        batch = pa.RecordBatch.from_arrays([pa.array(self.cols[f.name], type=f.type) for f in schema], schema=schema)
        for values in self.cols.values():
            values.clear()
        self.rows = 0
        return batch


def span_rows(converted: Converted, source: str) -> list[dict[str, Any]]:
    """The rows of one converted trace message (every column): server span first."""
    columns = _Columns(ROW_COLUMNS)
    columns.add(converted, source)
    names = list(columns.cols)
    return [dict(zip(names, values, strict=True)) for values in zip(*columns.cols.values(), strict=True)]


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


# What the conversion reads of the keyed records.
_GROUP_COLUMNS = ["subject", "headers", "payload", "source", "ctx_key", "server_id", "seq"]


class ContextGroup:
    """The keyed records of one trace context, as they come (sorted by context key), and
    their conversion: `convert_batch` with the runs of the whole input that hold its reports."""

    __slots__ = ("raws", "reports", "sources")

    def __init__(self) -> None:
        self.raws: list[Any] = []
        self.sources: list[str] = []
        self.reports: list[tuple[str, int]] = []

    def add(self, subject: str | None, headers: str | None, payload: bytes, source: str, server_id: str | None,
            seq: int | None) -> None:
        self.raws.append(raw_message(subject, headers, payload))
        self.sources.append(source)
        if seq is not None:
            self.reports.append((server_id, seq + runs.SHIFT))  # type: ignore[arg-type]  # numbered: an id

    def convert(self, settings: ConvertSettings, run_index: runs.RunIndex | None) -> list[tuple[str, Converted]]:
        """(source, spans) of each record; empties the group."""
        report_runs = None if run_index is None else run_index.covering(self.reports)
        results = convert_batch(self.raws, settings.options, settings.limits, report_runs=report_runs)
        out = []
        for source, result in zip(self.sources, results, strict=True):
            if isinstance(result, Rejected):  # the key pass decoded it with the same limits
                raise RuntimeError(f"{source}: rejected by the conversion, not by the key pass: {result.reason}")
            out.append((source, result))
        self.raws, self.sources, self.reports = [], [], []
        return out


def _convert_groups(batches: Iterable[Any], settings: ConvertSettings, run_index: runs.RunIndex | None = None,
                    columns: Sequence[str] = tuple(ROW_COLUMNS)) -> Iterator[Any]:
    """Span rows of a partition of keyed records sorted by context key: each stretch of one
    key is converted together (it may span Arrow batches, so the current one is carried
    over), with the runs of the whole input that hold its reports; yielded `batch_rows`
    rows at a time."""
    out = _Columns(columns)
    group = ContextGroup()
    key: bytes | None = None
    for batch in batches:
        for subject, headers, payload, source, ctx_key, server_id, seq in zip(
                *(batch.column(c).to_pylist() for c in _GROUP_COLUMNS), strict=True):
            if ctx_key != key and group.raws:
                for converted_source, converted in group.convert(settings, run_index):
                    out.add(converted, converted_source)
                if out.rows >= settings.batch_rows:
                    yield out.batch()
            key = ctx_key
            group.add(subject, headers, payload, source, server_id, seq)
    for converted_source, converted in group.convert(settings, run_index):
        out.add(converted, converted_source)
    if out.rows:
        yield out.batch()


class Keyed(NamedTuple):
    """The keyed records of the whole input (persisted: the caller unpersists them) and the
    runs of its reports."""

    records: Any
    run_index: runs.RunIndex

    def rejects(self) -> Any:
        """The rejected records (REJECT_COLUMNS)."""
        from pyspark.sql import functions as F

        return self.records.where(F.col("reject_reason").isNotNull()).select(
            F.col("reject_reason").alias("reason"), F.col("reject_detail").alias("detail"), "subject", "source",
            "record")


def keyed(frames: Sequence[Any], settings: ConvertSettings, persist: Any = None, tally: Any = None) -> Keyed:
    """Every record of `frames` (each archive lines, or messages: `keys.key_lines`) keyed,
    and the whole input's report runs. `tally`: an accumulator of `keys.KeyTally` (complete
    once this returns), which also brings the runs back from the key pass's tasks; None
    (Spark Connect: no accumulators) works the runs out in Spark (`runs.report_runs`).

    The keyed records are persisted (`persist`, a StorageLevel; default memory and disk):
    the grouping reads them once the runs are known, each record decoded once for both.
    """
    from pyspark import StorageLevel

    records = functools.reduce(lambda a, b: a.unionByName(b), [key_lines(frame, settings, tally) for frame in frames])
    records = records.persist(persist or StorageLevel.MEMORY_AND_DISK)
    if tally is None:
        return Keyed(records, runs.RunIndex(runs.report_runs(records.select("server_id", "seq", "ts_ns"))))
    records.count()  # the key pass, its records persisted as it goes; the tasks' runs in the tally
    return Keyed(records, runs.RunIndex(tally.value["runs"]))


def input_partitions(df: Any) -> int | None:
    """As many groups as input splits (the input's size decides); None under Spark Connect,
    which has no RDDs to ask: there the shuffle partitions decide, coalesced by AQE."""
    from spark_backfill.session import is_remote

    if is_remote(df.sparkSession):
        return None
    return df.rdd.getNumPartitions() or 1


def span_rows_of(keyed: Keyed, settings: ConvertSettings, persist: Any = None,
                 columns: Sequence[str] = tuple(ROW_COLUMNS)) -> Any:
    """Span rows (`columns` of ROW_COLUMNS) of the good keyed records, persisted (`persist`,
    default memory and disk): the counts and every sink read them instead of mapping again
    (and range partitioning samples them). The caller unpersists them."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    good = keyed.records.where(F.col("reject_reason").isNull()).select(*_GROUP_COLUMNS)
    partitions = input_partitions(keyed.records)
    grouped = (good.repartition(partitions, "ctx_key") if partitions else good.repartition("ctx_key")
               ).sortWithinPartitions("ctx_key")
    rows = grouped.mapInArrow(
        functools.partial(_convert_groups, settings=settings, run_index=keyed.run_index, columns=tuple(columns)),
        ddl(columns))
    return rows.persist(persist or StorageLevel.MEMORY_AND_DISK)


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
