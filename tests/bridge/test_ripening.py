"""The waiting line of both modes' batches (`bridge/ripening.py`): taken in order, and a
ripe small batch takes in the batches behind it whose link windows close within
`batch.coalesce` of its own, each once ripe, up to `batch.max_messages`; what it cannot take
(too late, too many, the end) is the next turn's. Pure: a queue, and `until` recording the
times it was asked to wait for."""

from __future__ import annotations

import asyncio

from nats_otel.bridge.ripening import COALESCE_BELOW, Ripening
from nats_otel.bridge.sources.delivery import delivery
from nats_otel.core.decode import RawTraceMessage


def _batch(ripe_at: float, size: int, tag: str):
    raws = [RawTraceMessage("trace.a", {}, f"{tag}{i}".encode()) for i in range(size)]
    return ripe_at, [delivery(raw, "a") for raw in raws], raws


def _line(*items, max_messages: int = 100, coalesce_s: float = 0.8):
    queue: asyncio.Queue = asyncio.Queue()
    for item in items:
        queue.put_nowait(item)
    return Ripening(queue, max_messages, coalesce_s)


async def _coalesced(ripening: Ripening, stop=lambda: False):
    waited: list[float] = []

    async def until(when: float) -> None:
        waited.append(when)

    first = await ripening.take()
    assert ripening.worth_coalescing(first[1])
    batch, raws = await ripening.coalesce(first, until, stop)
    assert [d.raw for d in batch] == raws  # the deliveries and their raw messages stay aligned
    return first[0], [raw.payload.decode() for raw in raws], waited


async def test_batches_whose_windows_close_within_the_coalesce_join_each_once_ripe():
    line = _line(_batch(10.0, 2, "a"), _batch(10.2, 2, "b"), _batch(10.8, 1, "c"), _batch(10.9, 1, "d"), None)
    ripe_at, payloads, waited = await _coalesced(line)
    assert ripe_at == 10.0 and payloads == ["a0", "a1", "b0", "b1", "c0"]
    assert waited == [10.2, 10.8]  # each joined once its own window closed
    assert (await line.take())[0] == 10.9  # too late for this one: the next turn's, in order
    assert await line.take() is None


async def test_only_what_waits_is_waited_for():
    """A burst's last batch, or a lone one: nothing behind it, no wait."""
    line = _line(_batch(5.0, 3, "a"))
    _, payloads, waited = await _coalesced(line)
    assert payloads == ["a0", "a1", "a2"] and waited == []


async def test_never_more_than_max_messages_and_the_end_is_kept_for_its_worker():
    line = _line(_batch(1.0, 40, "a"), _batch(1.1, 40, "b"), _batch(1.2, 40, "c"), None, max_messages=100)
    _, payloads, _ = await _coalesced(line)
    assert len(payloads) == 80  # a third would make 120
    assert (await line.take())[1][0].raw.payload == b"c0"
    assert await line.take() is None


async def test_none_join_once_stopped_and_none_are_lost():
    line = _line(_batch(1.0, 1, "a"), _batch(1.1, 1, "b"))
    _, payloads, waited = await _coalesced(line, stop=lambda: True)
    assert payloads == ["a0"] and waited == []
    assert (await line.take())[0] == 1.1  # still waiting: the worker counts it lost, or maps it


def test_only_small_batches_and_only_when_on():
    line = _line()
    assert line.worth_coalescing(_batch(0, COALESCE_BELOW - 1, "a")[1])
    assert not line.worth_coalescing(_batch(0, COALESCE_BELOW, "a")[1])
    assert not _line(coalesce_s=0.0).worth_coalescing(_batch(0, 1, "a")[1])


async def test_ripen_waits_for_its_own_window_and_coalesces_only_small_batches_while_not_draining():
    """`ripen`, as core mode's workers and JetStream mode's settlers call it: the batch's own
    window first; then, small and not draining, the batches behind it."""
    for size, draining, expected in [(2, False, ["a0", "a1", "b0"]), (2, True, ["a0", "a1"]),
                                     (COALESCE_BELOW, False, [f"a{i}" for i in range(COALESCE_BELOW)])]:
        line = _line(_batch(3.0, size, "a"), _batch(3.1, 1, "b"), max_messages=1000)
        waited: list[float] = []

        async def until(when: float, waited=waited) -> None:
            waited.append(when)

        batch, raws = await line.ripen(await line.take(), until, lambda: False, lambda draining=draining: draining)
        assert [raw.payload.decode() for raw in raws] == expected and [d.raw for d in batch] == raws
        assert waited == ([3.0, 3.1] if len(expected) == size + 1 else [3.0]), (size, draining, waited)


async def test_a_ripen_cancelled_while_coalescing_hands_back_every_batch_it_held():
    """The drain ran out of time and cancelled the worker while it waited for a batch it had
    taken in: `abandon` gives back its own batch and that one (for the caller to free their
    room and count them lost), and `left_waiting` what is still in the line: none is lost
    without a count. Its own batch's lists are never extended (worker processes know a batch
    by its raw list)."""
    first = _batch(1.0, 2, "a")
    line = _line(first, _batch(1.2, 1, "b"), _batch(1.4, 1, "c"), _batch(9.0, 1, "late"), None)
    blocked = asyncio.Event()

    async def until(when: float) -> None:
        if when == 1.4:  # the third batch's window: the drain cancels the worker here
            blocked.set()
            await asyncio.Event().wait()

    ripening = asyncio.ensure_future(line.ripen(await line.take(), until, lambda: False, lambda: False))
    await blocked.wait()
    ripening.cancel()
    try:
        await ripening
    except asyncio.CancelledError:
        pass
    held = line.abandon()
    assert [[d.raw.payload.decode() for d in batch] for batch in held] == [["a0", "a1"], ["b0"], ["c0"]]
    assert len(first[1]) == 2 and len(first[2]) == 2  # merged into new lists only
    assert line.abandon() == []  # handed back once
    assert [[d.raw.payload.decode() for d in batch] for batch in line.left_waiting()] == [["late0"]]
    assert line.left_waiting() == []


async def test_a_ripen_that_returns_holds_nothing_and_the_carried_batch_is_left_waiting():
    line = _line(_batch(1.0, 1, "a"), _batch(5.0, 1, "too-late"))

    async def until(when: float) -> None:
        pass

    await line.ripen(await line.take(), until, lambda: False, lambda: False)
    assert line.abandon() == []  # exported by its worker: not the drain's to count
    # The batch `coalesce` looked at and left for the next turn is out of the queue, but waits.
    assert [[d.raw.payload.decode() for d in batch] for batch in line.left_waiting()] == [["too-late0"]]
