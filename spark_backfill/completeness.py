"""Completeness: traces where a server forwarded the message but the next server's trace
message never arrived (trace messages are at most once, DESIGN §1).

A forwarding egress span is the parent of the downstream server span it was linked to
(`nats_otel.core.linking`). So a forwarding egress (role `egress` with a hop id) whose span
id is nobody's parent in its trace is a missing hop: the downstream report never arrived,
or could not be linked to it (`messaging.nats.trace.link` on that server span says which). With the flag, such
egress spans get `messaging.nats.trace.downstream_missing = true`, every span of such a trace gets
`trace_incomplete = true` in the table, and optionally a placeholder server span for the
missing server is added under the egress, so the tree still reads right.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterator
from typing import Any

import orjson

from nats_otel.core.pipeline import Converted
from nats_otel.core.records import AttrValue, Resource, SpanKind, SpanRecord
from spark_backfill.transform import ENCODED_COLUMNS, SPAN_COLUMNS, arrow_batch, ddl, row_to_span, span_rows

__all__ = ["MISSING_ATTRIBUTE", "mark_incomplete", "placeholder_span"]

MISSING_ATTRIBUTE = "messaging.nats.trace.downstream_missing"
_ID_SCHEME = b"nats-otel-backfill-placeholder-v1"


def placeholder_span(egress: SpanRecord) -> SpanRecord:
    """A stand-in server span for the server `egress` forwarded to, which never reported.

    Its id hashes (versioned, length-prefixed) the egress span it hangs under, so re-runs
    agree. Zero duration at the moment the message left the upstream server.
    """
    hasher = hashlib.blake2b(digest_size=8)
    hasher.update(_ID_SCHEME)
    for part in (egress.trace_id, egress.span_id):
        hasher.update(len(part).to_bytes(4, "big") + part)
    span_id = hasher.digest() if any(hasher.digest()) else b"\x00" * 7 + b"\x01"
    peer = str(egress.attribute("messaging.nats.peer.server.name")
               or egress.attribute("messaging.nats.connection.name") or "")
    service = egress.resource.get("service.name") or "nats-server"
    subject = egress.attribute("messaging.destination.name")
    attributes: list[tuple[str, AttrValue]] = [
        ("messaging.system", "nats"),
        ("messaging.nats.trace.placeholder", True),
        ("messaging.nats.trace.hop", str(egress.attribute("messaging.nats.trace.hop") or "")),
        ("messaging.nats.connection.kind", str(egress.attribute("messaging.nats.connection.kind") or "")),
    ]
    if subject:
        attributes.append(("messaging.destination.name", str(subject)))
    return SpanRecord(
        trace_id=egress.trace_id,
        span_id=span_id,
        parent_span_id=egress.span_id,
        name=f"receive {subject} (no trace message)" if subject else "receive (no trace message)",
        kind=SpanKind.CONSUMER,
        start_ns=egress.end_ns,
        end_ns=egress.end_ns,
        resource=Resource((("service.name", service), ("messaging.nats.server.name", peer))),
        attributes=tuple(attributes),
        trace_state=egress.trace_state,
    )


def _placeholder_batches(batches: Iterator[Any], schema: str) -> Iterator[Any]:
    for batch in batches:
        rows = []
        for record in batch.to_pylist():
            span = placeholder_span(row_to_span(record))
            (row,) = span_rows(Converted([span]), record["source"])
            row["role"] = "placeholder"
            row["account"], row["subject"] = record["account"], record["subject"]
            row["trace_incomplete"] = True
            rows.append(row)
        yield arrow_batch(rows, schema)


def mark_incomplete(spans: Any, placeholders: bool = False) -> tuple[Any, Any]:
    """(spans with `trace_incomplete` and the missing-hop attribute, the missing egress rows)."""
    from pyspark.sql import functions as F

    parents = spans.select("trace_id", F.col("parent_span_id").alias("span_id")).distinct()
    forwards = spans.filter((F.col("role") == "egress") & (F.col("hop") != ""))
    missing = forwards.join(parents, ["trace_id", "span_id"], "left_anti")
    flagged = missing.select("trace_id", "span_id", F.lit(True).alias("_missing"))
    incomplete = missing.select("trace_id").distinct().withColumn("trace_incomplete", F.lit(True))
    marked = (
        spans.join(flagged, ["trace_id", "span_id"], "left")
        .join(incomplete, ["trace_id"], "left")
        .withColumn("trace_incomplete", F.coalesce("trace_incomplete", F.lit(False)))
        .withColumn(
            "attributes_json",
            F.when(
                F.col("_missing"),
                # The attribute list is a JSON array and never empty for an egress span.
                F.concat(
                    F.expr("substring(attributes_json, 1, length(attributes_json) - 1)"),
                    F.lit("," + orjson.dumps([MISSING_ATTRIBUTE, True]).decode() + "]"),
                ),
            ).otherwise(F.col("attributes_json")),
        )
        .withColumn(
            "attributes",
            F.when(
                F.col("_missing"), F.map_concat("attributes", F.create_map(F.lit(MISSING_ATTRIBUTE), F.lit("true")))
            ).otherwise(F.col("attributes")),
        )
        # The encoded span no longer says what the row says: the OTLP/JSON sink re-encodes it.
        .withColumn("otlp_span", F.when(F.col("_missing"), F.lit(None)).otherwise(F.col("otlp_span")))
        .select(*SPAN_COLUMNS, *ENCODED_COLUMNS, "trace_incomplete")
    )
    if placeholders:
        schema = ddl([*SPAN_COLUMNS, *ENCODED_COLUMNS, "trace_incomplete boolean"])
        fn = functools.partial(_placeholder_batches, schema=schema)
        extra = missing.select(*SPAN_COLUMNS).mapInArrow(fn, schema)
        marked = marked.unionByName(extra)
    return marked, missing
