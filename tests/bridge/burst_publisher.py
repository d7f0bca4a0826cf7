"""One client publishing traced messages as fast as it can (a burst), with one subscriber so
that each gives one trace message of ingress + egress; prints {"published", "seconds"}.

    python -m tests.bridge.burst_publisher URL COUNT [SUBJECT] [--ids FILE] [--pad BYTES]

`--ids FILE` writes the trace id (hex) of every message published, one a line, so that a
test can tell which traces arrived whole, not only how many spans.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from pathlib import Path

import nats
from nats.aio.msg import Msg


async def burst(url: str, count: int, subject: str, ids: Path | None = None, pad: int = 0) -> dict[str, float]:
    nc = await nats.connect(url)
    delivered = 0
    all_back = asyncio.Event()

    async def back(_msg: Msg) -> None:
        nonlocal delivered
        delivered += 1
        if delivered >= count:
            all_back.set()

    # The server delivers each message back to this subscriber (so the egress is traced).
    # Counting those deliveries is also how we know it processed every publish: nats-py's
    # flush() writes its PING ahead of publishes still in its buffer, so its PONG proves
    # nothing about them, and closing right after can lose them (the server, still writing
    # to us, gets a reset and drops what it had not read: seen as ~10 % missing at 30k).
    sub = await nc.subscribe(subject, cb=back, pending_msgs_limit=0, pending_bytes_limit=0)
    await nc.flush()
    trace_ids = [os.urandom(16).hex() for _ in range(count)]
    started = time.monotonic()
    for trace_id in trace_ids:
        traceparent = f"00-{trace_id}-{os.urandom(8).hex()}-01"
        headers = {"traceparent": traceparent, **({"x-pad": "p" * pad} if pad else {})}
        await nc.publish(subject, b"work", headers=headers)
    await nc.flush(timeout=30)
    try:
        await asyncio.wait_for(all_back.wait(), 60 + count / 10_000)
    except TimeoutError:
        raise SystemExit(f"burst_publisher: the server delivered {delivered:,} of {count:,} back") from None
    seconds = time.monotonic() - started
    await sub.unsubscribe()
    await nc.close()
    if ids is not None:
        ids.write_text("\n".join(trace_ids) + "\n")
    return {"published": count, "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("url")
    parser.add_argument("count", type=int)
    parser.add_argument("subject", nargs="?", default="app.work")
    parser.add_argument("--ids", type=Path, help="write the published trace ids (hex) here, one a line")
    parser.add_argument("--pad", type=int, default=0, help="a header of this many bytes: the server copies the "
                        "headers into its trace message, so this makes big trace messages")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(burst(args.url, args.count, args.subject, args.ids, args.pad))))


if __name__ == "__main__":
    main()
