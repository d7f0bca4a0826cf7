"""The processor's lane: small work runs on the event loop's thread only while the lane's
thread has nothing queued or running, so the processor is still touched by one thread at a
time, in the order the loop asked; any batch does where the compiled kernel runs and nothing
is archived (`inline_limit`)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from nats_otel.bridge.processor_lane import INLINE_MESSAGES, ProcessorLane, inline_limit, run_on_lane
from nats_otel.bridge.settings import load_settings
from nats_otel.devkit.processes import start_topology
from nats_otel.devkit.receivers import OTLPGrpcReceiver
from nats_otel.devkit.topology import single_server
from tests.bridge.bridge_helpers import publish_traced, start_bridge, stop_bridge, wait_until


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


def test_any_batch_is_inline_where_the_kernel_runs_and_nothing_is_archived() -> None:
    assert inline_limit(compiled=True, archiving=False) > 10_000  # past `batch.max_messages`'s bound
    assert inline_limit(compiled=True, archiving=True) == INLINE_MESSAGES
    assert inline_limit(compiled=False, archiving=False) == INLINE_MESSAGES


@pytest.mark.integration
@pytest.mark.timeout(120)
@pytest.mark.parametrize("archiving", [False, True])
async def test_a_large_batch_is_converted_on_the_loops_thread_where_the_kernel_runs(kernel, tmp_path,
                                                                                  archiving) -> None:
    """A real bridge (compiled kernel) fed a batch of more than `INLINE_MESSAGES` trace
    messages: observed and converted on the event loop's thread, every span exported; with
    `--archive`, in the lane's thread, as before."""
    with start_topology(single_server()) as topo:
        receiver = OTLPGrpcReceiver().start()
        url = topo.client_url("n1", "a")
        overrides: dict = {
            "sources": [{"name": "a", "urls": [url], "subjects": ["trace.a"]}],
            "otlp": {"endpoint": receiver.endpoint, "protocol": "grpc"},
            "batch": {"max_delay": 1.0},  # the burst below in one or two batches
        }
        if archiving:
            overrides["archive"] = str(tmp_path / "archive.jsonl")
        bridge, task = await start_bridge(load_settings(overrides=overrides, env={}))
        threads: dict[str, list[tuple[int, int]]] = {"observe": [], "convert": []}
        for name in threads:  # the bridge's own calls, the thread and batch size of each recorded
            call = getattr(bridge.processor, name)

            def recorded(raws, *args, _call=call, _name=name):
                threads[_name].append((threading.get_ident(), len(raws)))
                return _call(raws, *args)

            setattr(bridge.processor, name, recorded)
        try:
            trace_ids = await publish_traced(url, 600, subject="app.lane")
            await wait_until(lambda: {s.trace_id.hex() for _, s in receiver.spans()} >= set(trace_ids), 30,
                             "every trace's spans")
        finally:
            assert await stop_bridge(bridge, task) == 0
            receiver.stop()
    loop_thread = threading.get_ident()
    for name, calls in threads.items():
        large = [thread for thread, size in calls if size > INLINE_MESSAGES]
        assert large, (name, calls)  # the burst made a large batch
        assert all((thread == loop_thread) != archiving for thread in large), (name, archiving, calls)
