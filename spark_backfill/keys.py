"""The key pass: each record read and decoded once, for what the grouping and the runs need.

Input is either archive lines (`value`, `source`: files, Parquet) or stored messages
(`subject`, `headers` name -> values, `data`, `source`: the `nats-jetstream` data source).
Each record becomes one row of KEYED_SCHEMA:

- the raw message as columns (`subject`, `headers` as JSON, `payload`): the conversion
  pass builds its `RawTraceMessage` from them, with no archive JSON or base64 to undo again;
- its trace context (`ctx_key`, what the records are grouped by), the trace its spans are
  in when the context says (`trace_key`: a traceparent's trace id; null for ad-hoc
  contexts) and its report (server id, seq, ingress time: `runs.report_runs`);
- or, for a record that gives no spans, why (`reject_reason`, `reject_detail`) and the
  record itself (its first `RECORD_EXCERPT` characters): the rejects are known here, and
  never reach the conversion.

Columns are built as lists per batch, never a dict per row.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import orjson

from nats_otel.archive import archive_record
from nats_otel.core.decode import DecodeError, DecodeLimits, RawTraceMessage, parse_archive_line
from nats_otel.core.engine import prepare
from nats_otel.core.mapping import MappingOptions
from spark_backfill import runs
from spark_backfill.splits import Split, read_lines

__all__ = ["KEYED_SCHEMA", "RECORD_EXCERPT", "ConvertSettings", "KeyTally", "LineKey", "LocalArchive", "key_lines",
           "line_key", "raw_message"]

# A record is kept in the rejects as at most this much of its archive line.
RECORD_EXCERPT = 2000

KEYED_SCHEMA = ("subject string, headers string, payload binary, source string, ctx_key binary, trace_key binary, "
                "server_id string, seq long, ts_ns long, reject_reason string, reject_detail string, record string")
_NAMES = [part.split(" ")[0] for part in KEYED_SCHEMA.split(", ")]


@dataclass(frozen=True, slots=True)
class ConvertSettings:
    """What the executors need to convert: shipped to them, so plain and picklable.

    `batch_rows`: rows per Arrow batch the passes yield (bench/backfill_profile.py: a batch
    per trace context, as before, cost more than the conversion itself)."""

    options: MappingOptions = field(default_factory=MappingOptions)
    limits: DecodeLimits = field(default_factory=DecodeLimits)
    batch_rows: int = 4096


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
    if msg.seq <= 0:
        return LineKey(prepared.ctx.id_fields, None, None, None)
    return LineKey(prepared.ctx.id_fields, msg.server.id, msg.seq, msg.ingress.ts_ns)


def raw_message(subject: str | None, headers: str | None, payload: bytes) -> RawTraceMessage:
    """The RawTraceMessage of a keyed row's columns."""
    return RawTraceMessage(subject, orjson.loads(headers) if headers else {}, payload)


# A record read: its raw message or None, its archive line or None, why it is no message.
_Raw = tuple[RawTraceMessage | None, str | bytes | None, DecodeError | None]


def _raws(batch: Any) -> Iterator[_Raw]:
    """(raw message or None, archive line or None, why it is no message) per row of an input batch."""
    names = batch.schema.names
    if "value" in names:
        yield from _line_raws(batch.column("value").to_pylist())
        return
    for subject, headers, data in zip(batch.column("subject").to_pylist(), batch.column("headers").to_pylist(),
                                      batch.column("data").to_pylist(), strict=True):
        yield RawTraceMessage(subject, dict(headers or ()), data or b""), None, None


def _line_raws(lines: Iterable[str | bytes]) -> Iterator[_Raw]:
    for line in lines:
        try:
            yield parse_archive_line(line), line, None
        except DecodeError as exc:
            yield None, line, exc


class LocalArchive(NamedTuple):
    """Local archive files, read by the key pass's tasks themselves (`splits`): `ids` a
    DataFrame of one row per task (`id`), `tasks` the splits each reads."""

    ids: Any
    tasks: list[list[Split]]


def _frame_chunks(batches: Iterable[Any]) -> Iterator[tuple[Iterator[_Raw], Any]]:
    """(raws, their `source` column) per batch of an input DataFrame."""
    for batch in batches:
        yield _raws(batch), batch.column("source")


def _split_chunks(batches: Iterable[Any], tasks: list[list[Split]], rows: int) -> Iterator[tuple[Iterator[_Raw], Any]]:
    """(raws, their sources) per `rows` lines of the splits of the tasks named by `batches`' ids."""
    for batch in batches:
        for task in batch.column("id").to_pylist():
            for split in tasks[task]:
                source = split.source
                for lines in read_lines(split, rows):
                    yield _line_raws(lines), [source] * len(lines)


class KeyTally:
    """Rejects by reason, good payload bytes and the report runs (`runs.islands`), added up
    over the key pass's tasks (an AccumulatorParam): what a run needs before converting,
    with no job of its own. A retried task counts its rejects and bytes twice (the rejects
    output itself is exact); its runs add nothing new."""

    @staticmethod
    def zero(value: dict[str, Any]) -> dict[str, Any]:
        return {"rejects": {}, "payload": 0, "runs": {}}

    @staticmethod
    def addInPlace(total: dict[str, Any], more: dict[str, Any]) -> dict[str, Any]:  # noqa: N802 - Spark's name
        total["payload"] += more["payload"]
        for reason, n in more["rejects"].items():
            total["rejects"][reason] = total["rejects"].get(reason, 0) + n
        runs.merge(total["runs"], more["runs"])
        return total


# Reports a task holds before working their runs out (`runs.islands`): a task's memory for
# the runs stays that, plus its runs, however large its share of the input.
_REPORTS_HELD = 1 << 16


def _key_batches(chunks: Iterable[tuple[Iterator[_Raw], Any]], settings: ConvertSettings,
                 tally: Any = None) -> Iterator[Any]:
    """KEYED_SCHEMA batches of (raws, their sources) chunks."""
    import pyarrow as pa

    limits = settings.limits
    counts = KeyTally.zero({})
    reports: list[tuple[str, int, int]] = []
    for raws, sources in chunks:
        cols: dict[str, list[Any]] = {name: [] for name in _NAMES}
        subject, headers, payload, ctx_key = cols["subject"], cols["headers"], cols["payload"], cols["ctx_key"]
        trace_key = cols["trace_key"]
        server_id, seq, ts_ns = cols["server_id"], cols["seq"], cols["ts_ns"]
        reason, detail, record = cols["reject_reason"], cols["reject_detail"], cols["record"]
        for raw, line, failed in raws:
            prepared = None
            if raw is not None:
                try:
                    prepared = prepare(raw, limits)
                except DecodeError as exc:
                    failed = exc
            if raw is None or prepared is None:
                # The record as the rejects show it: its archive line, or one made for it.
                if line is None:
                    line = archive_record(raw)  # type: ignore[arg-type]
                text = line.decode("utf-8", "replace") if isinstance(line, bytes) else line
                for column in (payload, ctx_key, trace_key, server_id, seq, ts_ns, headers):
                    column.append(None)
                subject.append(raw.subject if raw is not None else None)
                why = failed.reason  # type: ignore[union-attr]  # set whenever there is no prepared message
                reason.append(why)
                counts["rejects"][why] = counts["rejects"].get(why, 0) + 1
                detail.append(failed.detail)  # type: ignore[union-attr]
                record.append(text.rstrip("\n")[:RECORD_EXCERPT])
                continue
            msg = prepared.msg
            subject.append(raw.subject)
            headers.append(orjson.dumps(raw.headers).decode() if raw.headers else None)
            payload.append(raw.payload)
            counts["payload"] += len(raw.payload)
            ctx = prepared.ctx
            ctx_key.append(ctx.id_fields)
            # Every span of a traceparent's context is in its trace; an ad-hoc context's
            # traces are known once linked (`traces`).
            trace_key.append(ctx.trace_id if ctx.adhoc_key is None else None)
            numbered = msg.seq > 0
            if numbered:
                reports.append((msg.server.id, msg.seq, msg.ingress.ts_ns))
                if len(reports) >= _REPORTS_HELD:
                    runs.merge(counts["runs"], runs.islands(reports))
                    reports.clear()
            server_id.append(msg.server.id if numbered else None)
            # uint64 seqs and times, shifted into Spark's signed long (`runs.SHIFT`).
            seq.append(msg.seq - runs.SHIFT if numbered else None)
            ts_ns.append(msg.ingress.ts_ns - runs.SHIFT if numbered else None)
            reason.append(None)
            detail.append(None)
            record.append(None)
        cols["source"] = sources
        yield pa.RecordBatch.from_pydict(cols, schema=_arrow_schema())
    runs.merge(counts["runs"], runs.islands(reports))
    if tally is not None:
        tally.add(counts)


@functools.cache
def _arrow_schema() -> Any:
    import pyarrow as pa

    types = {"string": pa.string(), "binary": pa.binary(), "long": pa.int64()}
    return pa.schema([pa.field(*part.split(" ")[:1], types[part.split(" ")[1]]) for part in KEYED_SCHEMA.split(", ")])


def _key_frame(batches: Iterable[Any], settings: ConvertSettings, tally: Any = None) -> Iterator[Any]:
    """The key pass over an input DataFrame's batches."""
    return _key_batches(_frame_chunks(batches), settings, tally)


def _key_local(batches: Iterable[Any], tasks: list[list[Split]], settings: ConvertSettings,
               tally: Any = None) -> Iterator[Any]:
    """The key pass over the splits of the tasks named by `batches`' ids."""
    return _key_batches(_split_chunks(batches, tasks, settings.batch_rows), settings, tally)


def key_lines(frame: Any, settings: ConvertSettings, tally: Any = None) -> Any:
    """`frame` keyed (KEYED_SCHEMA): a `LocalArchive`, or a DataFrame of archive lines
    (`value`, `source`) or of messages (`subject`, `headers`, `data`, `source`); `tally`: an
    accumulator of `KeyTally`, or None."""
    if isinstance(frame, LocalArchive):
        return frame.ids.mapInArrow(functools.partial(_key_local, tasks=frame.tasks, settings=settings, tally=tally),
                                    KEYED_SCHEMA)
    columns = ["value", "source"] if "value" in frame.columns else ["subject", "headers", "data", "source"]
    return frame.select(*columns).mapInArrow(functools.partial(_key_frame, settings=settings, tally=tally),
                                             KEYED_SCHEMA)
