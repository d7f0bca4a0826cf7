"""The processor's one thread, and the event loop's own when that thread is idle and the work
is small, or is the compiled kernel's.

The processor's state (the link window, the report ledger) is touched by one thread at a
time, in the order the event loop asks: a one-thread executor gives that. Each trip through
it costs a sidecar wake-ups, though: the executor's thread is woken, and when it is done the
event loop is woken again through its self-pipe and runs the future's chain of callbacks.
On this project's 2-core test machine that is ~300-400 µs of CPU a trip whatever the trip
carries (`bench/batch_cost.py`), twice a batch (observe, then convert), five batches a
second while trace messages come. One of eight sidecars at a moderate rate has batches of
a few dozen trace messages, whose work is smaller than the trips (docs/scale-out.md, sixth
round).

So a small piece of work runs on the event loop's thread at once when nothing is queued
or running in the lane's thread (`run_on_lane(..., inline=True)`): the processor is still
touched by one thread at a time and in the loop's order, since only the loop submits and
the lane is idle. A small batch converted inline writes its `--archive` lines from the
loop's thread too: one unbuffered write of at most `INLINE_MESSAGES` lines, as the thread
would.

Where the compiled kernel runs, large batches run on the loop's thread too (`inline_limit`),
unless the bridge archives (a large write stays off the loop). The thread was there so that
the loop kept reading while a large batch was converted, but the kernel holds the GIL
through each call: no bytecode runs inside it, so no switch interval lets the loop in.
Measured (a 1 ms timer on the loop while 30 batches of 1,024 were observed and converted in
the lane's thread): the timer ran ~1.5 times a call, between the calls, with the compiled
kernel; with the pure-Python reference, which gives the GIL up every switch interval, about
every 8 ms. So for the kernel the thread bought the loop no reading, only what a trip costs:
the wake-ups, and a batch read on the other CPU after it was received on this one, its
results freed back here (a fifth of the loop's CPU, docs/performance.md, session 43).
Measured in issue 48's 60k burst against the thread: docs/performance.md, session 45.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

__all__ = ["INLINE_MESSAGES", "ProcessorLane", "inline_limit", "run_on_lane"]

T = TypeVar("T")

#: A batch of at most this many trace messages is observed and converted on the event
#: loop's thread when the lane is idle: ~1-3 ms of work at most (the kernel's ~13-20 µs a
#: message), a pause of the loop well inside one read interval (`nats.read_interval`).
INLINE_MESSAGES = 128


def inline_limit(compiled: bool, archiving: bool) -> float:
    """The most trace messages a batch may hold to run on the event loop's thread when the
    lane is idle: any number where the `compiled` kernel runs (it keeps the GIL through a
    call, so the thread would not let the loop read meanwhile; a full batch of 1,024 is
    ~5-15 ms of work, still well inside a read interval) and nothing is archived (a
    batch's `--archive` write stays off the loop), else `INLINE_MESSAGES`."""
    return math.inf if compiled and not archiving else INLINE_MESSAGES


class ProcessorLane(ThreadPoolExecutor):
    """A one-thread executor that knows when it is idle. Submit from one thread only (the
    event loop's): `idle` compares a count that thread writes with one the lane's thread
    writes, each written by one thread only, so no lock is needed."""

    def __init__(self, thread_name_prefix: str) -> None:
        super().__init__(max_workers=1, thread_name_prefix=thread_name_prefix)
        self._submitted = 0  # written by the submitting thread
        self._finished = 0  # written by the lane's thread, after the work returned or raised

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        self._submitted += 1
        try:
            return super().submit(self._counted, fn, args, kwargs)
        except BaseException:
            self._submitted -= 1  # refused (shut down): never runs
            raise

    def _counted(self, fn: Callable[..., T], args: tuple[Any, ...], kwargs: dict[str, Any]) -> T:
        try:
            return fn(*args, **kwargs)
        finally:
            self._finished += 1

    @property
    def idle(self) -> bool:
        """Nothing submitted is queued or running: the lane's thread touches nothing now, and
        will not until the next submit."""
        return self._submitted == self._finished


async def run_on_lane(lane: ProcessorLane, fn: Callable[..., T], *args: Any, inline: bool) -> T:
    """`fn(*args)` in the lane's order: on this (the event loop's) thread at once when `inline`
    and the lane is idle, else in the lane's thread."""
    if inline and lane.idle:
        return fn(*args)
    return await asyncio.get_running_loop().run_in_executor(lane, fn, *args)
