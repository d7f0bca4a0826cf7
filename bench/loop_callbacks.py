"""Where an event loop's thread spends its CPU, callback by callback: runs a module (`-m
nats_otel.cli bridge ...`) with asyncio's `Handle._run` timed by the thread's own CPU clock,
and at exit writes `<dir>/<pid>.txt`: per callback (a task's coroutine, or the function
called), its CPU milliseconds, calls and microseconds a call, with the thread's total.

    BRIDGE_WRAP=bench/loop_callbacks.py LOOP_CALLBACKS_DIR=/tmp/cb python bench/scale_out.py --bridges 8

Two thread-CPU readings a callback (~1 µs): for comparing runs, not for figures. The loop's
own work between callbacks (the selector's wait, timers) is the total less the callbacks.

A window of the run: SIGUSR1 starts the counts anew, SIGUSR2 writes them so far to
`<dir>/<pid>.window.txt` (bench/scale_out.py sends both around the traffic, so that the
figures are the traffic's alone, without the start, the idle spell and the drain).
"""

from __future__ import annotations

import asyncio.events
import atexit
import os
import runpy
import signal
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

_stats: defaultdict[str, list[int]] = defaultdict(lambda: [0, 0])  # name -> [calls, CPU ns]
_run = asyncio.events.Handle._run


def _name(handle: Any) -> str:
    callback = handle._callback
    owner = getattr(callback, "__self__", None)
    if owner is not None and hasattr(owner, "get_coro"):  # a task's step: name its coroutine
        coro = owner.get_coro()
        return "task:" + getattr(coro, "__qualname__", repr(coro))
    callback = getattr(callback, "func", callback)  # functools.partial
    return getattr(callback, "__qualname__", repr(callback))


def _timed_run(self: Any) -> None:
    started = time.thread_time_ns()
    try:
        _run(self)
    finally:
        entry = _stats[_name(self)]
        entry[0] += 1
        entry[1] += time.thread_time_ns() - started


def _write(started_ns: int, suffix: str = "") -> None:
    directory = Path(os.environ.get("LOOP_CALLBACKS_DIR", "."))
    directory.mkdir(parents=True, exist_ok=True)
    lines = [f"main thread total {(time.thread_time_ns() - started_ns) / 1e6:.1f} ms"]
    for name, (calls, ns) in sorted(_stats.items(), key=lambda item: -item[1][1]):
        lines.append(f"{ns / 1e6:9.1f} ms {calls:7d} {ns / max(calls, 1) / 1e3:8.1f} us  {name}")
    (directory / f"{os.getpid()}{suffix}.txt").write_text("\n".join(lines) + "\n")


_window_started = [0]


def _start_window(*_: Any) -> None:
    _stats.clear()
    _window_started[0] = time.thread_time_ns()


def _write_window(*_: Any) -> None:
    _write(_window_started[0], ".window")


def main() -> None:
    if len(sys.argv) < 3 or sys.argv[1] != "-m":
        raise SystemExit("usage: loop_callbacks.py -m MODULE [ARGS...]")
    asyncio.events.Handle._run = _timed_run  # type: ignore[method-assign]
    atexit.register(_write, time.thread_time_ns())
    signal.signal(signal.SIGUSR1, _start_window)
    signal.signal(signal.SIGUSR2, _write_window)
    sys.argv = sys.argv[2:]
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
