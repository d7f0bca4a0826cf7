"""The receive path's parse, per frame: `DirectParser.parse` over real trace payloads (the
replicated corpus), in 64 KiB reads, framed as nats-server frames the trace messages it
publishes itself (`MSG <subject> <sid>  <size>`: two spaces, no reply) and as it frames a
client's republished copy (one space), which is what the bridge benches publish.

    python bench/frame_parse.py                      # this checkout
    PYTHONPATH=/path/to/baseline python bench/frame_parse.py   # a baseline, built alike

Until 2026-11-27 the scanner served one space only: a server's own trace messages went to
nats-py's parser (3.1 against 0.5 µs a frame here), which no bench publishing copies saw.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from corpus_replay import replicate

from nats_otel.bridge.sources import direct, frames


def framed(raws: list, separator: bytes) -> bytes:
    return b"".join(b"MSG trace.a 1" + separator + str(len(raw.payload)).encode() + b"\r\n" + raw.payload + b"\r\n"
                    for raw in raws)


async def parse_all(data: bytes, expected: int) -> float:
    """CPU µs per frame of the parser fed `data` in 64 KiB reads; every frame must arrive."""
    client = direct.DirectClient()
    got: list[bytes] = []
    client._direct[1] = lambda _subject, _reply, _headers, payload: got.append(payload)
    reads = [data[at:at + 65536] for at in range(0, len(data), 65536)]
    started = time.thread_time()
    for read in reads:
        await client._ps.parse(read)
    spent = time.thread_time() - started
    if len(got) != expected:
        raise SystemExit(f"{len(got)} of {expected} frames arrived")
    return spent / expected * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    raws = replicate(args.messages, seed="frame-parse")
    print(f"scanner: {frames.IMPLEMENTATION}; best of {args.rounds} rounds of {args.messages:,} frames")
    for separator, name in ((b"  ", "a server's own trace message (two spaces)"),
                            (b" ", "a client's republished copy (one space)")):
        data = framed(raws, separator)
        best = min(asyncio.run(parse_all(data, len(raws))) for _ in range(args.rounds))
        print(f"  {name}: {best:.2f} µs per frame")


if __name__ == "__main__":
    main()
