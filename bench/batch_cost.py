"""What one batch costs a lone bridge, whatever it holds: one real trace message every
`--period` seconds (longer than `batch.max_delay`: each is a batch of its own) to a bridge in
a queue group of one, against the same bridge idle; its CPU seconds from /proc, the event
loop's thread apart (its id is the process's).

    python bench/batch_cost.py                                  # this checkout
    BRIDGE_CHECKOUT=/path/to/baseline python bench/batch_cost.py   # a baseline, built alike

docs/scale-out.md's cost model: what a sidecar pays per batch is paid by each of N bridges
for the same traffic. Clock ticks are 10 ms: run it a few times, alternately.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

import nats

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bridge_process import Bridge
from corpus_replay import replicate
from scale_out import thread_cpu

from nats_otel.devkit.processes import start_topology
from nats_otel.devkit.topology import single_server

SUBJECT = "trace.batch"


def loop_and_other(pid: int) -> tuple[float, float]:
    """(the event loop's thread, every other thread) CPU seconds of process `pid`."""
    by_thread = thread_cpu(pid)
    return (by_thread.get("main user", 0.0) + by_thread.get("main system", 0.0),
            by_thread.get("other threads user", 0.0) + by_thread.get("other threads system", 0.0))


async def measure(url: str, pid: int, period: float, seconds: float) -> None:
    raws = replicate(int(seconds / period) + 10, seed=str(time.time()))
    nc = await nats.connect(url)
    try:
        await asyncio.sleep(2.0)
        before = loop_and_other(pid)
        await asyncio.sleep(seconds)
        idle = loop_and_other(pid)
        started, sent = time.monotonic(), 0
        while time.monotonic() - started < seconds:
            raw = raws[sent]
            await nc.publish(SUBJECT, raw.payload, headers={k: v[0] for k, v in raw.headers.items()} or None)
            await nc.flush()
            sent += 1
            await asyncio.sleep(period - (time.monotonic() - started) % period)
        await asyncio.sleep(3.0)  # the last batch's link window and export
        busy = loop_and_other(pid)
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
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="batch-cost-") as tmp, \
            start_topology(single_server(), Path(tmp) / "nats") as topo:
        url = topo.client_url("n1", "a")
        bridge = Bridge(Path(tmp), "n1", url, [SUBJECT], queue="nats-otel")
        try:
            bridge.wait_ready()
            asyncio.run(measure(url, bridge.proc.pid, args.period, args.seconds))
        finally:
            bridge.stop()


if __name__ == "__main__":
    main()
