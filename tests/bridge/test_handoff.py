"""`handoff.then`: two steps in two real thread pools, one future for both."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from nats_otel.bridge import handoff
from nats_otel.bridge.intake import Intake
from nats_otel.bridge.sources.delivery import Delivery, size_of
from nats_otel.core.decode import RawTraceMessage


@pytest.fixture
def pools():
    first, second = (ThreadPoolExecutor(1, thread_name_prefix="first"),
                     ThreadPoolExecutor(2, thread_name_prefix="second"))
    yield first, second
    first.shutdown(wait=True)
    second.shutdown(wait=True)


async def test_the_second_step_gets_the_first_ones_result_in_its_own_pool(pools) -> None:
    first_pool, second_pool = pools
    where: list[str] = []

    def first() -> int:
        where.append(threading.current_thread().name)
        return 20

    def second(value: int) -> int:
        where.append(threading.current_thread().name)
        return value + 1

    assert await asyncio.wrap_future(handoff.then(first_pool, first, second_pool, second)) == 21
    assert where[0].startswith("first") and where[1].startswith("second")


async def test_batches_keep_their_order_in_the_first_pool(pools) -> None:
    first_pool, second_pool = pools
    seen: list[int] = []
    futures = [handoff.then(first_pool, lambda n=n: seen.append(n) or n, second_pool, lambda v: v * 2)
               for n in range(50)]
    assert await asyncio.gather(*map(asyncio.wrap_future, futures)) == [n * 2 for n in range(50)]
    assert seen == list(range(50))  # one conversion thread: in the order submitted


async def test_either_steps_exception_reaches_the_awaiting_side(pools) -> None:
    first_pool, second_pool = pools
    ran_second: list[object] = []

    def boom() -> int:
        raise ValueError("first failed")

    with pytest.raises(ValueError, match="first failed"):
        await asyncio.wrap_future(handoff.then(first_pool, boom, second_pool, ran_second.append))
    assert ran_second == []  # the second step never ran

    def bad(value: int) -> int:
        raise KeyError(value)

    with pytest.raises(KeyError):
        await asyncio.wrap_future(handoff.then(first_pool, lambda: 7, second_pool, bad))


async def test_a_second_pool_shut_down_fails_the_future_not_the_thread(pools) -> None:
    first_pool, second_pool = pools
    second_pool.shutdown(wait=True)
    with pytest.raises(RuntimeError, match="shutdown"):
        await asyncio.wrap_future(handoff.then(first_pool, lambda: 1, second_pool, lambda v: v))
    first_pool.shutdown(wait=True)
    with pytest.raises(RuntimeError):  # the first pool shut down: at once, as `submit` raises
        handoff.then(first_pool, lambda: 1, second_pool, lambda v: v)


def _delivery(n: int) -> Delivery:
    raw = RawTraceMessage("trace.a", {}, b"x" * n)
    return Delivery(raw, "default", size_of(raw), None, 0)


async def test_the_collector_wakes_once_when_its_batch_can_fill_or_its_time_is_up() -> None:
    intake = Intake(1 << 20)
    loop = asyncio.get_running_loop()
    started = loop.time()
    await intake.wait_count(3, 0.05)  # nothing comes: back after the timeout, the waiter gone
    assert loop.time() - started >= 0.04 and intake._waiter is None
    waiting = asyncio.create_task(intake.wait_count(3, 30.0))
    await asyncio.sleep(0.01)
    intake.offer(_delivery(1))
    intake.offer(_delivery(2))
    await asyncio.sleep(0.01)
    assert not waiting.done()  # two of three: still waiting
    intake.offer(_delivery(3))
    await asyncio.wait_for(waiting, 5)
    assert intake._waiter is None and intake.qsize() == 3
    batch = await intake.collect(10, lambda: 0.02, 1.0, lambda: None)
    assert [len(d.raw.payload) for d in batch] == [1, 2, 3]
    getter = asyncio.create_task(intake.get(30.0))
    await asyncio.sleep(0.01)
    getter.cancel()  # a cancelled wait leaves no waiter behind for the next offer to wake
    with pytest.raises(asyncio.CancelledError):
        await getter
    assert intake._waiter is None and intake.offer(_delivery(4)) and await intake.get(0.01) is not None
