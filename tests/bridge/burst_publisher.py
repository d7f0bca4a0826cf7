"""One client publishing traced messages as fast as it can (a burst), with one subscriber so
that each gives one trace message of ingress + egress; prints {"published", "seconds"}.

    python -m tests.bridge.burst_publisher URL COUNT [SUBJECT]
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

import nats


async def burst(url: str, count: int, subject: str) -> dict[str, float]:
    nc = await nats.connect(url)
    sub = await nc.subscribe(subject)  # never read: the server delivers, the egress is traced
    await nc.flush()
    started = time.monotonic()
    for _ in range(count):
        traceparent = f"00-{os.urandom(16).hex()}-{os.urandom(8).hex()}-01"
        await nc.publish(subject, b"work", headers={"traceparent": traceparent})
    await nc.flush(timeout=30)
    seconds = time.monotonic() - started
    await sub.unsubscribe()
    await nc.close()
    return {"published": count, "seconds": seconds}


if __name__ == "__main__":
    subject = sys.argv[3] if len(sys.argv) > 3 else "app.work"
    print(json.dumps(asyncio.run(burst(sys.argv[1], int(sys.argv[2]), subject))))
