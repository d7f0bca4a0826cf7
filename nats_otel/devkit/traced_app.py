"""An OpenTelemetry-instrumented NATS producer and consumer (nats-py + OTel SDK).

The producer wraps each publish in a PRODUCER span ``send <subject>`` and puts that span's
W3C ``traceparent`` into the NATS message headers. A NATS account with ``msg_trace``
(nats-server 2.11+) then traces the message through every server it crosses, and the
bridge (``nats-otel bridge``) turns those trace messages into spans whose parent is this
``send`` span. The consumer reads the ``traceparent`` back from the headers and makes a
CONSUMER span ``process <subject>``, also a child of ``send``. In a trace backend:

    send orders                          (this app, producer)
    ├─ receive orders   east-2           (NATS, via the bridge)
    │  └─ send orders → east-3 ...
    └─ process orders                    (this app, consumer)

Self-contained on purpose (only nats-py and the OTel SDK/exporter): copy it into your own
application. Run it against any NATS server whose account has ``msg_trace``::

    python examples/traced_app.py --nats-url nats://a:pwd@127.0.0.1:4222 \\
        --subject orders --messages 5 --otlp-endpoint http://127.0.0.1:4317

(or, with nats-otel installed, ``python -m nats_otel.devkit.traced_app ...``). It lives in
the package so that ``nats-otel demo``, which imports the functions below to drive its
embedded topology, runs from an installed wheel; ``examples/traced_app.py`` links here.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.propagators.textmap import Getter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.trace import SpanKind, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from nats_otel.bridge.sources.direct import flush_in_order

__all__ = [
    "PROPAGATOR",
    "TRACER_NAME",
    "make_tracer_provider",
    "publish_traced",
    "subscribe_traced",
]

TRACER_NAME = "nats-otel.examples.traced_app"

# W3C trace context only: it is what nats-server reads to decide whether to trace.
PROPAGATOR = TraceContextTextMapPropagator()


class _HeaderGetter(Getter[Mapping[str, str]]):
    """Case-insensitive header lookup: NATS keeps header name case as sent (2.14+)."""

    def get(self, carrier: Mapping[str, str], key: str) -> list[str] | None:
        for name, value in carrier.items():
            if name.lower() == key.lower():
                return [value]
        return None

    def keys(self, carrier: Mapping[str, str]) -> list[str]:
        return list(carrier)


_GETTER = _HeaderGetter()


def make_tracer_provider(service_name: str, exporter: SpanExporter,
                         attributes: Mapping[str, str] | None = None) -> TracerProvider:
    """A provider of its own (not the global one), so producer and consumer may share a process."""
    resource = Resource.create({"service.name": service_name, **(attributes or {})})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=200))
    return provider


def _messaging_attributes(subject: str, operation: str, size: int) -> dict[str, Any]:
    return {
        "messaging.system": "nats",
        "messaging.destination.name": subject,
        "messaging.operation.type": operation,
        "messaging.message.body.size": size,
    }


async def publish_traced(nc: Any, tracer: Tracer, subject: str, payload: bytes,
                         headers: Mapping[str, str] | None = None) -> trace.SpanContext:
    """Publish ``payload`` inside a PRODUCER span whose context travels in the headers.

    The flush inside the span waits for the server's PONG, so the span covers the
    server's ingress of the message: in a timeline the NATS spans start inside it.
    """
    with tracer.start_as_current_span(
        f"send {subject}", kind=SpanKind.PRODUCER,
        attributes=_messaging_attributes(subject, "send", len(payload)),
    ) as span:
        carrier: dict[str, str] = dict(headers or {})
        PROPAGATOR.inject(carrier)  # the current context is this span: traceparent = its id
        await nc.publish(subject, payload, headers=carrier)
        await flush_in_order(nc)  # nats-py's own flush may not wait for the message (direct.py)
        return span.get_span_context()


def context_from_headers(headers: Mapping[str, str] | None) -> Context:
    """The producer's context carried by a received message (empty if it had none)."""
    return PROPAGATOR.extract(headers or {}, getter=_GETTER)


async def subscribe_traced(nc: Any, subject: str, tracer: Tracer,
                           handle: Callable[[Any], Awaitable[None]] | None = None,
                           queue: str = "") -> Any:
    """Subscribe; each message is handled inside a CONSUMER span ``process <subject>``
    whose parent is the producer's ``send`` span (taken from the message headers)."""

    async def on_message(msg: Any) -> None:
        with tracer.start_as_current_span(
            f"process {msg.subject}", context=context_from_headers(msg.headers),
            kind=SpanKind.CONSUMER,
            attributes=_messaging_attributes(msg.subject, "process", len(msg.data)),
        ):
            if handle is not None:
                await handle(msg)

    sub = await nc.subscribe(subject, queue=queue, cb=on_message)
    await nc.flush()  # the server has the subscription before anyone publishes
    return sub


# --- standalone ------------------------------------------------------------------------------


def _exporter(endpoint: str | None) -> SpanExporter:
    if not endpoint:
        return ConsoleSpanExporter()
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(endpoint=endpoint, insecure=endpoint.startswith("http://"))


async def run(args: argparse.Namespace) -> int:
    import nats

    providers: list[TracerProvider] = []
    connections = []
    received = asyncio.Event()
    count = 0

    async def handle(msg: Any) -> None:
        nonlocal count
        count += 1
        print(f"consumer: {msg.subject} {msg.data.decode(errors='replace')} "
              f"traceparent={ {k.lower(): v for k, v in (msg.headers or {}).items()}.get('traceparent') }")
        if count >= args.messages:
            received.set()

    try:
        if args.role in ("consumer", "both"):
            consumer_nc = await nats.connect(args.nats_url, name="traced-app-consumer")
            connections.append(consumer_nc)
            provider = make_tracer_provider(args.service_name + "-consumer", _exporter(args.otlp_endpoint))
            providers.append(provider)
            await subscribe_traced(consumer_nc, args.subject, provider.get_tracer(TRACER_NAME), handle)
        if args.role in ("producer", "both"):
            producer_nc = await nats.connect(args.nats_url, name="traced-app-producer")
            connections.append(producer_nc)
            provider = make_tracer_provider(args.service_name + "-producer", _exporter(args.otlp_endpoint))
            providers.append(provider)
            tracer = provider.get_tracer(TRACER_NAME)
            for i in range(1, args.messages + 1):
                ctx = await publish_traced(producer_nc, tracer, args.subject, f"message {i}".encode())
                print(f"producer: sent message {i} trace_id={ctx.trace_id:032x} span_id={ctx.span_id:016x}")
        if args.role == "both":
            await asyncio.wait_for(received.wait(), args.timeout)
        elif args.role == "consumer":
            await received.wait()  # until Ctrl-C
    except TimeoutError:
        print(f"consumer: only {count} of {args.messages} messages within {args.timeout}s", file=sys.stderr)
        return 1
    finally:
        for nc in connections:
            await nc.drain()
        for provider in providers:
            provider.shutdown()  # flushes the batch processor
    return 0


def parse_args(argv: Iterable[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nats-url", default="nats://127.0.0.1:4222",
                        help="NATS URL, credentials inline (nats://user:password@host:port)")
    parser.add_argument("--subject", default="demo.orders")
    parser.add_argument("--messages", type=int, default=5)
    parser.add_argument("--otlp-endpoint", help="OTLP/gRPC endpoint, e.g. http://127.0.0.1:4317 "
                        "(default: print spans to stdout)")
    parser.add_argument("--role", choices=("both", "producer", "consumer"), default="both",
                        help="run the producer, the consumer (until Ctrl-C), or both (default)")
    parser.add_argument("--service-name", default="traced-app",
                        help="prefix of service.name (-producer / -consumer appended)")
    parser.add_argument("--timeout", type=float, default=10.0,
                        help="role 'both': seconds to wait for the consumer to get every message")
    return parser.parse_args(list(argv) if argv is not None else None)


if __name__ == "__main__":
    try:
        sys.exit(asyncio.run(run(parse_args())))
    except KeyboardInterrupt:
        sys.exit(130)
