"""Benchmark: CPU per trace message of each core stage, this checkout against another one
(a baseline), each in fresh processes, alternated round by round.

    git worktree add /tmp/base <commit>
    python bench/stage_ab.py /tmp/base [--stage prepare --stage link ...] [--rounds 6]

Stages, on the same replicated corpus (`corpus_replay.replicate`), GC off, best of 5
passes in each process: `prepare` (decode, trace context, identity, arrival), `link`
(`Linker.observe` of all, then `place` of each), `map` (`map_encode` of each), `network`
(`network_sample` of each) and `request` (`encode_request` per 512 spans). Each checkout's
hot path as it chooses it (`_core_api.hot_path`). The medians say more than the best on a
shared machine: `stage_costs.py` run once per checkout moves by 30 % here.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()
OURS = HERE.parent.parent
STAGES = ("prepare", "link", "map", "network", "request")
BATCH = 512


def measure(stage: str, messages: int) -> float:
    """In the child: microseconds of CPU per message of one stage, best of 5 passes."""
    sys.path.insert(1, str(HERE.parent))
    from _core_api import hot_path
    from corpus_replay import replicate

    from nats_otel.core.mapping import MappingOptions
    from nats_otel.core.span_bytes import EncodedSpans

    core = hot_path()
    raws = replicate(messages)
    prepared = [core.prepare(raw) for raw in raws]
    options = MappingOptions()
    linker = core.Linker(bounded=False)
    for p in prepared:
        linker.observe(p)
    pairs = [(p, linker.place(p)) for p in prepared]
    items = [EncodedSpans(*core.map_encode(p.msg, p.ctx, placement, options)[:3]) for p, placement in pairs]
    batches, batch, count = [], [], 0
    for item in items:
        batch.append(item)
        count += item.span_count
        if count >= BATCH:
            batches.append(batch)
            batch, count = [], 0

    def link() -> None:
        fresh = core.Linker(bounded=False)
        for p in prepared:
            fresh.observe(p)
        for p in prepared:
            fresh.place(p)

    work = {
        "prepare": lambda: [core.prepare(raw) for raw in raws],
        "link": link,
        "map": lambda: [core.map_encode(p.msg, p.ctx, placement, options) for p, placement in pairs],
        "network": lambda: [core.network_sample(p.msg, None) for p in prepared],
        "request": lambda: [core.encode_request(b) for b in batches],
    }[stage]
    gc.disable()
    best = float("inf")
    for _ in range(5):
        started = time.process_time()
        work()
        best = min(best, time.process_time() - started)
    return best / len(raws) * 1e6


def run(src: Path, stage: str, messages: int) -> float:
    env = {**os.environ, "PYTHONPATH": str(src)}  # the child imports that checkout's nats_otel
    out = subprocess.run([sys.executable, str(HERE), "--child", stage, "--messages", str(messages)],
                         cwd=src, env=env, check=True, capture_output=True, text=True)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("baseline", type=Path, nargs="?", help="the other checkout")
    parser.add_argument("--stage", action="append", choices=STAGES, help="(repeatable; default: all)")
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--child", choices=STAGES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(measure(args.child, args.messages))
        return
    if args.baseline is None:
        parser.error("give the baseline checkout")
    print(f"load average {os.getloadavg()[0]:.2f}; {args.messages:,} messages, {args.rounds} rounds")
    for stage in args.stage or STAGES:
        times: dict[str, list[float]] = {"ours": [], "baseline": []}
        for round_ in range(args.rounds):
            order = [("ours", OURS), ("baseline", args.baseline)]
            for name, src in order if round_ % 2 == 0 else order[::-1]:
                times[name].append(run(src, stage, args.messages))
        ours, base = statistics.median(times["ours"]), statistics.median(times["baseline"])
        print(f"{stage:8} ours {ours:6.2f} us/msg  baseline {base:6.2f} us/msg  (medians; best {min(times['ours']):.2f}"
              f" vs {min(times['baseline']):.2f}): ours uses {ours / base:.2f} of the baseline's CPU", flush=True)


if __name__ == "__main__":
    main()
