"""Whether the exporters have shown that they reach their backends, for `/readyz`.

An exporter is unproven at start-up. It is proven by a successful export, or by a probe:
one empty OTLP export request (`probe()`), sent at start-up and then again, with a growing
pause, for as long as the exporter is unproven or its last export failed. An empty request
was chosen over a TCP connect because it also shows that the endpoint speaks OTLP and takes
our credentials (an answer 401/403 is "authorization", 404 "not found"); the backend sees
an export of zero spans, which OTLP allows. An exporter without `probe` (the file) counts as
proven until an export of it fails.

Everything here runs on the event loop except the probes themselves (a thread of their own,
so a probe never waits behind a long export); a probe's answer is dropped when an export
result arrived meanwhile, as the newer word on the backend.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from nats_otel.bridge.export.result import ExportResult

__all__ = ["BackendReadiness", "describe"]

log = logging.getLogger("nats_otel.bridge")

_PROBE_FIRST_PAUSE_S = 0.5
_PROBE_MAX_PAUSE_S = 5.0

_WHAT = {
    "unreachable": "unreachable",
    "timeout": "no answer in time",
    "authorization": "authorization refused (check the otlp headers / client certificate)",
    "not_found": "not found (wrong URL path, or not an OTLP trace endpoint)",
    "unavailable": "answers, but is unavailable",
    "invalid": "refused the request as invalid",
    "refused": "refused the request",
}


def describe(endpoint: str, result: ExportResult) -> str:
    """`OTLP endpoint URL: what: error` (the error text is the backend's or the socket's)."""
    what = _WHAT.get(result.kind, "failed")
    return f"OTLP endpoint {endpoint}: {what}: {result.error[:300]}"


class _Backend:
    __slots__ = ("endpoint", "exporter", "problem", "version")

    def __init__(self, exporter: Any, problem: str | None) -> None:
        self.exporter = exporter
        self.endpoint: str = getattr(exporter, "endpoint", None) or exporter.name
        self.problem = problem   # None: proven reachable
        self.version = 0         # bumped by every export result


class BackendReadiness:
    """Per exporter: proven reachable, or why not."""

    def __init__(self, exporters: Iterable[Any]) -> None:
        self._backends: dict[str, _Backend] = {}
        for exporter in exporters:
            probe = callable(getattr(exporter, "probe", None))
            self._backends[exporter.name] = _Backend(exporter, "not checked yet" if probe else None)
        self._changed = asyncio.Event()

    def status(self) -> tuple[bool, list[str]]:
        """(all proven, the problems). Called from the HTTP thread too: it copies, then reads."""
        problems = [b.problem for b in list(self._backends.values()) if b.problem is not None]
        return not problems, problems

    def note_export(self, name: str, result: ExportResult) -> None:
        """An export's result: the newest word on its backend."""
        backend = self._backends.get(name)
        if backend is None:  # a worker process's exporter: known by name only
            backend = self._backends[name] = _Backend(_Named(name), None)
        backend.version += 1
        if result.ok:
            self._set(backend, None)
        else:
            self._set(backend, "last export failed: " + describe(backend.endpoint, result))

    def _set(self, backend: _Backend, problem: str | None) -> None:
        was, backend.problem = backend.problem, problem
        if was is not None and problem is None:
            log.info("OTLP backend reachable", extra={"fields": {"endpoint": backend.endpoint}})
        elif problem is not None and problem != was:
            self._changed.set()

    async def watch(self, stopping: asyncio.Event) -> None:
        """Probe the unproven backends until `stopping`, pausing 0.5 s doubling to 5 s."""
        probed = [b for b in self._backends.values() if callable(getattr(b.exporter, "probe", None))]
        if not probed:
            return
        loop = asyncio.get_running_loop()
        pause = _PROBE_FIRST_PAUSE_S
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="nats-otel-probe") as pool:
            while not stopping.is_set():
                due = [b for b in probed if b.problem is not None]
                for backend in due:
                    version = backend.version
                    result = await loop.run_in_executor(pool, backend.exporter.probe)
                    if backend.version != version:
                        continue  # an export answered meanwhile: it is the newer word
                    self._probed(backend, result)
                if any(b.problem is not None for b in probed):
                    wait, pause = pause, min(pause * 2, _PROBE_MAX_PAUSE_S)
                else:
                    wait, pause = None, _PROBE_FIRST_PAUSE_S  # all proven: until one fails
                self._changed.clear()
                await _first_of(stopping, self._changed, wait)

    def _probed(self, backend: _Backend, result: ExportResult) -> None:
        # The backend judged an empty request's content: it was reached, and let us in.
        if result.ok or result.kind == "invalid":
            self._set(backend, None)
            return
        problem = describe(backend.endpoint, result)
        if problem != backend.problem:  # each new reason once; the same one again is quiet
            log.warning("OTLP backend not reachable", extra={"fields": {
                "endpoint": backend.endpoint, "kind": result.kind, "error": result.error[:300]}})
        backend.problem = problem


class _Named:
    """Stands for an exporter that lives in a worker process."""

    def __init__(self, name: str) -> None:
        self.name = name


async def _first_of(stopping: asyncio.Event, changed: asyncio.Event, timeout: float | None) -> None:
    waits = [asyncio.ensure_future(stopping.wait()), asyncio.ensure_future(changed.wait())]
    try:
        await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
