"""The core-mode intake: received trace messages held until their batch is done, bounded in
bytes.

A count bound would size memory by the smallest messages and drop bursts of ordinary ones;
bytes bound what is held whatever the messages' size. A message is charged its payload
plus `MESSAGE_OVERHEAD` (its Python objects: the delivery, the raw message, its header
dict), so the bound holds for floods of tiny messages too; the charge is the delivery's
`size`, computed once when it was made (`sources.delivery`).

A message stays charged after it is taken for a batch, until `release`: batches wait out
`link.wait` before they are mapped, and under a burst that wait holds as many messages as
the intake itself. So the bound is on everything the bridge holds, not only the waiting
line (the JetStream path bounds what it holds alike: `sources.jetstream.Held`). Callers
run on the event loop only (NATS callbacks offer, the batcher takes and releases): no locks.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from nats_otel.bridge.sources.delivery import MESSAGE_OVERHEAD, Delivery, charge
from nats_otel.core import accel

__all__ = ["DELAYED_BATCHES", "MESSAGE_OVERHEAD", "Intake", "charge"]

# Batches waiting out `link.wait` (core and JetStream mode): a rate times the wait, a few
# dozen at most in practice; this only bounds the pathological case (then intake backs up,
# and drops are counted).
DELAYED_BATCHES = 4096


class _IntakeState:
    """An intake's numbers and queue (`Intake.__init__` says what each is) and `offer`, the
    one step per message. The reference of its compiled twin, `sources._frames.IntakeState`,
    which keeps them as C fields: the compiled receive path (`DeliverySink`) offers without
    a Python call or attribute look-up per message (issue 48)."""

    __slots__ = ("_items", "_stopped", "_waiter", "_wanted", "bytes", "held", "max_bytes", "max_messages")
    _items: deque[Delivery]
    _stopped: bool
    _waiter: asyncio.Future[None] | None
    _wanted: int
    bytes: int
    held: int
    max_bytes: int
    max_messages: int | None

    def offer(self, delivery: Delivery) -> bool:
        """Queue `delivery`; False (nothing queued) when it does not fit."""
        size = delivery.size
        items = self._items
        if self.bytes + size > self.max_bytes or (
                self.max_messages is not None and len(items) >= self.max_messages):
            return False
        items.append(delivery)
        self.bytes += size
        self.held += 1
        if self._waiter is not None and len(items) >= self._wanted:
            _wake(self._waiter)
        return True


if TYPE_CHECKING:
    _State = _IntakeState
else:
    _compiled_frames = accel.compiled("nats_otel.bridge.sources._frames")
    _State = _IntakeState if _compiled_frames is None else _compiled_frames.IntakeState


class Intake(_State):
    """A FIFO of deliveries that refuses (never blocks) when `max_bytes` or `max_messages`
    would be exceeded; the caller counts the refusal as a drop. `bytes` and `held` count
    what waits and what was taken but not yet released."""

    __slots__ = ()

    def __init__(self, max_bytes: int, max_messages: int | None = None) -> None:
        self.max_bytes = max_bytes
        self.max_messages = max_messages
        self.bytes = 0
        self.held = 0
        self._items: deque[Delivery] = deque()
        # The one collector waiting (`_wait`), woken when `_wanted` deliveries wait: a batch
        # being collected wakes once when it can fill or its time is up, not at every message
        # that trickles in (from a queue group's share, or forwarded by the other bridges a
        # few at a time). A bare future and a timer, not `asyncio.wait_for` on an Event:
        # that made a task per wait and three more callbacks per wake-up, each ~20-100 µs
        # of the event loop's CPU on the test machine, several times a batch (docs/scale-out.md,
        # seventh round).
        self._waiter: asyncio.Future[None] | None = None
        self._wanted = 1
        self._stopped = False  # `stop_waiting`: no wait for a first delivery any more

    def get_nowait(self) -> Delivery | None:
        """The oldest delivery, or None when empty. It stays charged until `release`d."""
        if not self._items:
            return None
        return self._items.popleft()

    def take(self, limit: int) -> list[Delivery]:
        """Up to `limit` of the oldest deliveries, at once (a batch is collected with one call,
        not one per message). They stay charged until `release`d."""
        items = self._items
        if len(items) <= limit:
            taken = list(items)
            items.clear()
        else:
            popleft = items.popleft
            taken = [popleft() for _ in range(limit)]
        return taken

    def release(self, deliveries: Sequence[Delivery]) -> None:
        """Taken deliveries are done with (exported, or counted lost): their room is free."""
        self.bytes -= sum([delivery.size for delivery in deliveries])
        self.held -= len(deliveries)

    async def get(self, timeout: float | None) -> Delivery | None:
        """The oldest delivery, waiting at most `timeout` seconds for one (None: until one
        comes or `stop_waiting`); None when none came."""
        if not self._items and not self._stopped:
            await self._wait(1, timeout)
        return self.get_nowait()

    def stop_waiting(self) -> None:
        """The drain: a collector waiting for a first delivery returns empty-handed, and none
        waits for one again (what is offered still queues, and is collected)."""
        self._stopped = True
        if self._waiter is not None:
            _wake(self._waiter)

    async def collect(self, max_messages: int, delay_s: Callable[[], float], idle_s: float | None,
                      on_first: Callable[[], None]) -> list[Delivery]:
        """A batch: up to `max_messages` deliveries, taken at most `delay_s()` (read when the
        first is taken) after the first one; none when nothing came within `idle_s` (None:
        until something comes, or `stop_waiting`).
        `on_first` runs as the first is taken (`Wholeness.collecting`).

        Its end is not moved to a read tick (as the link window's end and the heartbeats are,
        `read_pacing.tick_at_or_after`): tried, an owner then left a stream of alike messages
        under one traceparent `ambiguous` (450 of 1,200 hops) in 2 of 12 loaded runs of
        `test_ownership.py::test_one_traceparent_for_a_stream_of_alike_bursts`, 0 of 16 without."""
        first = await self.get(idle_s)
        if first is None:
            return []
        on_first()
        batch = [first]
        flush_at = time.monotonic() + delay_s()
        while True:
            batch += self.take(max_messages - len(batch))
            left = flush_at - time.monotonic()
            if len(batch) >= max_messages or left <= 0:
                return batch
            await self.wait_count(max_messages - len(batch), left)

    async def wait_count(self, count: int, timeout: float) -> None:
        """Wait until `count` deliveries wait, or `timeout` seconds passed (whichever first)."""
        if len(self._items) < count:
            await self._wait(count, timeout)

    async def _wait(self, count: int, timeout: float | None) -> None:
        """Until `count` deliveries wait, `timeout` seconds pass (None: no limit) or
        `stop_waiting`. One collector at a time (the batcher)."""
        assert self._waiter is None, "one collector at a time"
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        self._wanted = count
        timer = None if timeout is None else loop.call_later(max(0.0, timeout), _wake, waiter)
        try:
            await waiter
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()

    def qsize(self) -> int:
        """Deliveries waiting to be taken (not those taken and not yet released)."""
        return len(self._items)

    def empty(self) -> bool:
        return not self._items


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
