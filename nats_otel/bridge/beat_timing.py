"""When the exchange's heartbeat loop next has something to do, and a sleep it can be woken
from earlier (`LinkExchange._beat`).

The loop used to wake every `soon_s` (a quarter of `link.wait` with trace ownership, 0.1 s
without) and look: most wake-ups found nothing due. A wake-up costs a Python process ~100 µs
of CPU on the test machine (`read_pacing`), four a second per bridge, idle or not, in every
bridge of a group. Now it sleeps until the first of what it does is due, computed from the
same facts it checks when it wakes, and whoever changes those facts for an earlier time
(data after a quiet spell, a newcomer to answer) wakes it (`Alarm.sooner`).
"""

from __future__ import annotations

import asyncio
import math

__all__ = ["Alarm", "next_beat_at"]


def next_beat_at(*, last_published: float, last_data: float, heartbeat_s: float, after_data_s: float,
                 soon_s: float, ticked: float | None, tick_s: float, told_until: float | None) -> float:
    """The first time (monotonic) the heartbeat loop has something to do:

    - a heartbeat, `heartbeat_s` after it last published anything;
    - the router's look for silent peers, `tick_s` after the last (`ticked`; None: no router);
    - a heartbeat soon after data: `soon_s` after it last published, while the data is at
      most `after_data_s` old, unless every peer was told its state by a forward since
      (`told_until`: the earliest of the peers' last forwards, None without a router; a
      router with no peer never needs one: `math.inf`)."""
    due = last_published + heartbeat_s
    if ticked is not None:
        due = min(due, ticked + tick_s)
    soon = last_published + soon_s
    if told_until is not None:  # `told_all(t - soon_s)` holds until the earliest told peer is older
        soon = max(soon, told_until + soon_s)
    if soon <= last_data + after_data_s:
        due = min(due, soon)
    return due


class Alarm:
    """A sleep until a time that can be cut short: `sooner(when)` wakes the sleeper when
    `when` comes before the time it sleeps until (then it computes anew). One sleeper."""

    __slots__ = ("_waiter", "due")

    def __init__(self) -> None:
        self._waiter: asyncio.Future[None] | None = None
        self.due = math.inf  # what the sleeper sleeps until (inf: nobody sleeps)

    async def sleep(self, seconds: float) -> None:
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        self.due = loop.time() + seconds
        timer = loop.call_later(max(0.0, seconds), _wake, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiter, self.due = None, math.inf

    def sooner(self, when: float) -> None:
        """Something is due at `when` (the loop's clock, `time.monotonic`): wake the sleeper
        if it would sleep past it."""
        if self._waiter is not None and when < self.due:
            _wake(self._waiter)


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
