"""Small reads gathered (`bridge/sources/read_pacing.py`), against a real nats-server: with a
`read_interval`, messages trickling in are read a few at a time, one read per tick, every one
in order; without it, one read per message; a large read never pauses; the bridge's settings
keep the interval inside the link window.
"""

from __future__ import annotations

import asyncio
import time

import nats
import pytest

from nats_otel.bridge.settings import SettingsError, load_settings
from nats_otel.bridge.sources import direct
from nats_otel.bridge.sources.read_pacing import RECENT_TICKS, SMALL_READ_BYTES, next_tick, tick_at_or_after
from tests.bridge.bridge_helpers import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

SUBJECT = "trace.paced"


@pytest.mark.parametrize(("now", "interval", "expected"), [
    (0.0, 0.1, 0.1), (0.05, 0.1, 0.1), (0.1, 0.1, 0.2), (12.34, 0.25, 12.5), (7.0, 0.5, 7.5)])
def test_the_next_tick_is_the_first_multiple_strictly_after_now(now: float, interval: float,
                                                                 expected: float) -> None:
    assert next_tick(now, interval) == pytest.approx(expected)


@pytest.mark.parametrize(("when", "interval", "expected"), [
    (0.0, 0.1, 0.0), (0.05, 0.1, 0.1), (0.1, 0.1, 0.1), (12.34, 0.25, 12.5), (7.3, 0.0, 7.3)])
def test_a_timer_moves_to_the_first_tick_at_or_after_it(when: float, interval: float, expected: float) -> None:
    assert tick_at_or_after(when, interval) == pytest.approx(expected)


async def trickle(url: str, interval: float, count: int = 40, gap_s: float = 0.01
                  ) -> tuple[int, int, int, float, int]:
    """`count` small messages `gap_s` apart to a DirectClient with `interval`: (reads, pauses,
    messages got in order, seconds the publishing took, reads done at a tick while paused)."""
    client = direct.DirectClient(interval)
    await client.connect(url)
    got: list[bytes] = []
    await client.subscribe_direct(SUBJECT, lambda _s, _r, _h, payload: got.append(payload))
    await client.flush()
    publisher = await nats.connect(url)
    try:
        parser = client._ps
        assert isinstance(parser, direct.DirectParser) and direct.READ_UNSUPPORTED is None
        await publisher.flush()
        await asyncio.sleep(0.3)  # start-up's reads are over
        pacer = parser.pacer
        assert pacer is not None
        reads, pauses, tick_reads = pacer.reads, pacer.pauses, pacer.tick_reads
        sent = [f"m{i}".encode() for i in range(count)]
        started = time.monotonic()
        for payload in sent:
            await publisher.publish(SUBJECT, payload)
            await publisher.flush()
            await asyncio.sleep(gap_s)
        took = time.monotonic() - started
        await wait_until(lambda: len(got) == count, 30, "every message")
        assert got == sent
        return pacer.reads - reads, pacer.pauses - pauses, len(got), took, pacer.tick_reads - tick_reads
    finally:
        await publisher.close()
        await client.close()


async def test_a_trickle_is_read_once_a_tick_every_message_in_order(url: str) -> None:
    """40 messages 10 ms apart: with an interval of 0.2 s, at most one read per tick of the
    time they took (and the one that started the first pause); without, one read each."""
    reads, pauses, got, took, tick_reads = await trickle(url, 0.2)
    assert got == 40
    assert pauses >= 1
    assert reads <= took / 0.2 + 3, f"{reads} reads in {took:.2f} s: not one per tick"
    # While the trickle lasts, a tick reads what came in the timer's own callback and the
    # connection stays paused (no resume, no wake-up for the read, no pause again).
    assert 1 <= tick_reads <= pauses
    unpaced_reads, unpaced_pauses, _, _, unpaced_tick_reads = await trickle(url, 0.0)
    assert unpaced_pauses == 0 and unpaced_tick_reads == 0
    assert unpaced_reads > reads  # each message woke the unpaced client, not the paced one


async def test_only_small_reads_that_come_often_pause(url: str) -> None:
    """A read on its own (more than `RECENT_TICKS` intervals after the one before) does not
    pause: the resume would be a wake-up of its own. A read of `SMALL_READ_BYTES` or more means
    data comes fast: reading goes on. A small read soon after another pauses the connection
    until the next tick."""
    interval = 0.5
    client = direct.DirectClient(interval)
    await client.connect(url)
    await client.subscribe_direct(SUBJECT, lambda _s, _r, _h, _payload: None)
    await client.flush()
    try:
        parser = client._ps
        reader = direct._stream_reader(client)
        assert isinstance(parser, direct.DirectParser) and parser.pacer is not None and reader is not None
        pacer, transport = parser.pacer, reader._transport
        await wait_until(transport.is_reading, 10, "the start-up's pause ended at its tick")
        await asyncio.sleep(RECENT_TICKS * interval + 0.1)  # an idle connection: no read since
        pauses = pacer.pauses
        pacer.after_read(100)
        assert transport.is_reading() and pacer.pauses == pauses, "a read on its own paused"
        pacer.after_read(SMALL_READ_BYTES)
        assert transport.is_reading() and pacer.pauses == pauses, "a large read paused"
        pacer.after_read(SMALL_READ_BYTES - 1)
        assert not transport.is_reading() and pacer.pauses == pauses + 1
        await wait_until(transport.is_reading, 10, "reading again at the next tick")
    finally:
        await client.close()


def test_the_bridge_keeps_the_interval_inside_the_link_window() -> None:
    """The default (0.1 s) stands with the default link window, is lowered to what a short
    one allows, and an interval set too long for it is refused with the reason."""
    def settings(**sections: dict[str, float]) -> float:
        source = {"name": "a", "urls": ["nats://127.0.0.1:4222"], "subjects": ["trace.a"]}
        return load_settings(overrides={"sources": [source], "output": "/dev/null", **sections},
                             env={}).nats.read_interval

    assert settings() == 0.1
    assert settings(link={"wait": 0.6}) == pytest.approx((0.6 - 2 * 0.2) / 4)
    assert settings(link={"wait": 0.4}) == 0.0
    assert settings(nats={"read_interval": 0.15}) == 0.15
    with pytest.raises(SettingsError, match=r"'nats.read_interval': at most 0.15 s with link.wait 1 s"):
        settings(nats={"read_interval": 0.2})
