"""Soak: a real nats-server, traced traffic at a steady rate, the bridge as a subprocess, a real
OTLP/gRPC receiver; bridge RSS and end-to-end latency sampled every N seconds.

    python bench/soak.py [--rate 500] [--duration 1800] [--interval 10] [--json soak.json]

End-to-end latency of a trace message = the time its server span reached the receiver minus
its ingress timestamp (the server's clock; same machine). Prints one row per interval and
writes the rows plus a summary as JSON. Every loop is bounded by the duration; every process
started is stopped by pid at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nats

from nats_otel.devkit.processes import start_topology
from nats_otel.devkit.receivers import OTLPGrpcReceiver
from nats_otel.devkit.server_config import free_ports
from nats_otel.devkit.topology import single_server

CONSUMER = 5  # OTLP SpanKind.SPAN_KIND_CONSUMER: the server span, one per trace message
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def metrics(port: int) -> dict[str, float]:
    out: dict[str, float] = {}
    try:
        with _NO_PROXY.open(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
    except OSError:
        return out
    for line in text.splitlines():
        if line.startswith("nats_otel_") and "_created" not in line:
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def total(m: dict[str, float], prefix: str) -> float:
    return sum(v for k, v in m.items() if k.startswith(prefix))


def take_latencies(rx: OTLPGrpcReceiver) -> tuple[int, int, list[float]]:
    """(spans, trace messages, latencies in ms) received since the last call; forgets them."""
    received = rx.received
    rx.clear()
    spans = messages = 0
    latencies = []
    for r in received:
        for rs in r.request.resource_spans:
            for ss in rs.scope_spans:
                for span in ss.spans:
                    spans += 1
                    if span.kind == CONSUMER:
                        messages += 1
                        latencies.append((r.received_at - span.start_time_unix_nano / 1e9) * 1000)
    return spans, messages, latencies


async def publish(url: str, rate: float, until: float, counter: list[int]) -> None:
    """Traced messages at `rate`/s until `until`, paced in 10 ms ticks, each delivered to a subscriber."""
    nc = await nats.connect(url)

    async def consume(_msg: object) -> None:
        pass  # the delivery is what makes the server trace an egress; the body is not needed

    # A callback that reads: a subscription nobody reads fills its buffer and nats-py then
    # reports a slow consumer for every message (it did, in the first 30-minute run).
    await nc.subscribe("soak.work", cb=consume)
    await nc.flush()
    started = time.monotonic()
    try:
        while time.monotonic() < until:
            due = int((time.monotonic() - started) * rate)
            while counter[0] < due:
                tp = f"00-{os.urandom(16).hex()}-{os.urandom(8).hex()}-01"
                await nc.publish("soak.work", b"x" * 64, headers={"traceparent": tp})
                counter[0] += 1
            await asyncio.sleep(0.01)
        await nc.flush()
    finally:
        await nc.close()


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


async def soak(args: argparse.Namespace) -> dict:
    rows = []
    with start_topology(single_server()) as topo, OTLPGrpcReceiver(max_workers=2) as rx:
        url = topo.client_url("n1", "a")
        (port,) = free_ports(1)
        log = open(args.log, "wb")  # noqa: SIM115 - closed below
        bridge = subprocess.Popen(
            [sys.executable, "-m", "nats_otel.cli", "bridge", "--nats-url", url, "--subject", "trace.a",
             "--otlp-endpoint", rx.endpoint, "--metrics-port", str(port), "--log-level", "WARNING",
             "--max-runtime", str(args.duration + 60)],
            stdout=subprocess.DEVNULL, stderr=log, start_new_session=True,
        )
        try:
            deadline = time.monotonic() + 30
            while not metrics(port) and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
            await asyncio.sleep(1.0)  # subscribed
            start = time.monotonic()
            until = start + args.duration
            published = [0]
            pub = asyncio.create_task(publish(url, args.rate, until, published))
            arrived_total = 0
            print(f"{'t_s':>6} {'published':>9} {'arrived':>8} {'msg/s':>7} {'rss_mb':>7} "
                  f"{'p50_ms':>7} {'p99_ms':>7} {'max_ms':>7} {'dropped':>7} {'queue':>5}")
            last_pub, last_t = 0, start
            while time.monotonic() < until + 5:
                await asyncio.sleep(min(args.interval, max(0.1, until + 5 - time.monotonic())))
                now = time.monotonic()
                _, messages, lat = take_latencies(rx)
                arrived_total += messages
                m = metrics(port)
                row = {
                    "t_s": round(now - start, 1), "published": published[0], "arrived": arrived_total,
                    "publish_rate": round((published[0] - last_pub) / (now - last_t), 1),
                    "rss_mb": round(rss_mb(bridge.pid), 1),
                    "p50_ms": round(pct(lat, 0.5), 1), "p99_ms": round(pct(lat, 0.99), 1),
                    "max_ms": round(max(lat), 1) if lat else float("nan"),
                    "dropped": total(m, "nats_otel_messages_dropped_total"),
                    "queue": m.get("nats_otel_queue_depth", 0.0),
                }
                last_pub, last_t = published[0], now
                rows.append(row)
                print(f"{row['t_s']:>6} {row['published']:>9} {row['arrived']:>8} {row['publish_rate']:>7} "
                      f"{row['rss_mb']:>7} {row['p50_ms']:>7} {row['p99_ms']:>7} {row['max_ms']:>7} "
                      f"{row['dropped']:>7.0f} {row['queue']:>5.0f}", flush=True)
            await pub
            # Let the tail arrive (bounded), then count it.
            tail_deadline = time.monotonic() + 10
            while arrived_total < published[0] and time.monotonic() < tail_deadline:
                await asyncio.sleep(0.5)
                arrived_total += take_latencies(rx)[1]
            m = metrics(port)
        finally:
            bridge.send_signal(signal.SIGTERM)
            try:
                code = bridge.wait(30)
            except subprocess.TimeoutExpired:
                bridge.kill()
                code = bridge.wait(10)
            log.close()
    steady = rows[len(rows) // 4:] or rows  # skip warm-up
    rss = [r["rss_mb"] for r in steady]
    summary = {
        "rate": args.rate, "duration_s": args.duration, "interval_s": args.interval,
        "published": published[0], "arrived": arrived_total,
        "received_by_bridge": total(m, "nats_otel_messages_received_total"),
        "dropped": total(m, "nats_otel_messages_dropped_total"),
        "rejected": total(m, "nats_otel_messages_rejected_total"),
        "rss_mb_first": rows[0]["rss_mb"] if rows else None, "rss_mb_last": rows[-1]["rss_mb"] if rows else None,
        "rss_mb_steady_min": min(rss) if rss else None, "rss_mb_steady_max": max(rss) if rss else None,
        "p50_ms_median": statistics.median(r["p50_ms"] for r in steady) if steady else None,
        "p99_ms_max": max(r["p99_ms"] for r in steady) if steady else None,
        "bridge_exit_code": code,
    }
    return {"summary": summary, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", type=float, default=500.0, help="traced messages per second")
    parser.add_argument("--duration", type=float, default=1800.0, help="seconds of traffic")
    parser.add_argument("--interval", type=float, default=10.0, help="seconds between samples")
    parser.add_argument("--json", type=Path, default=Path("soak.json"))
    parser.add_argument("--log", type=Path, default=Path("soak-bridge.log"))
    args = parser.parse_args(argv)
    result = asyncio.run(soak(args))
    args.json.write_text(json.dumps(result, indent=2))
    print(json.dumps(result["summary"], indent=2))
    s = result["summary"]
    return 0 if s["arrived"] == s["published"] and s["bridge_exit_code"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
