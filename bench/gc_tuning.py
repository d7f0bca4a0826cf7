"""Benchmark: CPU per trace message of the bridge's conversion loop, with CPython's default
garbage-collector settings and with `nats_otel.gc_tuning`, alternated in one run.

    python bench/gc_tuning.py [--messages 100000] [--pairs 3]

Each side runs in a fresh process (GC settings are process-wide): the corpus replicated with
fresh ids, converted in batches of 1,000 kept alive together (as the bridge holds a batch),
spans encoded to OTLP protobuf in requests of 512; the best of 3 passes counts. Reports
process CPU µs per message for each side and the ratio per pair.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()


def measure(side: str, messages: int) -> float:
    sys.path.insert(0, str(HERE.parent))
    from _core_api import hot_path
    from corpus_replay import replicate

    from nats_otel.core.encode import to_protobuf_bytes
    from nats_otel.core.pipeline import Converted
    from nats_otel.gc_tuning import tune_gc_for_throughput

    raws = replicate(messages)
    if side == "tuned":
        tune_gc_for_throughput()
    converter = hot_path().Converter()
    best = float("inf")
    for _ in range(3):
        started = time.process_time()
        for i in range(0, len(raws), 1000):
            results = [converter.convert(raw) for raw in raws[i:i + 1000]]
            spans = [span for r in results if isinstance(r, Converted) for span in r.spans]
            for j in range(0, len(spans), 512):
                to_protobuf_bytes(spans[j:j + 512])
        best = min(best, time.process_time() - started)
    return best / len(raws) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--side", choices=("default", "tuned"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        print(measure(args.side, args.messages))
        return
    for pair in range(1, args.pairs + 1):
        cost = {}
        for side in ("default", "tuned"):
            out = subprocess.run([sys.executable, str(HERE), "--side", side, "--messages", str(args.messages)],
                                 check=True, capture_output=True, text=True).stdout
            cost[side] = float(out.strip().splitlines()[-1])
        print(f"pair {pair}: default {cost['default']:.1f} µs/msg, tuned {cost['tuned']:.1f} µs/msg, "
              f"tuned/default {cost['tuned'] / cost['default']:.2f}", flush=True)


if __name__ == "__main__":
    main()
