"""What a sidecar pays each second whatever its share of the traffic, measured part by part,
with N such processes at once, beside what issue 46's efficiency targets leave for it.

A bridge in a group of N carries 1/N of the trace messages, but some of its costs come per
second, not per message: the event loop's ticks (`nats.read_interval`: reads are gathered
to one a tick), the OTLP/gRPC channel kept open, and an export request now and then (small
batches are exported together, `batch.coalesce`). Each kind below runs in N processes of
its own at once for `--seconds`, and prints its CPU per process (the process's CPU clock:
every thread, user + system):

- tick:        an asyncio loop woken at every multiple of `--interval` that does nothing:
               the least a paced sidecar pays to come back to its work;
- grpc_idle:   a connected `GrpcExporter` (the bridge's own) to a real OTLP receiver in
               another process, idle: grpcio's own threads;
- grpc_export: the same, exporting an empty request every `--export-every` seconds: what a
               request costs when it is not one of a stream of them (minus grpc_idle).

The budget: efficiency E at N means N bridges may spend 1/E times one bridge's CPU for
the same traffic, so each of the N - 1 beyond one may spend `one * (1/E - 1) / (N - 1)`
over the traffic's seconds. `--one-bridge-cpu` and `--traffic-seconds` are one bridge's
summed CPU and the measured window of `bench/scale_out.py --otlp --bridges 1` (defaults:
this machine, 2026-11-28).

    python bench/sidecar_floor.py                 # N = 1 and 8, 20 s each kind
    python bench/sidecar_floor.py --processes 4 --seconds 30
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nats_otel.devkit.receivers import OTLPGrpcReceiver

KINDS = ("tick", "grpc_idle", "grpc_export")

# One child: waits for its start line, runs its kind for `seconds`, prints its CPU seconds.
_CHILD = r'''
import asyncio, math, sys, time
kind, endpoint = sys.argv[1], sys.argv[5]
seconds, interval, every = (float(arg) for arg in sys.argv[2:5])
exporter = None
if kind != "tick":
    from nats_otel.bridge.export.otlp import GrpcExporter
    from nats_otel.bridge.settings import OtlpSettings
    exporter = GrpcExporter(OtlpSettings(endpoint=endpoint, insecure=True))
    assert exporter.export_bytes(b"").ok, "the receiver did not take a request"
print("ready", flush=True)
sys.stdin.readline()
events = 0
started = time.process_time()
if kind == "tick":
    async def ticks():
        global events
        loop = asyncio.get_running_loop()
        end, done = loop.time() + seconds, loop.create_future()
        def tick():
            global events
            now = loop.time()
            if now >= end:
                done.set_result(None)
                return
            events += 1
            loop.call_at((math.floor(now / interval) + 1) * interval, tick)
        tick()
        await done
    asyncio.run(ticks())
elif kind == "grpc_idle":
    time.sleep(seconds)
else:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if not exporter.export_bytes(b"").ok:
            raise SystemExit("an export failed")
        events += 1
        time.sleep(every)
print(time.process_time() - started, events, flush=True)
'''


def run_kind(kind: str, processes: int, seconds: float, interval: float, every: float, endpoint: str
             ) -> tuple[list[float], int]:
    """`processes` children of `kind` at once: each one's CPU seconds, and their events."""
    argv = [sys.executable, "-c", _CHILD, kind, str(seconds), str(interval), str(every), endpoint]
    children = [subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                for _ in range(processes)]
    try:
        for child in children:
            if child.stdout is None or child.stdout.readline().strip() != "ready":
                raise SystemExit(f"a {kind} process did not start")
        for child in children:
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
        results = []
        for child in children:
            out, _ = child.communicate(timeout=seconds + 60)
            if child.returncode != 0:
                raise SystemExit(f"a {kind} process failed ({child.returncode})")
            cpu, events = out.split()
            results.append((float(cpu), int(events)))
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
    return [cpu for cpu, _ in results], sum(events for _, events in results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--interval", type=float, default=0.1, help="the tick (`nats.read_interval`)")
    parser.add_argument("--export-every", type=float, default=1.0, help="seconds between grpc_export's requests")
    parser.add_argument("--one-bridge-cpu", type=float, default=0.46, help="one bridge's summed CPU, seconds")
    parser.add_argument("--traffic-seconds", type=float, default=11.7, help="that run's measured window")
    args = parser.parse_args()

    receiver = OTLPGrpcReceiver(keep_requests=False).start()
    try:
        print("| processes | kind | CPU per process | per event |")
        print("|---:|---|---:|---:|")
        for processes in args.processes:
            idle_ms = 0.0
            for kind in KINDS:
                cpus, events = run_kind(kind, processes, args.seconds, args.interval, args.export_every,
                                        receiver.endpoint)
                per_second_ms = sum(cpus) / processes / args.seconds * 1e3
                per_event = ""
                if kind == "grpc_idle":
                    idle_ms = per_second_ms
                elif events:
                    beyond_idle = per_second_ms - (idle_ms if kind == "grpc_export" else 0.0)
                    per_event = f"{beyond_idle * 1e3 * processes * args.seconds / events:.0f} µs"
                print(f"| {processes} | {kind} | {per_second_ms:.2f} ms/s | {per_event} |", flush=True)
    finally:
        receiver.stop()

    print()
    print(f"Budget per sidecar beyond one (one bridge {args.one_bridge_cpu} CPU-s over {args.traffic_seconds} s):")
    for processes, efficiency in ((4, 0.85), (8, 0.8), (8, 0.9)):
        allowed = args.one_bridge_cpu * (1 / efficiency - 1) / (processes - 1) / args.traffic_seconds
        print(f"  N = {processes}, efficiency {efficiency}: {allowed * 1e3:.2f} ms/s")


if __name__ == "__main__":
    main()
