"""Helpers of the bridge integration tests: a traced app, spans as comparable values,
the expected spans from `convert_batch` of the bridge's raw archive, /metrics scraping."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import time
import types
import urllib.request
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import nats
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from nats_otel.archive import read_archive
from nats_otel.bridge.loop import Bridge
from nats_otel.core.encode import to_protobuf
from nats_otel.core.pipeline import Converted, convert_batch

_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def traceparent() -> tuple[str, str, str]:
    """A fresh sampled traceparent and its trace id and parent span id (hex)."""
    trace_id, parent = os.urandom(16).hex(), os.urandom(8).hex()
    return f"00-{trace_id}-{parent}-01", trace_id, parent


def span_values(requests: Iterable[ExportTraceServiceRequest]) -> set[bytes]:
    """Every span with its resource, serialized deterministically: equal bytes = equal span."""
    out = set()
    for request in requests:
        for rs in request.resource_spans:
            resource = rs.resource.SerializeToString(deterministic=True)
            for ss in rs.scope_spans:
                for span in ss.spans:
                    out.add(resource + b"\x1f" + span.SerializeToString(deterministic=True))
    return out


def span_ids(requests: Iterable[ExportTraceServiceRequest]) -> set[bytes]:
    """Every exported span id."""
    return {span.span_id for r in requests for rs in r.resource_spans for ss in rs.scope_spans for span in ss.spans}


def spans_by_trace(requests: Iterable[ExportTraceServiceRequest]) -> dict[str, list[tuple[dict, object]]]:
    """trace id hex -> [(resource attributes as dict, span)] (duplicates removed)."""
    seen: set[bytes] = set()
    out: dict[str, list[tuple[dict, object]]] = {}
    for request in requests:
        for rs in request.resource_spans:
            res = {kv.key: _value(kv.value) for kv in rs.resource.attributes}
            for ss in rs.scope_spans:
                for span in ss.spans:
                    key = span.SerializeToString(deterministic=True)
                    if key in seen:
                        continue
                    seen.add(key)
                    out.setdefault(span.trace_id.hex(), []).append((res, span))
    return out


def attrs(span: object) -> dict:
    return {kv.key: _value(kv.value) for kv in span.attributes}  # type: ignore[attr-defined]


def _value(v: object) -> object:
    kind = v.WhichOneof("value")  # type: ignore[attr-defined]
    if kind == "array_value":
        return tuple(_value(x) for x in v.array_value.values)  # type: ignore[attr-defined]
    return getattr(v, kind) if kind else None


def archive_lines(path: Path) -> int:
    if not path.exists():
        return 0
    return sum(1 for line in path.read_bytes().splitlines() if line.strip())


def expected_ids_from_archive(path: Path) -> set[bytes]:
    """The span ids `convert` gives the archived raw messages."""
    return {s.span_id for r in convert_batch(read_archive([str(path)])) if isinstance(r, Converted) for s in r.spans}


def expected_from_archive(path: Path) -> tuple[set[bytes], int]:
    """What `convert` makes of the archived raw messages: (span values, rejected count)."""
    results = convert_batch(read_archive([str(path)]))
    spans = [s for r in results if isinstance(r, Converted) for s in r.spans]
    rejected = sum(1 for r in results if not isinstance(r, Converted))
    return span_values([to_protobuf(spans)]), rejected


async def wait_until(predicate, timeout: float, what: str, interval: float = 0.05, detail=None) -> None:
    """Wait for `predicate`; on timeout fail with `what` and, if given, `detail()` (the state
    that explains it, read at that moment)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}"
                                 + (f" ({detail()})" if detail is not None else ""))
        await asyncio.sleep(interval)


def bridge_counts(bridge) -> str:
    """The bridge's own account of where messages are: for a timeout's failure message."""
    totals: dict[str, float] = {}
    for family in bridge.metrics.registry.collect():
        for sample in family.samples:
            totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    names = ("nats_otel_messages_received_total", "nats_otel_messages_decoded_total",
             "nats_otel_messages_rejected_total", "nats_otel_messages_dropped_total", "nats_otel_spans_exported_total",
             "nats_otel_export_failures_total")
    counts = ", ".join(f"{n.removeprefix('nats_otel_')}={totals.get(n, 0.0):g}" for n in names)
    return f"{counts}; ready={bridge.ready()}"


def scrape(port: int, path: str = "/metrics") -> tuple[int, str]:
    try:
        with _NO_PROXY.open(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def scrape_openmetrics(port: int) -> str:
    """/metrics as Prometheus asks for it when it stores exemplars: the OpenMetrics format."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics",
                                     headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    with _NO_PROXY.open(request, timeout=5) as resp:
        assert resp.headers["Content-Type"].startswith("application/openmetrics-text")
        return resp.read().decode()


# `name_bucket{labels} count # {exemplar labels} value`: an OpenMetrics bucket with its exemplar.
_EXEMPLAR = re.compile(r'^(\w+)_bucket\{([^}]*)\} \S+ # \{([^}]*)\} (\S+)')
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def exemplars(text: str, name: str) -> list[tuple[dict[str, str], dict[str, str], float]]:
    """(series labels with `le`, exemplar labels, exemplar value) of each bucket of histogram
    `name` that has an exemplar, read from OpenMetrics text line by line."""
    out = []
    for line in text.splitlines():
        found = _EXEMPLAR.match(line)
        if found and found[1] == name:
            out.append((dict(_LABEL.findall(found[2])), dict(_LABEL.findall(found[3])), float(found[4])))
    return out


def exported_spans(requests: Iterable[ExportTraceServiceRequest]) -> set[tuple[str, str]]:
    """(trace id, span id), in hex, of every exported span."""
    return {(span.trace_id.hex(), span.span_id.hex())
            for r in requests for rs in r.resource_spans for ss in rs.scope_spans for span in ss.spans}


def metric(text: str, name: str, **labels: str) -> float:
    """The value of one sample in Prometheus text output (0.0 if absent)."""
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        sample, _, label_text = head.partition("{")
        if sample != name:
            continue
        got = ",".join(sorted(x for x in label_text.rstrip("}").split(",") if x))
        if got == want:
            return float(value)
    return 0.0


def archived(path: Path) -> list[tuple[str | None, str | None]]:
    """(trace id hex, server name) of each archived raw message; (None, None) if not JSON."""
    import base64
    import gzip as _gzip

    import orjson

    out: list[tuple[str | None, str | None]] = []
    if not path.exists():
        return out
    data = path.read_bytes()
    # Only whole lines: the bridge may be appending one as this reads (its end not yet written).
    for line in data[:data.rfind(b"\n") + 1].splitlines():
        if not line.strip():
            continue
        record = orjson.loads(line)
        payload = base64.b64decode(record["payload_b64"])
        if record.get("headers", {}).get("Content-Encoding") == ["gzip"]:
            payload = _gzip.decompress(payload)
        try:
            event = orjson.loads(payload)
            header = {k.lower(): v for k, v in event["request"]["header"].items()}
            out.append((header["traceparent"][0].split("-")[1], event["server"]["name"]))
        except (orjson.JSONDecodeError, KeyError, IndexError, TypeError):
            out.append((None, None))
    return out


async def wait_jetstream_answers(nc, timeout: float = 20) -> None:
    """Until the JetStream API answers on `nc`'s server and account. A topology is ready once
    its meta group has a leader; on a server without JetStream of its own, the API's interest
    can reach it a moment later (a bridge started then stops: JetStream does not answer)."""
    import nats.errors

    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        try:
            await nc.jetstream().account_info()
            return
        except (nats.errors.NoRespondersError, nats.errors.TimeoutError):
            if asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.2)


async def delete_stream(url: str, stream: str) -> None:
    """Delete a JetStream stream (a test's own, so that the next starts empty)."""
    nc = await nats.connect(url)
    try:
        await nc.jetstream().delete_stream(stream)
    finally:
        await nc.close()


async def start_bridge(settings, timeout: float = 20) -> tuple[Bridge, asyncio.Task]:
    """Run a Bridge in this event loop; returns once it is ready (or fails the test)."""
    bridge = Bridge(settings)
    task = asyncio.create_task(bridge.run())
    await wait_until(lambda: bridge.ready()[0] or task.done(), timeout, "bridge ready")
    assert not task.done(), task.result()
    return bridge, task


async def stop_bridge(bridge: Bridge, task: asyncio.Task, timeout: float = 20) -> int:
    """Drain the bridge as SIGTERM would; returns its exit code."""
    bridge.request_stop()
    return await asyncio.wait_for(task, timeout)


async def publish_traced(url: str, count: int, headers: dict[str, str] | None = None, subject: str = "app.work",
                         **connect: Any) -> list[str]:
    """`count` traced messages (with `headers` beside the traceparent), each delivered to a
    local subscriber: one trace message each. Returns once each came back (the server read
    them all: nats-py's flush alone does not say so, `direct.flush_in_order`). `connect`:
    nats-py's connect options (TLS, credentials)."""
    nc = await nats.connect(url, **connect)
    try:
        sub = await nc.subscribe(subject)
        await nc.flush()
        trace_ids = []
        for _ in range(count):
            tp, trace_id, _ = traceparent()
            trace_ids.append(trace_id)
            await nc.publish(subject, b"work", headers={"traceparent": tp, **(headers or {})})
        await nc.flush()
        for _ in range(count):
            await sub.next_msg(timeout=5)
        return trace_ids
    finally:
        await nc.close()


def terminate(proc: subprocess.Popen) -> None:
    """SIGTERM a process started by a test (a bridge drains), SIGKILL it if it hangs."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def load_bench(name: str) -> types.ModuleType:
    """A script of bench/ as a module (`bench/<name>.py`), registered under `<name>_bench`
    (dataclasses look their module up): the tests run the benches' scenarios, made small."""
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "bench" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"{name}_bench", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[f"{name}_bench"] = module
    spec.loader.exec_module(module)
    return module
