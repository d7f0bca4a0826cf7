"""The processor's lane: small work runs on the event loop's thread only while the lane's
thread has nothing queued or running, so the processor is still touched by one thread at a
time, in the order the loop asked."""

from __future__ import annotations

import asyncio
import threading

import pytest

from nats_otel.bridge.processor_lane import ProcessorLane, run_on_lane


def test_idle_work_runs_inline_and_busy_work_waits_its_turn_in_the_lane() -> None:
    async def scenario() -> None:
        lane = ProcessorLane("test-lane")
        loop_thread = threading.get_ident()
        order: list[str] = []
        release = threading.Event()

        def step(name: str) -> int:
            order.append(name)
            return threading.get_ident()

        def blocking() -> None:
            release.wait(10)
            order.append("blocking")

        try:
            assert lane.idle
            assert await run_on_lane(lane, step, "inline", inline=True) == loop_thread
            assert await run_on_lane(lane, step, "threaded", inline=False) != loop_thread

            busy = asyncio.get_running_loop().run_in_executor(lane, blocking)
            assert not lane.idle
            queued = asyncio.ensure_future(run_on_lane(lane, step, "after the busy one", inline=True))
            await asyncio.sleep(0.05)
            assert "after the busy one" not in order  # not run ahead on the loop's thread
            release.set()
            await busy
            assert await queued != loop_thread
            assert order == ["inline", "threaded", "blocking", "after the busy one"]
            assert lane.idle
        finally:
            release.set()
            lane.shutdown(wait=True)

    asyncio.run(scenario())


def test_a_failing_job_leaves_the_lane_idle_and_a_refused_submit_is_not_counted() -> None:
    async def scenario() -> None:
        lane = ProcessorLane("test-lane")

        def fail() -> None:
            raise ValueError("bad batch")

        with pytest.raises(ValueError, match="bad batch"):
            await run_on_lane(lane, fail, inline=False)
        assert lane.idle
        with pytest.raises(ValueError, match="bad batch"):
            await run_on_lane(lane, fail, inline=True)
        assert lane.idle
        lane.shutdown(wait=True)
        with pytest.raises(RuntimeError):
            lane.submit(len, "x")
        assert lane.idle

    asyncio.run(scenario())
