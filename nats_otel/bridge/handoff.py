"""Two steps of a batch in two thread pools, with one wake-up of the event loop.

The bridge converts a batch in its one conversion thread (the link state is touched by one
thread only) and exports it in an export thread (so the next batch is converted while this
one waits for the backend). Awaited step by step, each step wakes the event loop once more
when it ends (`run_in_executor`: a write to the loop's self-pipe and its read, the future's
state, the task's step): ~150 µs of the loop's CPU a wake-up on this machine
(`bench/loop_callbacks.py`), per batch. A bridge in a group of eight
collects five small batches a second like a bridge alone does, so what it pays per batch is
paid eight times for the same traffic (docs/scale-out.md). `then` hands the first step's
result to the second pool from the first thread itself: the loop wakes once, at the end.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import TypeVar

__all__ = ["then"]

T = TypeVar("T")
R = TypeVar("R")


def then(first_pool: Executor, first: Callable[[], T], second_pool: Executor,
         second: Callable[[T], R]) -> Future[R]:
    """`first()` in `first_pool`, then `second(its result)` in `second_pool`: one future for
    both (`asyncio.wrap_future` it), with the exception of whichever step raised. Cancelling
    it does not stop a step that has begun (as `run_in_executor`'s cannot). Raises at once,
    as `submit` does, when `first_pool` is shut down."""
    done: Future[R] = Future()
    done.set_running_or_notify_cancel()  # it runs from now on: no cancel may race the steps

    def second_step(value: T) -> None:
        try:
            result = second(value)
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting side, as an executor does
            done.set_exception(exc)
        else:
            done.set_result(result)

    def first_step() -> None:
        try:
            value = first()
            second_pool.submit(second_step, value)
        except BaseException as exc:  # noqa: BLE001 - the first step's, or the second pool shut down
            done.set_exception(exc)

    first_pool.submit(first_step)
    return done
