#!/usr/bin/env python3
"""JetStream mode draining a backlog too big for a test: by default 1,000,000 trace messages
waiting in the stream before `nats-otel bridge --mode jetstream` starts (default settings).
Measures the time to drain, the bridge's peak RSS (it must follow `jetstream.max_ack_pending`,
not the backlog) and checks that nothing is lost: every published trace id arrives, and the
spans that arrive are exactly the 2 per message (ingress + egress) the server traced.

    # from the repository root, with the project's venv
    python scripts/jetstream_backlog.py                          # 1M, ~5 min on 2 cores
    python scripts/jetstream_backlog.py --messages 200000 --max-ack-pending 5000 --json out.json

The traced messages come from `tests/bridge/burst_publisher.py` (one client, as fast as it
writes; the stream on the account's trace subject stores the server's trace messages), in
chunks whose storing is awaited. A real nats-server, a real OTLP/gRPC receiver in this
process (`bench/_bridge_meters.Receiver`: counts spans, notes each trace id's first arrival);
the bridge's RSS over its process tree sampled every 0.25 s (`Sampler`) and its VmHWM.
Every process started is stopped by pid at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nats
from nats.js.api import StorageType, StreamConfig

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from _bridge_meters import Receiver, Sampler, scrape, total  # noqa: E402

from nats_otel.devkit.processes import start_topology  # noqa: E402
from nats_otel.devkit.server_config import free_ports  # noqa: E402
from nats_otel.devkit.topology import single_server  # noqa: E402

STREAM, DURABLE, SUBJECT = "NATS_TRACES", "nats-otel", "trace.a"  # the bridge's default names
SPANS_PER_MESSAGE = 2  # ingress + egress: the publisher's own subscriber on the one server


async def _stream_messages(url: str) -> int:
    async with await nats.connect(url) as nc:
        return (await nc.jetstream().stream_info(STREAM)).state.messages


async def _consumer(nc: nats.NATS) -> tuple[int, int]:
    """(messages not yet delivered, delivered but not acked); (-1, -1) before the durable exists."""
    try:
        info = await nc.jetstream().consumer_info(STREAM, DURABLE)
    except nats.errors.Error:
        return -1, -1
    return info.num_pending or 0, info.num_ack_pending or 0


def fill(url: str, count: int, chunk: int, workdir: Path) -> set[bytes]:
    """Publish `count` traced messages in chunks, each stored before the next; their trace ids."""
    async def setup() -> None:
        async with await nats.connect(url) as nc:
            await nc.jetstream().add_stream(StreamConfig(
                name=STREAM, subjects=[SUBJECT], storage=StorageType.FILE, max_bytes=-1))

    asyncio.run(setup())
    ids: set[bytes] = set()
    started = time.monotonic()
    while len(ids) < count:
        n = min(chunk, count - len(ids))
        path = workdir / "ids.txt"
        subprocess.run([sys.executable, "-m", "tests.bridge.burst_publisher", url, str(n), "--ids", str(path)],
                       cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
        ids.update(bytes.fromhex(x) for x in path.read_text().split())
        deadline = time.monotonic() + 120
        while (stored := asyncio.run(_stream_messages(url))) < len(ids):
            if time.monotonic() > deadline:
                raise SystemExit(f"the stream stored {stored:,} of {len(ids):,} published")
            time.sleep(0.2)
        print(f"  stream holds {stored:,} ({time.monotonic() - started:.0f} s)", flush=True)
    return ids


def start_bridge(url: str, endpoint: str, workdir: Path, max_ack_pending: int | None) -> tuple[subprocess.Popen, int]:
    (port,) = free_ports(1)
    env = {**os.environ, "NATS_OTEL_TELEMETRY__METRICS_HOST": "127.0.0.1"}
    if max_ack_pending:
        env["NATS_OTEL_JETSTREAM__MAX_ACK_PENDING"] = str(max_ack_pending)
    log = open(workdir / "bridge.log", "wb")  # noqa: SIM115 - the child holds it; closed at exit
    proc = subprocess.Popen(
        [sys.executable, "-m", "nats_otel.cli", "bridge", "--mode", "jetstream", "--nats-url", url,
         "--subject", SUBJECT, "--otlp-endpoint", endpoint, "--metrics-port", str(port), "--log-level", "WARNING"],
        stdout=subprocess.DEVNULL, stderr=log, env=env, cwd=ROOT)
    return proc, port


def vm_hwm(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


async def drain(url: str, proc: subprocess.Popen, rx: Receiver, sampler: Sampler, expected_spans: int,
                interval: float, timeout: float) -> dict:
    """Until the consumer holds nothing and every span came (or timeout); a row every `interval`."""
    started = time.monotonic()
    rows: list[dict] = []
    peak_unacked = 0
    next_row = 0.0
    async with await nats.connect(url) as nc:
        while True:
            pending, unacked = await _consumer(nc)
            peak_unacked = max(peak_unacked, unacked)
            elapsed = time.monotonic() - started
            done = pending == unacked == 0 and rx.spans >= expected_spans
            if elapsed >= next_row or done:
                row = {"t": round(elapsed, 1), "pending": pending, "unacked": unacked, "spans": rx.spans,
                       "rss_mb": round(sampler.peak_rss / 2**20, 1)}
                rows.append(row)
                print(f"  {row['t']:>7.1f} s  pending {pending:>9,}  unacked {unacked:>6,}  spans {rx.spans:>10,}  "
                      f"peak RSS {row['rss_mb']:>6.1f} MB", flush=True)
                next_row += interval
            if done or elapsed > timeout or proc.poll() is not None:
                break
            await asyncio.sleep(0.25)
    seconds = max(rx.last, 0.0) - max(rx.first, 0.0) if rx.spans else float("nan")
    return {"rows": rows, "peak_unacked": peak_unacked, "wall_seconds": time.monotonic() - started,
            "first_to_last_span_seconds": seconds}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000, help="backlog size (default 1M)")
    parser.add_argument("--chunk", type=int, default=100_000, help="messages per publisher run (default 100k)")
    parser.add_argument("--max-ack-pending", type=int, help="jetstream.max_ack_pending (default: the bridge's)")
    parser.add_argument("--interval", type=float, default=10.0, help="seconds between printed rows")
    parser.add_argument("--timeout", type=float, default=1800.0, help="give up draining after this long")
    parser.add_argument("--json", type=Path, help="write the rows and the summary here")
    args = parser.parse_args()
    print(f"machine: {os.cpu_count()} cores; load average {os.getloadavg()[0]:.2f}", flush=True)
    with tempfile.TemporaryDirectory(prefix="js-backlog-") as tmp:
        workdir = Path(tmp)
        with start_topology(single_server(jetstream=True), workdir / "nats") as topo:
            url = topo.client_url("n1", "a")
            rx = Receiver()
            proc: subprocess.Popen | None = None
            try:
                print(f"filling the stream with {args.messages:,} trace messages...", flush=True)
                published = fill(url, args.messages, args.chunk, workdir)
                rx.reset(track=True)
                proc, port = start_bridge(url, rx.endpoint, workdir, args.max_ack_pending)
                sampler = Sampler(proc.pid)
                print("draining (bridge started):", flush=True)
                result = asyncio.run(drain(url, proc, rx, sampler, SPANS_PER_MESSAGE * len(published),
                                           args.interval, args.timeout))
                time.sleep(1.0)  # a late redelivery would arrive now
                metrics = scrape(port)
                result["vm_hwm_mb"] = vm_hwm(proc.pid) / 2**20
                sampler.stop()
                result["peak_rss_mb"] = sampler.peak_rss / 2**20
            finally:
                if proc is not None and proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
                code = proc.wait(60) if proc is not None else None
                rx.stop()
            log_tail = (workdir / "bridge.log").read_text()[-2000:]
    arrived = set(rx.first_seen)
    result.update({
        "messages": len(published), "spans_expected": SPANS_PER_MESSAGE * len(published), "spans_arrived": rx.spans,
        "traces_missing": len(published - arrived), "traces_unknown": len(arrived - published),
        "acked": total(metrics, 'nats_otel_jetstream_acks_total{kind="ack"}'),
        "naked": total(metrics, 'nats_otel_jetstream_acks_total{kind="nak"}'),
        "termed": total(metrics, 'nats_otel_jetstream_acks_total{kind="term"}'),
        "dropped": total(metrics, "nats_otel_messages_dropped"),
        "rejected": total(metrics, "nats_otel_messages_rejected"),
        "max_ack_pending": args.max_ack_pending or 20_000, "exit_code": code,
    })
    whole = (result["spans_arrived"] == result["spans_expected"] and not result["traces_missing"]
             and not result["traces_unknown"] and result["acked"] == len(published) and code == 0)
    rate = len(published) / result["first_to_last_span_seconds"] if result["spans_arrived"] else 0.0
    print(f"\n{len(published):,} waiting -> drained in {result['first_to_last_span_seconds']:.1f} s "
          f"(first to last span; {rate:,.0f} msgs/s), {result['wall_seconds']:.1f} s from the bridge's start; "
          f"spans {rx.spans:,} of {result['spans_expected']:,}; traces missing {result['traces_missing']:,}, "
          f"unknown {result['traces_unknown']:,}; acked {result['acked']:,.0f}, naked {result['naked']:,.0f}, "
          f"termed {result['termed']:,.0f}, dropped {result['dropped']:,.0f}, rejected {result['rejected']:,.0f}; "
          f"peak unacked {result['peak_unacked']:,} (max_ack_pending {result['max_ack_pending']:,}); "
          f"peak RSS {result['peak_rss_mb']:.0f} MB sampled, VmHWM {result['vm_hwm_mb']:.0f} MB; exit code {code}")
    print("RESULT:", "nothing lost" if whole else "MISMATCH")
    if not whole:
        print(log_tail)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0 if whole else 1


if __name__ == "__main__":
    sys.exit(main())
