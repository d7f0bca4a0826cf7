#!/usr/bin/env python3
"""How docs/images/prometheus-hop-latency.png (and -exemplars.png) is made: a real cluster of
three servers with a leafnode, a bridge started like a user would, a real Prometheus (exemplar
storage on) scraping it, a minute of traced traffic over each link, and Prometheus's own graph
page of the p99 hop latency per link, photographed by headless Chromium. With `--exemplars`,
the same query's graph with the exemplars Prometheus stored (each dot a traced message, with
its trace id): drawn by `exemplar_chart.py` from Prometheus's API, as Debian's package ships
the classic web UI, which does not draw exemplars.

    # once: Prometheus and Chromium from Debian
    apt-get install -y prometheus chromium
    # then, from the repository root, with the project's venv:
    python scripts/prometheus_screenshot.py [--seconds 90] [--exemplars]
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path

import nats

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from chromium_shot import find_chromium, screenshot  # noqa: E402 (the script's own folder)
from exemplar_chart import page as exemplar_page  # noqa: E402

from nats_otel.devkit.processes import start_topology, wait_for_interest  # noqa: E402
from nats_otel.devkit.prometheus import PrometheusServer  # noqa: E402
from nats_otel.devkit.server_config import free_ports  # noqa: E402
from nats_otel.devkit.topology import demo_topology  # noqa: E402

QUERY = ("histogram_quantile(0.99, sum by (le, from_server, to_server, kind) "
         "(rate(nats_otel_hop_latency_seconds_bucket[30s])))")
async def traffic(topo, seconds: float) -> int:
    """Traced messages from east-2 (routes, then east-1's leafnode) and from leaf-1 (the other
    way), ~40 a second, one traceparent each."""
    import os

    subs = [await nats.connect(topo.client_url(n, "a")) for n in ("east-3", "leaf-1", "east-2")]
    east2 = await nats.connect(topo.client_url("east-2", "a"))
    leaf = await nats.connect(topo.client_url("leaf-1", "a"))
    await subs[0].subscribe("shot.down")
    await subs[1].subscribe("shot.down")
    await subs[2].subscribe("shot.up")
    for nc in subs[:2]:
        await wait_for_interest(east2, nc)
    await wait_for_interest(leaf, subs[2])
    sent, deadline = 0, time.monotonic() + seconds
    while time.monotonic() < deadline:
        for nc, subject in ((east2, "shot.down"), (leaf, "shot.up")):
            tp = f"00-{os.urandom(16).hex()}-{os.urandom(8).hex()}-01"
            await nc.publish(subject, b"x" * 64, headers={"traceparent": tp})
            sent += 1
        await asyncio.sleep(0.05)
    for nc in (*subs, east2, leaf):
        await nc.close()
    return sent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=90.0, help="how long to publish")
    parser.add_argument("--exemplars", action="store_true", help="show the stored exemplars on the graph")
    parser.add_argument("--output", type=Path, help="default: docs/images/prometheus-hop-latency[-exemplars].png")
    parser.add_argument("--window-size", default="1400,900")
    args = parser.parse_args()
    name = "prometheus-hop-latency-exemplars.png" if args.exemplars else "prometheus-hop-latency.png"
    output = args.output or ROOT / "docs" / "images" / name
    chromium = find_chromium()
    with tempfile.TemporaryDirectory(prefix="prom-shot-") as tmp, start_topology(demo_topology()) as topo:
        work = Path(tmp)
        metrics_port = free_ports(1)[0]
        bridge = subprocess.Popen(
            [sys.executable, "-m", "nats_otel.cli", "bridge", "--nats-url", topo.client_url("east-1", "a"),
             "--subject", "trace.a", "--output", str(work / "spans.otlp.jsonl"),
             "--metrics-port", str(metrics_port), "--log-format", "text"],
            stderr=(work / "bridge.log").open("wb"))
        try:
            with PrometheusServer([f"127.0.0.1:{metrics_port}"], workdir=work / "prometheus") as prom:
                sent = asyncio.run(traffic(topo, args.seconds))
                time.sleep(5)
                end = time.time()
                stored = prom.query_exemplars(QUERY, end - args.seconds - 30, end)
                print(f"published {sent} traced messages; series: {len(prom.query(QUERY))}; exemplars: "
                      f"{sum(len(s['exemplars']) for s in stored)} in {len(stored)} bucket series")
                if args.exemplars:
                    lines = prom.query_range(QUERY, end - args.seconds - 30, end, 1)
                    chart = work / "exemplars.html"
                    chart.write_text(exemplar_page("p99 hop latency per link, with exemplars (Prometheus, "
                                                   "exemplar storage on)", QUERY, lines, stored,
                                                   ("from_server", "to_server", "kind")))
                    page = chart.as_uri()
                else:
                    params = {"g0.expr": QUERY, "g0.tab": "0", "g0.range_input": f"{int(args.seconds) + 30}s",
                              "g0.stacked": "0", "g0.show_exemplars": "0"}
                    page = f"{prom.url}/graph?{urllib.parse.urlencode(params)}"
                screenshot(chromium, page, output, args.window_size, work)
        finally:
            bridge.terminate()
            bridge.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
