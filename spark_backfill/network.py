"""The report's network picture, laid out and drawn by Graphviz's `dot`.

Servers of one cluster sit in one box (a `cluster_` subgraph), gateways run between the
boxes, a leafnode sits beside its hub (one rank from it), and every observed edge is its own
arrow with its own label: kind and count, then p50 / p99 hop latency. `dot` places edge
labels as part of the layout, so two parallel edges (A->B and B->A) get two labels that do
not cover each other. One `dot` run writes the SVG, the PNG and the layout as JSON; the
layout (`Layout`: the boxes of nodes and labels) is what the tests check.
"""

from __future__ import annotations

import json
import math
import subprocess
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spark_backfill.edges import Edge

__all__ = ["KIND_COLOURS", "Box", "Layout", "edge_id", "render", "roles", "to_dot"]

KIND_COLOURS = {"router": "#1f77b4", "gateway": "#d62728", "leaf": "#2ca02c"}
_OTHER_COLOUR = "#777777"
_FONT = "Helvetica"
TITLE = "Observed NATS network: forwarded messages per edge, hop latency p50 / p99 (ms)"


@dataclass(frozen=True, slots=True)
class Box:
    """An axis-aligned rectangle in points (Graphviz's coordinates: y grows upwards)."""

    x0: float
    y0: float
    x1: float
    y1: float

    def overlaps(self, other: Box) -> bool:
        return self.x0 < other.x1 and other.x0 < self.x1 and self.y0 < other.y1 and other.y0 < self.y1

    @property
    def centre(self) -> tuple[float, float]:
        return (self.x0 + self.x1) / 2, (self.y0 + self.y1) / 2


@dataclass(frozen=True, slots=True)
class Layout:
    """Where `dot` put things: servers, cluster boxes, and each edge's label (by `edge_id`)."""

    nodes: dict[str, Box]
    clusters: dict[str, Box]
    labels: dict[str, Box]
    label_texts: dict[str, str]
    edges: tuple[str, ...]  # every drawn edge, labelled or not


def edge_id(source: str, target: str, kind: str) -> str:
    """The id of an edge's SVG element and layout entry."""
    return f"edge:{source}>{target}:{kind}"


def roles(edges: Sequence[Edge], clusters: Mapping[str, str]) -> tuple[dict[str, list[str]], dict[str, str]]:
    """(servers by cluster, hub of each leafnode).

    A leafnode server reports its own name (or nothing) as its cluster; it is drawn beside
    the server its leaf connection carried most messages to or from.
    """
    names = sorted({e.source for e in edges} | {e.target for e in edges} | set(clusters))
    members = Counter(clusters.get(n) or "" for n in names)
    grouped: dict[str, list[str]] = {}
    loose = []
    for name in names:
        cluster = clusters.get(name) or ""
        if cluster and (cluster != name or members[cluster] > 1):
            grouped.setdefault(cluster, []).append(name)
        else:
            loose.append(name)
    hubs: dict[str, str] = {}
    for name in loose:
        peers: Counter[str] = Counter()
        for e in edges:
            if e.kind == "leaf" and name in (e.source, e.target):
                peers[e.target if e.source == name else e.source] += e.count
        if peers:
            hubs[name] = sorted(peers.items(), key=lambda p: (-p[1], p[0]))[0][0]
    return grouped, hubs


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _ms(value: float) -> str:
    if value < 10:
        return f"{value:.2f}"
    return f"{value:.1f}" if value < 100 else f"{value:.0f}"


def _attrs(**attrs: object) -> str:
    return "[" + ", ".join(f"{k}={_quote(str(v))}" for k, v in attrs.items()) + "]"


def to_dot(edges: Sequence[Edge], clusters: Mapping[str, str]) -> str:
    """The Graphviz source of the picture (no coordinates: `dot` lays it out)."""
    grouped, hubs = roles(edges, clusters)
    names = sorted({e.source for e in edges} | {e.target for e in edges} | set(clusters))
    lines = [
        "digraph nats {",
        f"  graph {_attrs(rankdir='LR', newrank='true', nodesep='0.5', ranksep='1.1', fontname=_FONT, fontsize=14, labelloc='t', label=TITLE, pad='0.3', bgcolor='white', compound='true')};",  # noqa: E501
        f"  node {_attrs(shape='box', style='rounded,filled', fillcolor='#f4f4f4', color='#333333', fontname=_FONT, fontsize=12, margin='0.15,0.08')};",  # noqa: E501
        f"  edge {_attrs(fontname=_FONT, fontsize=10, arrowsize='0.8')};",
    ]
    for index, (cluster, servers) in enumerate(sorted(grouped.items())):
        lines.append(f"  subgraph cluster_{index} {{")
        lines.append(f"    graph {_attrs(label=f'cluster {cluster}', style='rounded,dashed', color='#999999', fontsize=12, margin=14)};")  # noqa: E501
        lines.extend(f"    {_quote(name)};" for name in servers)
        lines.append("  }")
    for name in names:
        if name in hubs:
            label = f"{name}\nleafnode of {hubs[name]}"
            lines.append(f"  {_quote(name)} {_attrs(label=label, fillcolor='#eef7ee')};")
    for e in edges:
        colour = KIND_COLOURS.get(e.kind, _OTHER_COLOUR)
        label = f"{e.kind} n={e.count}\np50 {_ms(e.p50_ms)} / p99 {_ms(e.p99_ms)} ms"
        # A heavy leaf edge is kept short: the leafnode stays beside its hub.
        weight = 8 if e.kind == "leaf" else 1
        lines.append(
            f"  {_quote(e.source)} -> {_quote(e.target)} "
            + _attrs(id=edge_id(e.source, e.target, e.kind), label=label, color=colour, fontcolor=colour, weight=weight,
                     penwidth=f"{1.2 + min(3.0, math.log10(e.count + 1)):.1f}",
                     tooltip=f"{e.source} -> {e.target} over {e.kind}: {e.count} messages")
        )
    lines.append("}")
    return "\n".join(lines) + "\n"


def _point(text: str) -> tuple[float, float]:
    x, y = text.split(",")[:2]
    return float(x), float(y.rstrip("!"))


def _text_box(ops: Iterable[Mapping[str, Any]]) -> tuple[Box | None, str]:
    """The box around the text operations of an xdot draw list, and the text."""
    size = 14.0
    boxes, texts = [], []
    for op in ops:
        if op.get("op") == "F":
            size = float(op["size"])
        elif op.get("op") == "T":
            x, y = op["pt"]
            width = float(op["width"])
            left = {"l": x, "r": x - width}.get(op.get("align", "c"), x - width / 2)
            # Baseline at y: descenders below, cap height above.
            boxes.append(Box(left, y - 0.3 * size, left + width, y + 0.9 * size))
            texts.append(op["text"])
    if not boxes:
        return None, ""
    return Box(min(b.x0 for b in boxes), min(b.y0 for b in boxes), max(b.x1 for b in boxes),
               max(b.y1 for b in boxes)), "\n".join(texts)


def parse_layout(doc: Mapping[str, Any]) -> Layout:
    """The `Layout` of `dot -Tjson` output."""
    objects = doc.get("objects", [])
    nodes: dict[str, Box] = {}
    clusters: dict[str, Box] = {}
    for obj in objects:
        if "bb" in obj and obj.get("name", "").startswith("cluster_"):
            x0, y0, x1, y1 = (float(v) for v in obj["bb"].split(","))
            clusters[str(obj.get("label", obj["name"])).removeprefix("cluster ")] = Box(x0, y0, x1, y1)
        elif "pos" in obj:
            x, y = _point(obj["pos"])
            w, h = float(obj["width"]) * 72 / 2, float(obj["height"]) * 72 / 2
            nodes[obj["name"]] = Box(x - w, y - h, x + w, y + h)
    labels: dict[str, Box] = {}
    texts: dict[str, str] = {}
    drawn = []
    for edge in doc.get("edges", []):
        key = edge.get("id") or f"{objects[edge['tail']]['name']}->{objects[edge['head']]['name']}"
        drawn.append(key)
        box, text = _text_box(edge.get("_ldraw_", []))
        if box is not None:
            labels[key], texts[key] = box, text
    return Layout(nodes, clusters, labels, texts, tuple(drawn))


def render(edges: Sequence[Edge], clusters: Mapping[str, str], out: Path,
           stem: str = "network") -> Layout:
    """Write `stem`.svg, `stem`.png and `stem`.dot into `out`; the layout `dot` chose."""
    source = to_dot(edges, clusters)
    (out / f"{stem}.dot").write_text(source)
    layout_file = out / f".{stem}.layout.json"
    # One layout, three renderings: the checked layout is the drawn one.
    cmd = ["dot", "-Tsvg", "-o", str(out / f"{stem}.svg"), "-Tpng", "-o", str(out / f"{stem}.png"),
           "-Tjson", "-o", str(layout_file)]
    done = subprocess.run(cmd, input=source.encode(), capture_output=True, timeout=120, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"dot failed ({done.returncode}): {done.stderr.decode(errors='replace').strip()[:500]}")
    try:
        return parse_layout(json.loads(layout_file.read_text()))
    finally:
        layout_file.unlink()
