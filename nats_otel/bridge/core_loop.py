"""Core mode's loops (`loop.Bridge` runs them, `tasks`): collect, route, observe, wait out
`link.wait`, convert, export.

One intake task collects batches from the bridge's intake, keeps the trace messages of the
traces this bridge owns (the others go to their owners, `routing`), records their hop
evidence at once and puts them in the waiting line (`ripening`); `_inflight` workers take
them from the line in order, one at a time, and convert and export each once its link
window closed, a small one together with those ripening behind it (`batch.coalesce`).

Nothing goes silently when the drain runs out of time (`drain_timeout` and its grace): a
batch a worker comes to afterwards is counted and not exported, and a worker cancelled
while it ripens counts what it held (`Ripening.abandon`); what still waits in the line
when the workers are gone is counted by the bridge's drain (`Ripening.left_waiting`). All
through `Bridge._drain_lost`, as the bridge counts what is left in its intake.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Iterable, Sequence
from typing import Protocol

from nats_otel.bridge.intake import DELAYED_BATCHES
from nats_otel.bridge.loop_bridge import LoopBridge
from nats_otel.bridge.ripening import Ripening, Waiting
from nats_otel.bridge.sources.delivery import Delivery
from nats_otel.bridge.wholeness import Wholeness

__all__ = ["tasks"]


class Bridge(LoopBridge, Protocol):
    """What these loops read of `loop.Bridge` beyond what both modes' loops read."""

    wholeness: Wholeness

    def _drop_waiting(self) -> None: ...

    def _drain_lost(self, batches: Iterable[Sequence[Delivery]]) -> None: ...


def tasks(bridge: Bridge) -> tuple[list[asyncio.Task[None]], Ripening]:
    """The intake task and the workers, started; the line between them (for the drain)."""
    delayed: asyncio.Queue[Waiting | None] = asyncio.Queue(maxsize=DELAYED_BATCHES)
    batch = bridge.settings.batch
    ripening = Ripening(delayed, batch.max_messages, batch.coalesce)
    started = [asyncio.create_task(_intake(bridge, delayed))]
    started += [asyncio.create_task(_worker(bridge, ripening)) for _ in range(bridge._inflight)]
    return started, ripening


async def _intake(bridge: Bridge, delayed: asyncio.Queue[Waiting | None]) -> None:
    """Collect batches, keep the trace messages of the traces this bridge owns (the
    others go to their owners), record their hop evidence at once, hand them on to wait."""
    if bridge.router is not None:
        await bridge.router.settled()
    while True:
        if bridge._past_deadline():
            bridge._drop_waiting()
        else:
            batch = await bridge._collect()
            if batch:
                collected_ns = bridge.wholeness.collected()
                if bridge.router is not None:
                    batch = await bridge.router.route(batch, functools.partial(bridge.wholeness.streams, collected_ns))
                    if not batch:
                        bridge.wholeness.observed(collected_ns)
                        continue
                    if bridge.exchange is not None:  # soon after data, say how long it has been whole
                        bridge.exchange.note_data()
                raws = [d.raw for d in batch]
                try:
                    ripe_at = await bridge._observe(batch, raws, collected_ns)
                finally:
                    bridge.wholeness.observed(collected_ns)
                await delayed.put((ripe_at, batch, raws))
                continue
            if not (bridge._intake_done and bridge.intake.empty()):
                continue
        for _ in range(bridge._inflight):
            await delayed.put(None)
        return


async def _worker(bridge: Bridge, ripening: Ripening) -> None:
    while True:
        async with ripening.turn:  # one worker at a time takes batches, in order, and ripens them
            item = await ripening.take()
            if item is None:
                return
            _, batch, raws = item
            if bridge._past_deadline():  # the drain ran out of time: counted, not exported
                bridge._drain_lost([batch])
                continue
            try:
                batch, raws = await ripening.ripen(item, bridge._until, bridge._past_deadline, bridge._draining)
            except BaseException:  # cancelled while it waited (the drain ran out): none exported
                bridge._drain_lost(ripening.abandon())
                raise
        try:
            await bridge._process(batch, raws)
        finally:
            bridge.intake.release(batch)
