"""Issue 48's burst against bridges of different settings, alternated round by round: each
bridge's CPU per trace message by thread (the event loop's, the conversion thread's, the
other Python threads' (exports), gRPC's own), the page faults it took per message (minor:
fresh memory touched), its peak RSS and the export requests it sent.

    python bench/burst_threads.py default batch2048.yaml --rounds 8
    python bench/burst_threads.py default src=/path/to/baseline --rounds 8

Each argument is a bridge: `default` (this checkout, default settings), a YAML settings file
(passed as `--config`), or `src=<checkout>` (that checkout's bridge, default settings). A
fresh bridge per burst (one nats-server, OTLP/gRPC to the bench's receiver, 60,000 trace
messages of the corpus mix published as fast as one client can). Thread CPU comes from
/proc/<pid>/task in clock ticks (10 ms: ~0.17 µs a message over 60,000): compare medians of
paired rounds, as the last lines print, never one round.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _bridge_runs import Bench

_CLK = os.sysconf("SC_CLK_TCK")


def thread_cpu(pid: int) -> Counter[str]:
    """CPU seconds by thread: "main" (the event loop's, the process's own id), each Python
    thread by its id, gRPC's by its name."""
    out: Counter[str] = Counter()
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except FileNotFoundError:  # the thread ended
            continue
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        out["main" if tid == str(pid) else f"{comm}:{tid}"] += (int(fields[11]) + int(fields[12])) / _CLK
    return out


def minor_faults(pid: int) -> int:
    """The process's minor page faults so far (every thread's)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2:].split()[7])


def peak_rss_mb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM"):
            return int(line.split()[1]) // 1024
    return 0


def burst(bench: Bench, config: str, label: str, messages: int) -> dict[str, float]:
    src = Path(config[4:]) if config.startswith("src=") else None
    extra = [] if config == "default" or src else ["--config", config]
    bench.rx.reset(track=False)
    proc, _ = bench.start_bridge("threads", 1, subject=label, extra=extra, src=src)
    try:
        time.sleep(1.5)  # its start-up done: the CPU counted is the burst's
        before, faults = thread_cpu(proc.pid), minor_faults(proc.pid)
        sent = bench.publish(label, limit=messages)["sent"]
        bench.rx.wait_quiet(bench.expected_spans(sent), quiet=2.5, timeout=300)
        after, faults = thread_cpu(proc.pid), minor_faults(proc.pid) - faults
        per = {k: (after[k] - before.get(k, 0.0)) / sent * 1e6 for k in after}
        python = sorted((v for k, v in per.items() if k.startswith("python:")), reverse=True)
        row = {"main": per.get("main", 0.0), "convert": python[0] if python else 0.0,  # the busiest: conversion
               "exports": sum(python[1:]), "grpc": sum(v for k, v in per.items() if k != "main"
                                                       and not k.startswith("python:")),
               "faults": faults / sent, "rss": peak_rss_mb(proc.pid), "requests": bench.rx.requests,
               "whole": bench.rx.spans >= bench.expected_spans(sent)}
        row["total"] = row["main"] + row["convert"] + row["exports"] + row["grpc"]
        return row
    finally:
        bench.stop(proc)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("bridges", nargs="+", help="default, a settings YAML, or src=<checkout>")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--messages", type=int, default=60_000)
    args = parser.parse_args()
    settings = argparse.Namespace(messages=args.messages, burst=args.messages, sustain_seconds=0, encoding=None)
    totals: dict[str, list[float]] = {b: [] for b in args.bridges}
    with tempfile.TemporaryDirectory(prefix="bench-threads-") as tmp:
        bench = Bench(settings, Path(tmp))
        try:
            for r in range(args.rounds):
                for at, config in enumerate(args.bridges if r % 2 == 0 else args.bridges[::-1]):
                    row = burst(bench, config, f"bench.threads.{r}.{at}", args.messages)
                    totals[config].append(row["total"])
                    print(f"round {r} {config:28} total {row['total']:5.1f} µs/msg: event loop {row['main']:.2f}, "
                          f"conversion {row['convert']:.2f}, exports {row['exports']:.2f}, gRPC {row['grpc']:.2f}; "
                          f"{row['faults']:.2f} page faults a message, peak RSS {row['rss']} MB, "
                          f"{row['requests']} requests, every span {row['whole']}",
                          flush=True)
        finally:
            for proc in bench.procs:
                bench.stop(proc)
            bench.rx.stop()
            bench.topo.stop()
    first = args.bridges[0]
    for config, values in totals.items():
        ratios = [a / b for a, b in zip(totals[first], values, strict=True)]
        print(f"{config:28} median {statistics.median(values):5.2f} µs/msg; {first}/this median "
              f"{statistics.median(ratios):.3f} ({min(ratios):.2f}-{max(ratios):.2f}), "
              f"{sum(x > 1 for x in ratios)} of {len(ratios)} rounds cheaper")


if __name__ == "__main__":
    main()
