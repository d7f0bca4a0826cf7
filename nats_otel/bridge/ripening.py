"""The batches waiting out their link window, taken in order, and the small ones exported
together (`batch.coalesce`): core mode's workers and JetStream mode's settlers alike.

The intake (JetStream mode: the fetcher) hands each batch on with the time its link window
closes (`ripe_at`). Workers take them in that order, one worker at a time (`turn`, then
`ripen`), so that a worker can take in the batches behind the one it holds: a ripe batch of
fewer than `COALESCE_BELOW` trace messages takes the batches already waiting whose windows
close within `batch.coalesce` of its own, each once ripe, up to `batch.max_messages`. At a
moderate rate a sidecar's batches hold tens of trace messages each, five a second, and each
conversion, export request and round of accounting has a cost of its own whatever it holds
(docs/scale-out.md, eighth round): together, four or five cost one. Only what already waits
is waited for: a burst's last batch, or a lone one, is not held back. The worker converts
and exports after its turn, so as many exports as before run at once.

A worker cancelled while it ripens (the drain ran out of time) hands back what it held
(`abandon`: its batch and those it had taken in), and what still waits in the line is taken
out at the end (`left_waiting`): the caller frees their room and counts them lost, not one
silently. (The batches it takes in are merged into new lists, never the first's extended:
worker processes know a batch by its raw list, `Workers.observe`.)
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from nats_otel.bridge.processor_lane import INLINE_MESSAGES
from nats_otel.bridge.sources.delivery import Delivery
from nats_otel.core.decode import RawTraceMessage

__all__ = ["COALESCE_BELOW", "Ripening", "Waiting"]

# A batch waiting out `link.wait`: when it may be mapped, its deliveries, their raw messages.
Waiting = tuple[float, list[Delivery], list[RawTraceMessage]]
# Batches this small are converted on the event loop's thread (`processor_lane`), where
# their fixed costs weigh the most.
COALESCE_BELOW = INLINE_MESSAGES
_NOTHING = object()


class Ripening:
    """The waiting line (`queue`: batches in the order their windows close, then one None
    per worker at the end), taken one turn at a time."""

    def __init__(self, queue: asyncio.Queue[Waiting | None], max_messages: int, coalesce_s: float) -> None:
        self.queue = queue
        self.max_messages = max_messages
        self.coalesce_s = coalesce_s
        self.turn = asyncio.Lock()  # held by the worker taking and ripening batches
        self._carried: object = _NOTHING  # taken by `coalesce` and left for the next turn
        self._holding: list[list[Delivery]] = []  # the batches of the `ripen` under way

    async def take(self) -> Waiting | None:
        """The next waiting batch (None: the end, one per worker). Within `turn`."""
        carried, self._carried = self._carried, _NOTHING
        return await self.queue.get() if carried is _NOTHING else carried  # type: ignore[return-value]

    def worth_coalescing(self, batch: list[Delivery]) -> bool:
        return self.coalesce_s > 0 and len(batch) < COALESCE_BELOW

    async def ripen(self, item: Waiting, until: Callable[[float], Awaitable[None]], stop: Callable[[], bool],
                    draining: Callable[[], bool]) -> tuple[list[Delivery], list[RawTraceMessage]]:
        """`item`'s batch and raw messages once its window closed (`until`), with the batches
        behind it when it is small (`coalesce`), unless `draining()` by then (no more waits:
        what is left goes out as it is). Within `turn`."""
        ripe_at, batch, raws = item
        self._holding = [batch]
        await until(ripe_at)
        if self.worth_coalescing(batch) and not draining():
            batch, raws = await self.coalesce(item, until, stop)
        self._holding = []
        return batch, raws

    def abandon(self) -> list[list[Delivery]]:
        """The batches of a `ripen` that did not return (cancelled): its own and those it had
        taken in, for the caller to release and count. Within `turn`."""
        held, self._holding = self._holding, []
        return held

    def left_waiting(self) -> list[list[Delivery]]:
        """Every batch still in the line (the workers are gone: the drain ran out of time),
        taken out of it, for the caller to release and count."""
        left = [] if self._carried is _NOTHING or self._carried is None else [self._carried]
        self._carried = _NOTHING
        while not self.queue.empty():
            left.append(self.queue.get_nowait())
        return [item[1] for item in left if item is not None]  # type: ignore[index]

    async def coalesce(self, first: Waiting, until: Callable[[float], Awaitable[None]],
                       stop: Callable[[], bool]) -> tuple[list[Delivery], list[RawTraceMessage]]:
        """`first` (ripe) with the batches waiting behind it whose windows close within
        `coalesce_s` of its own, each awaited (`until`) before it joins, up to `max_messages`;
        none more once `stop()` (the drain's deadline passed: each left is counted lost).
        Their hops are decided no earlier than at their own window's end: never on less
        evidence. Within `turn`."""
        ripe_at, batch, raws = first
        last = ripe_at + self.coalesce_s
        while len(batch) < self.max_messages and not stop():
            try:
                item = self.queue.get_nowait()
            except asyncio.QueueEmpty:
                break
            if item is None or item[0] > last or len(batch) + len(item[1]) > self.max_messages:
                self._carried = item  # the next turn's (the end, too late, or too many)
                break
            self._holding.append(item[1])  # out of the line: the caller's, should this wait be cancelled
            await until(item[0])
            batch, raws = batch + item[1], raws + item[2]
        return batch, raws
