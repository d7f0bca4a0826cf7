"""Report: hop latency per edge and errors, from the Parquet span table, as tables and a picture.

An edge is one observed forwarding: an upstream egress span (role `egress`, with a hop id)
and the downstream server span whose parent it is. Hop latency is the downstream ingress
time minus the upstream egress time (two servers' clocks: skew shows up here).
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spark_backfill.edges import Edge
from spark_backfill.network import render

__all__ = ["ErrorRow", "compute", "run_report", "write_tables"]


@dataclass(frozen=True, slots=True)
class ErrorRow:
    """Spans with status ERROR for one account and subject."""

    account: str
    subject: str
    count: int
    example: str


def compute(spans: Any) -> tuple[list[Edge], list[ErrorRow], dict[str, str]]:
    """Edges, errors, and each server's cluster, from a span table DataFrame."""
    from pyspark.sql import functions as F

    egress = spans.filter((F.col("role") == "egress") & (F.col("hop") != "")).select(
        "trace_id",
        F.col("span_id").alias("parent_span_id"),
        F.col("server_name").alias("source"),
        F.col("connection_kind").alias("kind"),
        F.col("end_ns").alias("sent_ns"),
    )
    servers = spans.filter((F.col("role") == "server") & (F.col("hop") != "")).select(
        "trace_id", "parent_span_id", F.col("server_name").alias("target"), F.col("start_ns").alias("received_ns")
    )
    hops = egress.join(servers, ["trace_id", "parent_span_id"]).withColumn(
        "latency_ms", (F.col("received_ns") - F.col("sent_ns")) / 1e6
    )
    stats = (
        hops.groupBy("source", "target", "kind")
        .agg(
            F.count("*").alias("count"),
            F.percentile_approx("latency_ms", [0.5, 0.9, 0.99], 10_000).alias("p"),
            F.max("latency_ms").alias("max_ms"),
        )
        .orderBy("source", "target", "kind")
        .collect()
    )
    edges = [
        Edge(r["source"], r["target"], r["kind"], r["count"], r["p"][0], r["p"][1], r["p"][2], r["max_ms"])
        for r in stats
    ]
    errors = [
        ErrorRow(r["account"], r["subject"], r["count"], r["example"])
        for r in spans.filter(F.col("status_code") == 2)
        .groupBy("account", "subject")
        .agg(F.count("*").alias("count"), F.min("status_message").alias("example"))
        .orderBy(F.desc("count"), "account", "subject")
        .collect()
    ]
    clusters = {
        r["server_name"]: r["cluster"] or ""
        for r in spans.filter(F.col("role") == "server").select("server_name", "cluster").distinct().collect()
    }
    return edges, errors, clusters


# --- tables ------------------------------------------------------------------------------

_EDGE_HEADER = ["source", "target", "kind", "count", "p50_ms", "p90_ms", "p99_ms", "max_ms"]
_ERROR_HEADER = ["account", "subject", "count", "example"]


def _edge_cells(e: Edge) -> list[str]:
    return [e.source, e.target, e.kind, str(e.count), *(f"{v:.3f}" for v in (e.p50_ms, e.p90_ms, e.p99_ms, e.max_ms))]


def _markdown(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def write_tables(out: Path, edges: Sequence[Edge], errors: Sequence[ErrorRow], picture: bool = True) -> None:
    """edges.csv, errors.csv and report.md (both tables, and the picture) in `out`."""
    edge_rows = [_edge_cells(e) for e in edges]
    error_rows = [[r.account, r.subject, str(r.count), r.example] for r in errors]
    for name, header, rows in (("edges.csv", _EDGE_HEADER, edge_rows), ("errors.csv", _ERROR_HEADER, error_rows)):
        with open(out / name, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(header)
            writer.writerows(rows)
    text = "# NATS message path report\n\n## Hop latency per edge (ms)\n\n" + _markdown(_EDGE_HEADER, edge_rows)
    text += "\n## Errors by account and subject\n\n" + _markdown(_ERROR_HEADER, error_rows)
    if picture:
        text = text.replace("\n\n## Hop latency", "\n\n![The observed network](network.svg)\n\n## Hop latency", 1)
    (out / "report.md").write_text(text)


def run_report(spark: Any, spans_dir: str, out_dir: str, picture: bool = True) -> tuple[list[Edge], list[ErrorRow]]:
    """Read the Parquet span table; write edges.csv, errors.csv, report.md and (with
    `picture`) network.svg, network.png and network.dot into `out_dir`."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    edges, errors, clusters = compute(spark.read.parquet(spans_dir))
    write_tables(out, edges, errors, picture)
    if picture:
        render(edges, clusters, out)
    return edges, errors
