"""What one batch costs a lone bridge, whatever it holds: one real trace message every
`--period` seconds (longer than `batch.max_delay`: each is a batch of its own) to a bridge in
a queue group of one, against the same bridge idle; its CPU seconds from /proc, the event
loop's thread apart (its id is the process's).

    python bench/batch_cost.py                       # this checkout
    python bench/batch_cost.py --checkout /path/to/baseline   # a baseline's package, built alike

docs/scale-out.md's cost model: what a sidecar pays per batch is paid by each of N bridges
for the same traffic. Clock ticks are 10 ms: run it a few times, alternately.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import nats

sys.path.insert(0, str(Path(__file__).resolve().parent))

from corpus_replay import replicate

from nats_otel.devkit.processes import start_topology
from nats_otel.devkit.server_config import free_ports
from nats_otel.devkit.topology import single_server

TICK = os.sysconf("SC_CLK_TCK")


def thread_cpu(pid: int) -> tuple[float, float]:
    """(the event loop's thread, every other thread) CPU seconds of process `pid`."""
    loop = other = 0.0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        seconds = (int(fields[11]) + int(fields[12])) / TICK
        if tid == str(pid):
            loop += seconds
        else:
            other += seconds
    return loop, other


def wait_ready(port: int, proc: subprocess.Popen) -> None:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    for _ in range(300):
        try:
            if opener.open(f"http://127.0.0.1:{port}/readyz", timeout=1).status == 200:
                return
        except OSError:
            pass
        if proc.poll() is not None:
            raise SystemExit("the bridge exited")
        time.sleep(0.1)
    raise SystemExit("the bridge is not ready")


async def measure(url: str, pid: int, period: float, seconds: float) -> None:
    raws = replicate(int(seconds / period) + 10, seed=str(time.time()))
    nc = await nats.connect(url)
    try:
        await asyncio.sleep(2.0)
        before = thread_cpu(pid)
        await asyncio.sleep(seconds)
        idle = thread_cpu(pid)
        started, sent = time.monotonic(), 0
        while time.monotonic() - started < seconds:
            raw = raws[sent]
            await nc.publish("trace.batch", raw.payload, headers={k: v[0] for k, v in raw.headers.items()} or None)
            await nc.flush()
            sent += 1
            await asyncio.sleep(period - (time.monotonic() - started) % period)
        await asyncio.sleep(3.0)  # the last batch's link window and export
        busy = thread_cpu(pid)
    finally:
        await nc.close()
    scale = (seconds + 3.0) / seconds  # idle over the busy phase's length
    loop_ms = ((busy[0] - idle[0]) - (idle[0] - before[0]) * scale) / sent * 1e3
    other_ms = ((busy[1] - idle[1]) - (idle[1] - before[1]) * scale) / sent * 1e3
    print(f"idle {sum(idle) - sum(before):.2f} CPU-s per {seconds:.0f} s; {sent} batches of one trace message: "
          f"{loop_ms + other_ms:.2f} ms each over idle (event loop {loop_ms:.2f}, other threads {other_ms:.2f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--period", type=float, default=0.3, help="seconds between trace messages")
    parser.add_argument("--seconds", type=float, default=30.0, help="of idle, then of traffic")
    parser.add_argument("--checkout", type=Path, help="run that checkout's nats_otel (a baseline)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="batch-cost-") as tmp, \
            start_topology(single_server(), Path(tmp) / "nats") as topo:
        url = topo.client_url("n1", "a")
        port = free_ports(1)[0]
        argv = [sys.executable, "-m", "nats_otel.cli", "bridge", "--nats-url", url, "--subject", "trace.batch",
                "--queue", "nats-otel", "--output", str(Path(tmp) / "spans.jsonl"), "--metrics-port", str(port),
                "--log-level", "WARNING"]
        env = {**os.environ, "PYTHONPATH": str(args.checkout)} if args.checkout else None
        with open(Path(tmp) / "bridge.log", "wb") as log:
            proc = subprocess.Popen(argv, stderr=log, env=env, cwd=args.checkout)
            try:
                wait_ready(port, proc)
                asyncio.run(measure(url, proc.pid, args.period, args.seconds))
            finally:
                proc.terminate()
                proc.wait(30)


if __name__ == "__main__":
    main()
