"""The heartbeat loop's schedule (`bridge.beat_timing`): it sleeps until something is due,
computed from what it checks when it wakes, and is woken sooner when that changes."""

from __future__ import annotations

import asyncio
import math
import time

from nats_otel.bridge.beat_timing import Alarm, next_beat_at

BASE = {"heartbeat_s": 1.0, "after_data_s": 2.0, "soon_s": 0.25, "tick_s": 0.5}


def test_idle_it_wakes_for_the_heartbeat_and_the_router_look_only() -> None:
    # No data for long: a heartbeat a second after the last, the router's look each half second.
    assert next_beat_at(last_published=10.0, last_data=0.0, ticked=None, told_until=None, **BASE) == 11.0
    assert next_beat_at(last_published=10.0, last_data=0.0, ticked=10.2, told_until=math.inf, **BASE) == 10.7


def test_soon_after_data_unless_every_peer_was_told_by_a_forward() -> None:
    # Data just now, no router (the evidence exchange): a heartbeat soon_s after the last.
    assert next_beat_at(last_published=10.0, last_data=10.1, ticked=None, told_until=None, **BASE) == 10.25
    # With a router whose every peer got a forward at 10.3 or later: not before that is soon_s old.
    assert next_beat_at(last_published=10.0, last_data=10.1, ticked=10.4, told_until=10.3, **BASE) == 10.55
    # A router with no peer never needs one soon (told_all holds): only its look and the heartbeat.
    assert next_beat_at(last_published=10.0, last_data=10.1, ticked=10.4, told_until=math.inf, **BASE) == 10.9
    # Data too old by the time a soon heartbeat would go: none.
    assert next_beat_at(last_published=10.0, last_data=7.0, ticked=None, told_until=None, **BASE) == 11.0


async def test_the_alarm_sleeps_its_time_or_is_woken_sooner() -> None:
    alarm = Alarm()
    started = time.monotonic()
    await alarm.sleep(0.05)
    assert time.monotonic() - started >= 0.045 and alarm.due == math.inf  # nobody sleeps now
    sleeper = asyncio.create_task(alarm.sleep(30.0))
    await asyncio.sleep(0.01)
    alarm.sooner(alarm.due + 1.0)  # later than it sleeps until: it sleeps on
    await asyncio.sleep(0.01)
    assert not sleeper.done()
    alarm.sooner(time.monotonic())  # due now: woken
    await asyncio.wait_for(sleeper, 1.0)
    alarm.sooner(0.0)  # nobody sleeps: nothing to wake, no error
