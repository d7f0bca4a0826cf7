"""`nats-otel bridge` as its own process, for the benches and the tests that run real bridges:
started (from this checkout, or `BRIDGE_CHECKOUT`'s), asked (its /readyz and /metrics),
stopped; its spans counted; a queue group's bridges awaited until they agree who is in it.

Environment, for the runs that need to look inside the bridges (never for figures):
`BRIDGE_CHECKOUT` (another checkout's package: paired A/B runs), `BRIDGE_CPROFILE`,
`BRIDGE_WRAP` (e.g. bench/loop_callbacks.py), `BRIDGE_LOG_LEVEL`.
"""

from __future__ import annotations

import asyncio
import http.client
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from nats_otel.devkit.hop_score import read_otlp_json_lines
from nats_otel.devkit.server_config import free_ports

#: The traced account's user on every topology the benches start (`DEFAULT_ACCOUNTS`).
USER, PASSWORD = "a", "pwd"
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class Bridge:
    """`nats-otel bridge` as its own process on one server, writing OTLP/JSON lines."""

    def __init__(self, workdir: Path, server: str, url: str, subjects: list[str], queue: str | None,
                 workers: int = 1, extra: Sequence[str] = (), otlp_endpoint: str | None = None) -> None:
        self.server = server
        self.output = workdir / f"spans-{server}.otlp.jsonl"
        self.port = free_ports(1)[0]
        self.log_path = workdir / f"bridge-{server}.log"
        # BRIDGE_CPROFILE=DIR: each bridge runs under cProfile (its event loop's thread),
        # writing DIR/<server>.prof at exit: where a bridge's own time goes, never for figures.
        profile = os.environ.get("BRIDGE_CPROFILE")
        wrap = ["-m", "cProfile", "-o", str(Path(profile) / f"{server}.prof")] if profile else []
        # BRIDGE_WRAP=SCRIPT: each bridge runs as `SCRIPT -m nats_otel.cli bridge ...`, e.g.
        # bench/loop_callbacks.py (its event loop's CPU by callback).
        if os.environ.get("BRIDGE_WRAP"):
            wrap = [os.environ["BRIDGE_WRAP"]]
        # BRIDGE_LOG_LEVEL=INFO: the bridges' logs (`bridge-<server>.log` in the run's folder)
        # say more than their warnings, e.g. when each heard its peers (a failed run's why).
        # `otlp_endpoint`: OTLP/gRPC to that receiver instead of OTLP/JSON lines to `output`.
        exporting = ["--otlp-endpoint", otlp_endpoint] if otlp_endpoint else ["--output", str(self.output)]
        argv = [sys.executable, *wrap, "-m", "nats_otel.cli", "bridge", "--nats-url", url, "--user", USER,
                "--password", PASSWORD, *exporting, "--metrics-port", str(self.port),
                "--log-level", os.environ.get("BRIDGE_LOG_LEVEL", "WARNING"), "--log-format", "text"]
        for subject in subjects:
            argv += ["--subject", subject]
        if queue:
            argv += ["--queue", queue]
        if workers > 1:
            argv += ["--workers", str(workers)]
        argv += extra  # more `nats-otel bridge` flags (e.g. --mode jetstream --stream S --durable D)
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        # BRIDGE_CHECKOUT=DIR: the bridges run that checkout's package (a baseline build, its
        # kernel built in place), the harness this one's: paired A/B runs of the same scenario.
        self._env = dict(os.environ)
        if os.environ.get("BRIDGE_CHECKOUT"):
            self._env["PYTHONPATH"] = os.environ["BRIDGE_CHECKOUT"]
        self._argv = argv
        self._relaunches = 0
        self.proc = self._launch()

    def _launch(self) -> subprocess.Popen[bytes]:
        return subprocess.Popen(self._argv, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True,
                                env=self._env, cwd=os.environ.get("BRIDGE_CHECKOUT") or None)

    def _relaunched_on_a_new_port(self) -> bool:
        """The metrics port `free_ports` chose was taken before the bridge bound it (another
        process's connection or listener got it meanwhile: the tests run in parallel): start
        it again on another, at most twice. False when that was not why it exited."""
        if self._relaunches >= 2 or "Address already in use" not in self.log_tail():
            return False
        self._relaunches += 1
        at = self._argv.index("--metrics-port") + 1
        self.port = free_ports(1)[0]
        self._argv[at] = str(self.port)
        self._log.write(f"\n[harness] metrics port taken: relaunched on {self.port}\n".encode())
        self._log.flush()
        self.proc = self._launch()
        return True

    def get(self, path: str) -> tuple[int, str]:
        """(status, body) of `path` on the bridge's metrics port; (0, "") when nothing answers
        there, or something that is not HTTP does: another process took the port before the
        bridge bound it (a nats-server of a test running beside it answers with its INFO line),
        and the bridge, refused the port, exits and is relaunched (`wait_ready`)."""
        try:
            with _NO_PROXY.open(f"http://127.0.0.1:{self.port}{path}", timeout=2) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, ""
        except (OSError, http.client.HTTPException):
            return 0, ""

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                if self._relaunched_on_a_new_port():
                    continue
                raise RuntimeError(f"bridge on {self.server} exited: {self.log_tail()}")
            if self.get("/readyz")[0] == 200:
                return
            time.sleep(0.1)
        raise RuntimeError(f"bridge on {self.server} not ready in {timeout} s: {self.log_tail()}")

    def metrics(self) -> Counter[str]:
        """`nats_otel_*` samples (name with labels -> value)."""
        out: Counter[str] = Counter()
        for line in self.get("/metrics")[1].splitlines():
            name, _, value = line.rpartition(" ")
            if line.startswith("nats_otel_") and "_created" not in name:
                out[name] = float(value)  # type: ignore[assignment]
        return out

    def members(self) -> int | None:
        """The trace owners this bridge knows (`nats_otel_route_members`), itself included;
        None without trace ownership (0: worker processes, the exchange off) or an answer."""
        value = self.metrics().get("nats_otel_route_members")
        return int(value) if value else None

    def stop(self, timeout: float = 30.0) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-2000:] if self.log_path.exists() else ""


def server_spans(bridges: list[Bridge]) -> int:
    """Server spans written so far (their ids: a span written twice counts once)."""
    lines = [line for b in bridges if b.output.exists() for line in whole_lines(b.output.read_bytes())]
    return len({span.span_id for span in read_otlp_json_lines(lines)})


def whole_lines(data: bytes) -> list[bytes]:
    """The lines a bridge has finished writing: its file exporter appends a batch in one
    write, but a reader can see that write half done (the kernel copies it page by page)."""
    return data[: data.rfind(b"\n") + 1].splitlines()


async def wait_members(bridges: Sequence[Bridge], timeout: float = 30.0) -> list[str]:
    """Until every bridge of a queue group knows all of them as trace owners: [] then, else
    a note of what each knows. A group just started
    agrees within a second or two (each hears a newcomer's first heartbeat); until then two
    of them may give one trace two owners, and its hops across them go unlinked, as for any
    membership change mid-traffic. A deployment's bridges run long before the traffic they
    trace: so do the runs', traffic once the group agrees, not after a fixed wait that a
    loaded machine outlasts."""
    def agreed() -> bool:
        members = [b.members() for b in bridges]
        return all(m is None for m in members) or all(m == len(bridges) for m in members)

    if await wait_until(agreed, timeout, 0.2):
        return []
    return [f"the bridges never agreed on their members: {[b.members() for b in bridges]}"]


async def wait_until(predicate: Any, timeout: float, interval: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(interval)
    return True
