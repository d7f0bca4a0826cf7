"""Report: hop latency per edge and errors, from the Parquet span table, as tables and an SVG.

An edge is one observed forwarding: an upstream egress span (role `egress`, with a hop id)
and the downstream server span whose parent it is. Hop latency is the downstream ingress
time minus the upstream egress time (two servers' clocks: skew shows up here).
"""

from __future__ import annotations

import csv
import html
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Edge", "ErrorRow", "compute", "edges_svg", "run_report", "write_tables"]

_KIND_COLOURS = {"router": "#1f77b4", "gateway": "#d62728", "leaf": "#2ca02c"}


@dataclass(frozen=True, slots=True)
class Edge:
    """Forwardings from one server to another over one connection kind."""

    source: str
    target: str
    kind: str
    count: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float


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


def write_tables(out: Path, edges: Sequence[Edge], errors: Sequence[ErrorRow]) -> None:
    """edges.csv, errors.csv and report.md (both tables) in `out`."""
    edge_rows = [_edge_cells(e) for e in edges]
    error_rows = [[r.account, r.subject, str(r.count), r.example] for r in errors]
    for name, header, rows in (("edges.csv", _EDGE_HEADER, edge_rows), ("errors.csv", _ERROR_HEADER, error_rows)):
        with open(out / name, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(header)
            writer.writerows(rows)
    text = "# NATS message path report\n\n## Hop latency per edge (ms)\n\n" + _markdown(_EDGE_HEADER, edge_rows)
    text += "\n## Errors by account and subject\n\n" + _markdown(_ERROR_HEADER, error_rows)
    text += "\n![network](network.svg)\n"
    (out / "report.md").write_text(text)


# --- picture -----------------------------------------------------------------------------


def _layout(names: Sequence[str], clusters: dict[str, str], size: float) -> dict[str, tuple[float, float]]:
    """Servers on a circle, members of a cluster next to each other."""
    ordered = sorted(names, key=lambda n: (clusters.get(n, ""), n))
    centre, radius = size / 2, size / 2 - 110
    if len(ordered) == 1:
        return {ordered[0]: (centre, centre)}
    return {
        name: (centre + radius * math.cos(2 * math.pi * i / len(ordered) - math.pi / 2),
               centre + radius * math.sin(2 * math.pi * i / len(ordered) - math.pi / 2))
        for i, name in enumerate(ordered)
    }  # fmt: skip


def edges_svg(edges: Sequence[Edge], clusters: dict[str, str], size: int = 720) -> str:
    """The observed network: servers as nodes, edges labelled with count and p50/p99 latency."""
    names = sorted({e.source for e in edges} | {e.target for e in edges} | set(clusters))
    pos = _layout(names, clusters, size)
    esc = html.escape
    parts = [
        (f'<svg xmlns="http://www.w3.org/2000/svg" width="{size}" height="{size + 40}" '
         f'viewBox="0 0 {size} {size + 40}" font-family="sans-serif" font-size="11">'),
        '<rect width="100%" height="100%" fill="white"/>',
        "<defs>"
        + "".join(
            f'<marker id="arrow-{k}" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" '
            f'orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" fill="{c}"/></marker>'
            for k, c in {**_KIND_COLOURS, "other": "#777"}.items()
        )
        + "</defs>",
        ('<text x="10" y="20" font-size="14" font-weight="bold">Observed NATS network: hop latency '
         "(p50 / p99 ms, count)</text>"),
    ]
    node_r = 34
    for e in edges:
        (x1, y1), (x2, y2) = pos[e.source], pos[e.target]
        dx, dy = x2 - x1, y2 - y1
        length = math.hypot(dx, dy) or 1.0
        ux, uy = dx / length, dy / length
        # Offset sideways so A->B and B->A do not draw on top of each other.
        ox, oy = -uy * 7, ux * 7
        sx, sy = x1 + ux * node_r + ox, y1 + uy * node_r + oy
        tx, ty = x2 - ux * node_r + ox, y2 - uy * node_r + oy
        kind = e.kind if e.kind in _KIND_COLOURS else "other"
        colour = _KIND_COLOURS.get(e.kind, "#777")
        label = f"{e.kind} {e.p50_ms:.2f}/{e.p99_ms:.2f} ms n={e.count}"
        mx, my = (sx + tx) / 2 + ox * 1.6, (sy + ty) / 2 + oy * 1.6
        parts.append(
            f'<g class="edge" data-source="{esc(e.source)}" data-target="{esc(e.target)}" data-kind="{esc(e.kind)}" '
            f'data-count="{e.count}"><line x1="{sx:.1f}" y1="{sy:.1f}" x2="{tx:.1f}" y2="{ty:.1f}" '
            f'stroke="{colour}" stroke-width="{1.5 + min(4.0, math.log10(e.count + 1)):.1f}" '
            f'marker-end="url(#arrow-{kind})"/><text x="{mx:.1f}" y="{my:.1f}" text-anchor="middle" '
            f'fill="{colour}">{esc(label)}</text></g>'
        )
    for name in names:
        x, y = pos[name]
        cluster = clusters.get(name, "")
        parts.append(
            f'<g class="node" data-name="{esc(name)}"><circle cx="{x:.1f}" cy="{y:.1f}" r="{node_r}" fill="#f4f4f4" '
            f'stroke="#333"/><text x="{x:.1f}" y="{y:.1f}" text-anchor="middle" font-weight="bold">{esc(name)}</text>'
            f'<text x="{x:.1f}" y="{y + 14:.1f}" text-anchor="middle" fill="#555">{esc(cluster)}</text></g>'
        )
    legend_y = size + 25
    for i, (kind, colour) in enumerate(_KIND_COLOURS.items()):
        parts.append(
            f'<line x1="{20 + i * 110}" y1="{legend_y}" x2="{50 + i * 110}" y2="{legend_y}" stroke="{colour}" '
            f'stroke-width="3"/><text x="{55 + i * 110}" y="{legend_y + 4}">{kind}</text>'
        )
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def run_report(spark: Any, spans_dir: str, out_dir: str) -> tuple[list[Edge], list[ErrorRow]]:
    """Read the Parquet span table, write edges.csv, errors.csv, report.md, network.svg."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    edges, errors, clusters = compute(spark.read.parquet(spans_dir))
    write_tables(out, edges, errors)
    (out / "network.svg").write_text(edges_svg(edges, clusters))
    return edges, errors
