"""bench/bridge_throughput.py, the instruments: a counting OTLP/gRPC receiver, CPU and RSS
sampling of a process tree from /proc, and the bridge's /metrics."""

from __future__ import annotations

import os
import threading
import time
import urllib.request
from pathlib import Path

_CLK = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


class Receiver:
    """A real OTLP/gRPC TraceService counting spans and, per trace id, the first arrival."""

    def __init__(self) -> None:
        from concurrent.futures import ThreadPoolExecutor

        import grpc
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
            ExportTraceServiceResponse,
        )

        self.lock = threading.Lock()
        self.reset(track=False)
        response = ExportTraceServiceResponse().SerializeToString()

        def export(request: ExportTraceServiceRequest, context) -> bytes:
            now = time.time()
            n = 0
            track = self.track
            first = self.first_seen
            for rs in request.resource_spans:
                for ss in rs.scope_spans:
                    spans = ss.spans
                    n += len(spans)
                    if track:
                        for span in spans:
                            tid = span.trace_id
                            if tid not in first:
                                first[tid] = now
            with self.lock:
                self.spans += n
                self.requests += 1
                # Only requests with spans mark the window: the bridge's readiness probe (an
                # empty request, sent before anything is published) must not open it.
                if n:
                    if not self.first:
                        self.first = now
                    self.last = now
            return response

        handler = grpc.method_handlers_generic_handler("opentelemetry.proto.collector.trace.v1.TraceService", {
            "Export": grpc.unary_unary_rpc_method_handler(
                export, request_deserializer=ExportTraceServiceRequest.FromString,
                response_serializer=lambda b: b),
        })
        self.server = grpc.server(ThreadPoolExecutor(max_workers=4), handlers=[handler],
                                  options=[("grpc.so_reuseport", 0), ("grpc.max_receive_message_length", 64 << 20)])
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()
        self.endpoint = f"http://127.0.0.1:{self.port}"

    def reset(self, track: bool) -> None:
        with self.lock:
            self.spans = self.requests = 0
            self.first = self.last = 0.0
            self.track = track
            self.first_seen: dict[bytes, float] = {}

    def wait_quiet(self, expected: int, quiet: float, timeout: float) -> None:
        """Until `expected` spans arrived, or none came for `quiet` s (after the first), or timeout."""
        deadline = time.time() + timeout
        seen, since = -1, time.time()
        while time.time() < deadline:
            n = self.spans
            if n >= expected:
                return
            if n != seen:
                seen, since = n, time.time()
            elif n and time.time() - since > quiet:
                return
            time.sleep(0.1)

    def stop(self) -> None:
        self.server.stop(None).wait()


def _descendants(pid: int) -> list[int]:
    out, frontier = [pid], [pid]
    while frontier:
        parent = frontier.pop()
        for path in Path(f"/proc/{parent}/task").glob("*/children"):
            try:
                kids = [int(x) for x in path.read_text().split()]
            except OSError:
                continue
            out.extend(kids)
            frontier.extend(kids)
    return out


def _cpu_rss(pids: list[int]) -> tuple[float, int]:
    cpu, rss = 0.0, 0
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            cpu += (int(stat[11]) + int(stat[12])) / _CLK
            rss += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * _PAGE
        except (OSError, IndexError, ValueError):
            continue
    return cpu, rss


class Sampler:
    """Samples CPU seconds and RSS of a process tree every 0.25 s (peak RSS, CPU between marks)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak_rss = 0
        self.dead: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            _, rss = _cpu_rss(_descendants(self.pid))
            self.peak_rss = max(self.peak_rss, rss)

    def cpu(self) -> float:
        return _cpu_rss(_descendants(self.pid))[0]

    def stop(self) -> None:
        self._stop.set()


def scrape(port: int) -> dict[str, float]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    out: dict[str, float] = {}
    try:
        text = opener.open(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    except OSError:
        return out
    for line in text.splitlines():
        name, _, value = line.rpartition(" ")
        if line.startswith("nats_otel_") and not name.split("{")[0].endswith("_created"):
            out[name] = float(value)
    return out


def total(metrics: dict[str, float], prefix: str) -> float:
    """Sum of the samples whose name (with labels) starts with `prefix` (counters: `_total`)."""
    return sum(v for k, v in metrics.items() if k.startswith(prefix) and "_total" in k)
