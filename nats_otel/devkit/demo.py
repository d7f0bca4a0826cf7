"""`nats-otel demo`: the whole path on one machine, with nothing but this package installed.

It starts, in this order, and stops again in reverse (also on Ctrl-C, SIGTERM and errors):

1. an in-process OTLP/gRPC receiver (`nats_otel.devkit.receivers`) that every span is sent to;
2. real nats-servers (`devkit.topology.demo_topology()`): cluster ``east`` of 3 plus ``leaf-1``, a
   leafnode of east-1; account A traces every message with a sampled traceparent to ``trace.a``;
3. the bridge (in-process `Bridge`) on east-1, subscribed to ``trace.a``;
4. the instrumented app, `nats_otel.devkit.traced_app` (``examples/traced_app.py`` in a clone is
   the same file): consumers on east-3 and leaf-1, the
   producer on east-2. So each message crosses routes (east-2 -> east-3, east-2 -> east-1)
   and a leafnode (east-1 -> leaf-1), and every server on the way reports it.

Then it waits (bounded) until every trace is complete: the producer span, the origin server
span under it, a downstream server span under every forwarding egress, and a consumer span
per consumer. It prints the trees, writes every received span as OTLP/JSON lines, and with
an endpoint forwards the very same export requests to a real backend (OTLP/gRPC).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, TextIO
from urllib.parse import urlsplit

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from nats_otel.core.mapping import SCOPE_NAME
from nats_otel.core.records import Resource, SpanKind, SpanRecord, StatusCode
from nats_otel.core.render import render_traces

__all__ = ["DemoError", "DemoOptions", "DemoReport", "run_demo", "to_otlp_json_dict"]

BRIDGE_SERVER = "east-1"
PRODUCER_SERVER = "east-2"
CONSUMER_SERVERS = ("east-3", "leaf-1")
TRACE_SUBJECT = "trace.a"


class DemoError(RuntimeError):
    """The demo could not run (topology failure, incomplete traces)."""


@dataclass(slots=True, frozen=True)
class DemoOptions:
    """What `nats-otel demo` was asked to do."""

    messages: int = 5
    output: Path = Path("nats-otel-demo.otlp.jsonl")
    otlp_endpoint: str | None = None
    subject: str = "demo.orders"
    timeout: float = 20.0
    color: bool = False
    workdir: Path | None = None


@dataclass(slots=True)
class TraceState:
    """What arrived so far for one sent message."""

    trace_id: bytes
    producer_span_id: bytes
    spans: list[tuple[Any, Any, str]] = field(default_factory=list)  # (resource, span, scope)

    def missing(self, consumers: int) -> list[str]:
        """What this trace still lacks; empty when complete."""
        app = [s for _, s, scope in self.spans if scope != SCOPE_NAME]
        nats = [s for _, s, scope in self.spans if scope == SCOPE_NAME]
        out = []
        if not any(s.span_id == self.producer_span_id for s in app):
            out.append("producer span")
        got = sum(1 for s in app if s.kind == SpanKind.CONSUMER and s.parent_span_id == self.producer_span_id)
        if got < consumers:
            out.append(f"{consumers - got} consumer span(s)")
        if not any(s.kind == SpanKind.CONSUMER and s.parent_span_id == self.producer_span_id for s in nats):
            out.append("origin server span")
        parents = {s.parent_span_id for s in nats if s.kind == SpanKind.CONSUMER}
        for s in nats:
            attrs = _attributes(s.attributes)
            forwarded = attrs.get("messaging.nats.trace.hop") and not attrs.get("messaging.nats.trace.note")
            if s.kind == SpanKind.PRODUCER and forwarded and s.span_id not in parents:
                out.append(f"server span of hop {attrs['messaging.nats.trace.hop']}")
        return out


@dataclass(slots=True)
class DemoReport:
    """The outcome: traces by message, what was written and forwarded."""

    traces: list[TraceState]
    requests: list[ExportTraceServiceRequest]
    missing: dict[str, list[str]]
    pids: list[int]
    forwarded: str | None = None

    @property
    def span_count(self) -> int:
        return sum(len(ss.spans) for r in self.requests for rs in r.resource_spans for ss in rs.scope_spans)


# --- the app users copy -------------------------------------------------------------------------


def load_example() -> ModuleType:
    """The instrumented app users copy, as a module: the demo runs exactly that code.

    It ships inside the package (`nats_otel/devkit/traced_app.py`; `examples/traced_app.py` in
    a clone links to it), so the demo runs from an installed wheel in any folder.
    """
    from nats_otel.devkit import traced_app

    return traced_app


# --- protobuf spans: OTLP/JSON and records for the tree ----------------------------------------


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return tuple(str(_value(x)) for x in v.array_value.values)
    if kind == "kvlist_value":
        return str(v.kvlist_value)
    return getattr(v, kind) if kind else ""


def _attributes(kvs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in kvs}


def _record(resource: Any, span: Any) -> SpanRecord:
    return SpanRecord(
        trace_id=span.trace_id, span_id=span.span_id, parent_span_id=span.parent_span_id,
        name=span.name, kind=span.kind, start_ns=span.start_time_unix_nano, end_ns=span.end_time_unix_nano,
        resource=Resource(tuple(_attributes(resource.attributes).items())),
        attributes=tuple(_attributes(span.attributes).items()),
        status_code=span.status.code, status_message=span.status.message, trace_state=span.trace_state,
    )


def to_otlp_json_dict(request: ExportTraceServiceRequest) -> dict[str, Any]:
    """OTLP/JSON of one received request: protobuf's JSON mapping, but hex ids, integer enums."""
    doc = json_format.MessageToDict(request, use_integers_for_enums=True)
    for rs in doc.get("resourceSpans", []):
        for ss in rs.get("scopeSpans", []):
            for span in ss.get("spans", []):
                for obj in (span, *span.get("links", [])):
                    for key in ("traceId", "spanId", "parentSpanId"):
                        if obj.get(key):
                            obj[key] = _b64_to_hex(obj[key])
    return doc


def _b64_to_hex(text: str) -> str:
    import base64

    return base64.b64decode(text).hex()


def _iter_spans(requests: list[ExportTraceServiceRequest]) -> Iterator[tuple[Any, Any, str]]:
    for request in requests:
        for rs in request.resource_spans:
            for ss in rs.scope_spans:
                for span in ss.spans:
                    yield rs.resource, span, ss.scope.name


# --- running ----------------------------------------------------------------------------------


def run_demo(options: DemoOptions, out: TextIO = sys.stdout) -> DemoReport:
    """Run the demo; print trees and summary to ``out``; raise `DemoError` if it cannot."""
    from nats_otel.devkit.processes import TopologyError, start_topology
    from nats_otel.devkit.receivers import OTLPGrpcReceiver
    from nats_otel.devkit.topology import demo_topology

    example = load_example()
    previous = signal.getsignal(signal.SIGTERM)
    # SIGTERM unwinds like Ctrl-C, through every `finally` below: nothing is left running.
    signal.signal(signal.SIGTERM, _raise_interrupt)
    started = time.monotonic()
    try:
        with contextlib.ExitStack() as stack:
            receiver = stack.enter_context(OTLPGrpcReceiver(max_workers=8))
            workdir = options.workdir or Path(
                stack.enter_context(tempfile.TemporaryDirectory(prefix="nats-otel-demo-")))
            print(f"OTLP receiver on {receiver.endpoint}; starting nats-servers in {workdir} ...", file=out, flush=True)
            try:
                topo = stack.enter_context(start_topology(demo_topology(), workdir))
            except TopologyError as exc:
                raise DemoError(f"the embedded topology did not start: {exc}") from exc
            pids = list(topo.pids.values())
            print(f"nats-server pids {pids}: cluster east (east-1..3) + leaf-1 (leafnode of east-1), "
                  f"started in {topo.startup_seconds:.1f}s", file=out, flush=True)
            traces = asyncio.run(_drive(options, example, topo, receiver, out))
            requests = receiver.requests
        report = _report(traces, requests, pids)
        _write_output(options.output, requests)
        _print(report, options, out)
        if options.otlp_endpoint:
            report.forwarded = forward(requests, options.otlp_endpoint)
            print(report.forwarded, file=out)
        print(f"done in {time.monotonic() - started:.1f}s; every process it started is stopped", file=out, flush=True)
        return report
    finally:
        signal.signal(signal.SIGTERM, previous)


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


async def _drive(options: DemoOptions, example: ModuleType, topo: Any, receiver: Any, out: TextIO) -> list[TraceState]:
    import nats
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    from nats_otel.bridge.loop import Bridge
    from nats_otel.bridge.settings import load_settings
    from nats_otel.devkit.processes import wait_for_interest

    settings = load_settings(env={}, overrides={
        "sources": [{"name": "A", "urls": [topo.client_url(BRIDGE_SERVER, "a")], "subjects": [TRACE_SUBJECT]}],
        "otlp": {"endpoint": receiver.endpoint, "protocol": "grpc", "timeout": 2.0, "retry_max_elapsed": 4.0},
        "batch": {"max_delay": 0.05},
        "drain_timeout": 5.0,
    })
    bridge = Bridge(settings)
    bridge_task = asyncio.create_task(bridge.run())
    connections: list[Any] = []
    providers: list[Any] = []
    try:
        await _until(lambda: bridge.ready()[0] or bridge_task.done(), 15, "the bridge to connect")
        if bridge_task.done():
            raise DemoError(f"the bridge stopped at start-up (exit code {bridge_task.result()})")
        print(f"bridge on {BRIDGE_SERVER} subscribed to {TRACE_SUBJECT}, exporting to the receiver",
              file=out, flush=True)

        async def connect(server: str, name: str) -> Any:
            nc = await nats.connect(topo.client_url(server, "a"), name=name, max_reconnect_attempts=0)
            connections.append(nc)
            return nc

        def provider(service: str, instance: str) -> Any:
            exporter = OTLPSpanExporter(endpoint=receiver.endpoint, insecure=True)
            p = example.make_tracer_provider(service, exporter, {"service.instance.id": instance})
            providers.append(p)
            return p

        probe = await connect(BRIDGE_SERVER, "demo-probe")
        producer = await connect(PRODUCER_SERVER, f"demo-producer@{PRODUCER_SERVER}")
        received: dict[bytes, int] = {}
        all_received = asyncio.Event()

        async def handle(msg: Any) -> None:
            key = msg.data
            received[key] = received.get(key, 0) + 1
            if sum(received.values()) >= options.messages * len(CONSUMER_SERVERS):
                all_received.set()

        consumers = []
        for server in CONSUMER_SERVERS:
            nc = await connect(server, f"demo-consumer@{server}")
            tracer = provider("demo-consumer", f"consumer@{server}").get_tracer(example.TRACER_NAME)
            await example.subscribe_traced(nc, options.subject, tracer, handle)
            consumers.append(nc)
        # Interest travels asynchronously over routes and leafnodes: make sure the servers
        # reporting trace events see the bridge's subscription, and the producer's server the
        # consumers', before the first traced message.
        for nc in (producer, *consumers):
            await wait_for_interest(nc, probe)
        for nc in consumers:
            await wait_for_interest(producer, nc)

        tracer = provider("demo-producer", f"producer@{PRODUCER_SERVER}").get_tracer(example.TRACER_NAME)
        traces = []
        for i in range(1, options.messages + 1):
            ctx = await example.publish_traced(producer, tracer, options.subject, f"order {i}".encode())
            traces.append(TraceState(ctx.trace_id.to_bytes(16, "big"), ctx.span_id.to_bytes(8, "big")))
        print(f"sent {options.messages} traced messages on {options.subject} from {PRODUCER_SERVER}; "
              f"consumers on {', '.join(CONSUMER_SERVERS)}", file=out, flush=True)
        try:
            await asyncio.wait_for(all_received.wait(), options.timeout)
        except TimeoutError:
            raise DemoError(f"consumers got {sum(received.values())} of "
                            f"{options.messages * len(CONSUMER_SERVERS)} deliveries in {options.timeout}s") from None
        for p in providers:
            await asyncio.to_thread(p.force_flush)
        deadline = time.monotonic() + options.timeout
        while True:
            _assign(traces, receiver.requests)
            if all(not t.missing(len(CONSUMER_SERVERS)) for t in traces) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.1)
        return traces
    finally:
        bridge.request_stop()
        for nc in connections:
            with contextlib.suppress(Exception):  # best effort on the way out; the servers stop next
                await nc.close()
        for p in providers:
            await asyncio.to_thread(p.shutdown)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(bridge_task, settings.drain_timeout + 5)


async def _until(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise DemoError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.05)


def _assign(traces: list[TraceState], requests: list[ExportTraceServiceRequest]) -> None:
    by_id = {t.trace_id: t for t in traces}
    for t in traces:
        t.spans = []
    for resource, span, scope in _iter_spans(requests):
        if span.trace_id in by_id:
            by_id[span.trace_id].spans.append((resource, span, scope))


def _report(traces: list[TraceState], requests: list[ExportTraceServiceRequest], pids: list[int]) -> DemoReport:
    _assign(traces, requests)
    missing = {t.trace_id.hex(): m for t in traces if (m := t.missing(len(CONSUMER_SERVERS)))}
    return DemoReport(traces, requests, missing, pids)


def _write_output(path: Path, requests: list[ExportTraceServiceRequest]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for request in requests:
            if request.resource_spans:  # the bridge's readiness probe is an empty request
                f.write(json.dumps(to_otlp_json_dict(request), separators=(",", ":")) + "\n")


# --- printing -----------------------------------------------------------------------------


def _ms(ns: int) -> str:
    return f"{ns / 1e6:.3f} ms"


def _print(report: DemoReport, options: DemoOptions, out: TextIO) -> None:
    for index, t in enumerate(report.traces, 1):
        producer = next((s for _, s, scope in t.spans if s.span_id == t.producer_span_id), None)
        nats = [_record(r, s) for r, s, scope in t.spans if scope == SCOPE_NAME]
        consumers = [(r, s) for r, s, scope in t.spans if scope != SCOPE_NAME and s.kind == SpanKind.CONSUMER]
        print(f"\nmessage {index}/{len(report.traces)}  trace {t.trace_id.hex()}", file=out)
        if producer is None:
            print("└─ (producer span missing)", file=out)
            continue
        print(f"└─ app demo-producer  {producer.name}  span {producer.span_id.hex()}  "
              f"({_ms(producer.end_time_unix_nano - producer.start_time_unix_nano)})", file=out)
        # render_traces draws the NATS part under a "parent span <id>" line; that parent is
        # the producer span printed above, so only the tree below it is kept.
        tree = render_traces(nats, color=options.color).splitlines()[2:] if nats else ["   (no NATS spans)"]
        lines = ["   ├─ NATS (from the servers' trace messages, via the bridge)"]
        lines += [f"   │  {line[3:]}" for line in tree]
        for n, (resource, span) in enumerate(consumers):
            branch = "└─" if n == len(consumers) - 1 else "├─"
            instance = _attributes(resource.attributes).get("service.instance.id", "")
            late = _ms(span.start_time_unix_nano - producer.start_time_unix_nano)
            lines.append(f"   {branch} app demo-consumer ({instance})  {span.name}  +{late} after send")
        if not consumers:
            lines.append("   └─ (no consumer span)")
        print("\n".join(lines), file=out)
    nats_spans = sum(1 for t in report.traces for _, _, scope in t.spans if scope == SCOPE_NAME)
    servers = sum(1 for t in report.traces for _, s, scope in t.spans
                  if scope == SCOPE_NAME and s.kind == SpanKind.CONSUMER)
    app = sum(len(t.spans) for t in report.traces) - nats_spans
    errors = sum(1 for _, s, _ in _iter_spans(report.requests) if s.status.code == StatusCode.ERROR)
    print(f"\n{len(report.traces)} messages -> {len(report.traces)} traces, {report.span_count} spans: "
          f"{app} from the app (producer, consumers), {nats_spans} from {servers} server trace messages; "
          f"{errors} with status ERROR", file=out)
    if report.missing:
        for trace_id, what in report.missing.items():
            print(f"INCOMPLETE trace {trace_id}: missing {', '.join(what)}", file=out)
    else:
        print("every trace complete: producer -> NATS hops -> consumers", file=out)
    print(f"wrote {report.span_count} spans as OTLP/JSON lines to {options.output}", file=out, flush=True)


# --- forwarding -----------------------------------------------------------------------------


def forward(requests: list[ExportTraceServiceRequest], endpoint: str, timeout: float = 10.0) -> str:
    """Send the received export requests unchanged to an OTLP/gRPC endpoint; a one-line result."""
    import grpc
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc import TraceServiceStub

    url = urlsplit(endpoint if "://" in endpoint else f"http://{endpoint}")
    target = f"{url.hostname}:{url.port or 4317}"
    channel = (grpc.secure_channel(target, grpc.ssl_channel_credentials()) if url.scheme == "https"
               else grpc.insecure_channel(target))
    try:
        for request in requests:
            TraceServiceStub(channel).Export(request, timeout=timeout)
    except grpc.RpcError as exc:
        return f"forwarding to {endpoint} FAILED: {exc.code().name}: {exc.details()}"
    finally:
        channel.close()
    spans = sum(len(ss.spans) for r in requests for rs in r.resource_spans for ss in rs.scope_spans)
    return f"forwarded {spans} spans to {endpoint} (OTLP/gRPC)"
