"""Small reads gathered: at a low rate a connection is read at most every `interval` seconds.

Every read of a socket wakes the process: on this project's 2-core test machine a wake-up
costs a Python process ~50 µs of CPU when a thread blocks in `recv`, ~115 µs through an
asyncio callback, before any work (`bench/read_cost.py`). At a moderate rate a sidecar's
share arrives in many small reads: one of eight bridges at 600 msgs/s read ~90 times a
second (its share of the trace messages, its peers' forwards, their heartbeats), a few
messages a read (docs/scale-out.md, fifth round). So after a small read (under
`SMALL_READ_BYTES`) that follows another within `RECENT_TICKS` intervals, the transport stops
reading until the next multiple of `interval` on the loop's clock (every connection of a
process resumes at the same instant: one wake-up for all), and what came meanwhile is read
at once. Reads of that size or more (a burst, a high rate) go on as data comes: a pause
never holds back more than what a low rate brings in one interval, far below what a server
buffers for a client (`max_pending`, 64 MB by default).

What it costs: a message waits at most `interval` more before the bridge reads it, and a
PONG too (a flush returns up to `interval` later). A batch's link window's end and the
heartbeats are moved to the ticks too (`tick_at_or_after`). A hop's two reports at two
bridges meet at the owner within two intervals and two batch delays (two reads, two
batches), inside the link window (`link.wait`, 1 s; `BridgeSettings.read_interval_allowed`
bounds the interval to keep it so).

The pause is asyncio's own flow control (`pause_reading`/`resume_reading`, as a
StreamReader uses it when its buffer is full); a transport the StreamReader paused itself is
left to it. At the tick the pacer reads the socket itself, in the timer's callback, through
the transport's own read handler (`_read_ready`: its errors and end of file handled as
asyncio handles them), and stays paused when that read was small again: while a trickle
lasts, a connection costs one callback a tick, not a resume (an `epoll_ctl`), a wake-up of
the loop for the read, its callback and a pause again (another `epoll_ctl`): ~100-150 µs of
CPU a tick on the test machine (docs/scale-out.md, seventh round). Only when the tick's read
finds nothing, or much, is the transport resumed. A transport without that handler (TLS:
asyncio's SSL transport) is resumed at the tick as before.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

__all__ = ["RECENT_TICKS", "SMALL_READ_BYTES", "ReadPacer", "next_tick", "tick_at_or_after"]

#: A read this size or larger means data is coming fast: read on, no pause. (asyncio reads
#: up to 256 KiB at a time; 64 KiB in one interval of 0.1 s is ~640 KB/s.)
SMALL_READ_BYTES = 64 * 1024


#: Reads come often when one came within this many intervals before: only then does a pause
#: gather anything. The resume at the tick is a wake-up of its own, so a read on its own (an
#: idle bridge's heartbeats and pull ends) is not paused; the read after a resume still is.
RECENT_TICKS = 2


def next_tick(now: float, interval: float) -> float:
    """The first multiple of `interval` after `now` (strictly after: a read at a tick waits
    for the next one)."""
    return (math.floor(now / interval) + 1) * interval


def tick_at_or_after(when: float, interval: float) -> float:
    """`when` moved to the first multiple of `interval` at or after it (`interval` 0: `when`).

    A process's timers on the ticks its reads resume at share their wake-ups: a batch's link
    window's end, a heartbeat's, each a wake-up of its own otherwise, and a wake-up costs
    more than most of what it does at a moderate rate (module docs). asyncio runs the timers
    due within the millisecond it wakes at, so the same tick computed twice is one wake-up."""
    if interval <= 0:
        return when
    return math.ceil(when / interval) * interval


class ReadPacer:
    """Pauses one connection's transport after a small read, until the next tick. Made on
    the connection's event loop, for its asyncio StreamReader `reader`."""

    __slots__ = ("_last_read", "_loop", "_reader", "_resume", "_ticking", "interval", "pauses", "reads", "tick_reads")

    def __init__(self, interval: float, reader: Any) -> None:
        self.interval = interval
        self._reader = reader
        self._loop = asyncio.get_running_loop()
        self._resume: asyncio.TimerHandle | None = None
        self._last_read = -math.inf  # the loop's time of the previous read
        self.reads = 0  # reads of the connection
        self.pauses = 0  # reads after which the transport paused (or stayed paused, at a tick)
        self.tick_reads = 0  # reads done at a tick, in the timer's callback, while paused
        self._ticking = False  # within such a read

    def after_read(self, size: int) -> None:
        """A read of `size` bytes was handed to the reader: pause its transport until the
        next tick when the read was small and came soon after another."""
        self.reads += 1
        if self.interval <= 0:
            return
        now = self._loop.time()
        previous, self._last_read = self._last_read, now
        if size >= SMALL_READ_BYTES or self._resume is not None:
            return
        if now - previous > RECENT_TICKS * self.interval:
            return  # a read on its own (a heartbeat, an idle pull's end): a pause would only add a wake-up
        transport = getattr(self._reader, "_transport", None)
        if self._ticking:  # read at a tick, paused: it stays so until the next
            self.tick_reads += 1
        elif transport is None or not transport.is_reading():  # closing, or paused by the reader itself
            return
        else:
            transport.pause_reading()
        self.pauses += 1
        self._resume = self._loop.call_at(next_tick(now, self.interval), self._resume_reading, transport)

    def _resume_reading(self, transport: Any) -> None:
        self._resume = None
        # A transport closing needs no reading; one whose StreamReader's buffer is full is
        # resumed by the reader as its task reads (`StreamReader._maybe_resume_transport`).
        if transport.is_closing() or getattr(self._reader, "_paused", False):
            return
        read_ready = getattr(transport, "_read_ready", None)
        if callable(read_ready):
            self._ticking = True
            try:
                read_ready()  # what came meanwhile, read here: no wake-up of its own
            finally:
                self._ticking = False
            if self._resume is not None or transport.is_closing():
                return  # a small read again (`after_read` set the next tick), or the end
        transport.resume_reading()
