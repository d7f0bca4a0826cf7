"""A graph of a Prometheus range query with its exemplars, as one HTML page (inline SVG, no
script), for the docs' screenshot: Debian's `prometheus` package ships the classic web UI,
which cannot draw exemplars. Lines are the query's series, dots the exemplars Prometheus
stored (`/api/v1/query_exemplars`), coloured as the series whose labels they share; below,
the latest exemplars with their trace and span ids."""

from __future__ import annotations

import html
from typing import Any

COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2"]
WIDTH, HEIGHT, LEFT, TOP, BOTTOM = 1300, 520, 80, 20, 40


def _key(labels: dict[str, str], names: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(labels.get(n, "") for n in names)


def page(title: str, query: str, series: list[dict[str, Any]], exemplars: list[dict[str, Any]],
         by: tuple[str, ...], table_rows: int = 12) -> str:
    """The page: `series` from `query_range` (matrix), `exemplars` from `query_exemplars`;
    `by` are the labels that match an exemplar's series to a line (its colour)."""
    points = [(float(t), float(v)) for s in series for t, v in s["values"] if v not in ("NaN", "+Inf", "-Inf")]
    dots = [(float(e["timestamp"]), float(e["value"]), s["seriesLabels"], e["labels"])
            for s in exemplars for e in s["exemplars"]]
    times = [t for t, _ in points] + [t for t, _, _, _ in dots]
    values = [v for _, v in points] + [v for _, v, _, _ in dots]
    t0, t1 = min(times), max(times)
    # The scale holds the lines and most dots: a rare slow outlier (drawn at the top edge, as a
    # triangle) must not flatten everything else.
    dot_values = sorted(v for _, v, _, _ in dots)
    typical = dot_values[int(len(dot_values) * 0.99)] if dot_values else 0.0
    top = max([v for _, v in points] + [typical]) * 1.2 or max(values, default=1.0)
    colour = {_key(s["metric"], by): COLOURS[i % len(COLOURS)] for i, s in enumerate(series)}

    def x(t: float) -> float:
        return LEFT + (t - t0) / max(t1 - t0, 1e-9) * (WIDTH - LEFT - 20)

    def y(v: float) -> float:
        return TOP + (1 - min(max(v, 0.0), top) / top) * (HEIGHT - TOP - BOTTOM)

    svg = [f'<svg width="{WIDTH}" height="{HEIGHT}" xmlns="http://www.w3.org/2000/svg" font-size="12">']
    for i in range(6):  # the y grid, in milliseconds
        v = top * i / 5
        svg.append(f'<line x1="{LEFT}" x2="{WIDTH - 20}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#ddd"/>'
                   f'<text x="{LEFT - 8}" y="{y(v) + 4:.1f}" text-anchor="end">{v * 1e3:.2f} ms</text>')
    for i in range(7):  # the x axis, seconds since the first point
        t = t0 + (t1 - t0) * i / 6
        svg.append(f'<text x="{x(t):.1f}" y="{HEIGHT - 15}" text-anchor="middle">{t - t0:.0f} s</text>')
    for s in series:
        path = " ".join(f"{x(float(t)):.1f},{y(float(v)):.1f}" for t, v in s["values"] if v != "NaN")
        svg.append(f'<polyline fill="none" stroke-width="2" stroke="{colour[_key(s["metric"], by)]}" points="{path}"/>')
    for t, v, labels, _ in dots:
        fill = colour.get(_key(labels, by), "#555")
        if v > top:
            svg.append(f'<text x="{x(t):.1f}" y="{TOP + 4}" text-anchor="middle" fill="{fill}">&#9650; '
                       f'{v * 1e3:.1f} ms</text>')
        else:
            svg.append(f'<circle cx="{x(t):.1f}" cy="{y(v):.1f}" r="3.5" fill="{fill}" fill-opacity="0.55"/>')
    svg.append("</svg>")
    legend = "".join(f'<span style="color:{c}">&#9632; {html.escape(" ".join(k))}</span> &nbsp; '
                     for k, c in colour.items())
    latest = sorted(dots, key=lambda d: -d[0])[:table_rows]
    rows = "".join(
        f"<tr><td style='color:{colour.get(_key(labels, by), '#555')}'>{html.escape(' '.join(_key(labels, by)))}</td>"
        f"<td>le={html.escape(labels.get('le', ''))}</td><td>{v * 1e6:.0f} us</td>"
        f"<td><code>{html.escape(names.get('trace_id', ''))}</code></td>"
        f"<td><code>{html.escape(names.get('span_id', ''))}</code></td></tr>"
        for _, v, labels, names in latest)
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:sans-serif;margin:16px}} td{{padding:2px 10px;font-size:13px}}</style></head><body>
<h3 style="margin:4px 0">{html.escape(title)}</h3>
<div style="font-family:monospace;font-size:13px;margin-bottom:6px">{html.escape(query)}</div>
<div style="font-size:13px">lines: the query &nbsp; dots: exemplars ({len(dots)} stored), one traced message each
&nbsp; | &nbsp; {legend}</div>
{"".join(svg)}
<table><tr><th>edge</th><th>bucket</th><th>latency</th><th>trace_id</th><th>span_id</th></tr>{rows}</table>
</body></html>"""
