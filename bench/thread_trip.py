"""What one trip between an asyncio event loop and a thread costs in CPU, whatever it carries:
`run_in_executor` of a function that does nothing, to a one-thread and a four-thread
executor (the bridge's processor lane and its export threads), and the same through a plain
thread and queue; the process's CPU seconds (both threads) and the wall time per trip.

    python bench/thread_trip.py [--trips 5000]

A batch of the core loop makes three such trips (observed, converted, exported): the part of
a batch's fixed cost that is not the export request itself (docs/performance.md, session 42).
"""

from __future__ import annotations

import argparse
import asyncio
import queue
import resource
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def measure(name: str, trip: Callable[[], Awaitable[object]], trips: int) -> None:
    await trip()
    cpu0, wall0 = cpu_s(), time.perf_counter()
    for _ in range(trips):
        await trip()
    cpu, wall = cpu_s() - cpu0, time.perf_counter() - wall0
    print(f"{name:<34} {cpu / trips * 1e6:6.1f} µs of CPU a trip, {wall / trips * 1e6:6.1f} µs wall")


async def main(trips: int) -> None:
    loop = asyncio.get_running_loop()
    for workers in (1, 4):
        pool = ThreadPoolExecutor(max_workers=workers)
        await measure(f"run_in_executor, {workers} thread(s)", lambda p=pool: loop.run_in_executor(p, int), trips)
        pool.shutdown()
    jobs: queue.SimpleQueue[asyncio.Future[object] | None] = queue.SimpleQueue()

    def lane() -> None:
        while (future := jobs.get()) is not None:
            loop.call_soon_threadsafe(future.set_result, None)

    thread = threading.Thread(target=lane, daemon=True)
    thread.start()

    def plain() -> asyncio.Future[object]:
        future = loop.create_future()
        jobs.put(future)
        return future

    await measure("a thread and a queue", plain, trips)
    jobs.put(None)
    thread.join()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trips", type=int, default=5000)
    asyncio.run(main(parser.parse_args().trips))
