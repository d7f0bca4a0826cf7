"""The bridge's own observability: Prometheus metrics, `/healthz`, `/readyz`, logs (JSON or
text, with the same fields).

Metrics live on their own `CollectorRegistry` (no globals: two bridges in one test process
do not share counters). One small WSGI server in a daemon thread answers all three paths.
"""

from __future__ import annotations

import json
import logging
import platform
import threading
import time
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    Info,
    ProcessCollector,
    make_wsgi_app,
)
from prometheus_client.core import CounterMetricFamily, Metric

from nats_otel import __version__
from nats_otel.core import engine

__all__ = ["DROP_REASONS", "HealthServer", "JsonFormatter", "Metrics", "ReceivedCounter", "Tally", "TextFormatter",
           "configure_logging"]


# Every reason a trace message can be lost for (`nats_otel_messages_dropped_total{reason}`).
DROP_REASONS = ("queue_full", "slow_consumer", "export_failed", "drain_timeout", "export_invalid")


class Tally:
    """One source's count of received messages: a plain int the receive path adds to."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0

    def inc(self, amount: int = 1) -> None:
        self.value += amount


class ReceivedCounter:
    """`nats_otel_messages_received_total{source}`, read from each source's `Tally` when
    scraped: a prometheus `Counter.inc` (a lock per call) per received message was a visible
    share of the receive path. Only the event loop adds; a scrape reads whole ints."""

    def __init__(self, name: str, documentation: str, registry: CollectorRegistry) -> None:
        self.name = name
        self.documentation = documentation
        self._tallies: dict[str, Tally] = {}
        registry.register(self)

    def labels(self, source: str) -> Tally:
        """The tally of `source` (made at 0 the first time: its series exists from then on)."""
        tally = self._tallies.get(source)
        if tally is None:
            tally = self._tallies[source] = Tally()
        return tally

    def describe(self) -> Iterable[Metric]:
        yield CounterMetricFamily(self.name, self.documentation, labels=["source"])

    def collect(self) -> Iterable[Metric]:
        family = CounterMetricFamily(self.name, self.documentation, labels=["source"])
        for source, tally in list(self._tallies.items()):
            family.add_metric([source], tally.value)
        yield family


class Metrics:
    """Every metric the bridge exports, on one registry. Names are `nats_otel_*`."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        r = self.registry
        if registry is None:
            # The process's own (`process_*`: CPU seconds, resident memory, open files) and its
            # collector's (`python_gc_*`), as prometheus_client's default registry has them:
            # what a sidecar's cost is read from.
            ProcessCollector(registry=r)
            GCCollector(registry=r)  # registers nothing where the interpreter has no gc.get_stats
        self.received = ReceivedCounter("nats_otel_messages_received", "Trace messages received", r)
        self.decoded = Counter("nats_otel_messages_decoded", "Trace messages decoded into spans", registry=r)
        self.rejected = Counter("nats_otel_messages_rejected", "Trace messages that gave no spans, by reason",
                                ["reason"], registry=r)
        self.dropped = Counter("nats_otel_messages_dropped",
                               "Trace messages lost, by reason (queue_full, slow_consumer, export_failed, "
                               "drain_timeout: core mode only; export_invalid: spans the backend refused as "
                               "invalid, both modes)",
                               ["reason"], registry=r)
        for reason in DROP_REASONS:  # at 0 from the start: dashboards and alerts see each series
            self.dropped.labels(reason)
        self.issues = Counter("nats_otel_mapping_issues", "Oddities met while mapping (span kept), by kind",
                              ["kind"], registry=r)
        self.hop_links = Counter(
            "nats_otel_hop_links",
            "Downstream server spans by how their upstream egress was found: matched, unmatched (not seen "
            "within the window), ambiguous (several candidates; hung under the producer span instead)",
            ["result"], registry=r)
        self.link_evidence = Counter(
            "nats_otel_link_evidence",
            "Link-evidence batches exchanged with other bridges, by result: published, received, unpublished, "
            "dropped (this bridge behind), unkept (its stream unusable: JetStream mode), and rejected as "
            "malformed, invalid, format (another version) or forged "
            "(bad or missing signature, or naming this bridge as sender)", ["result"], registry=r)
        self.routed = Counter(
            "nats_otel_routed", "Trace messages of traces another bridge owns, by result: forwarded to their owner, "
            "received from another bridge, rerouted (the owner was gone), unforwarded (publish failed), malformed "
            "or oversized (a forward dropped whole)", ["result"], registry=r)
        self.route_views = Counter("nats_otel_route_views", "Changes of the members that own the traces", registry=r)
        self.route_members = Gauge(
            "nats_otel_route_members", "Members that own the traces as this bridge sees them, itself included "
            "(every bridge of a queue group should say the same)", registry=r)
        self.link_evidence_reports = Counter(
            "nats_otel_link_evidence_reports", "Reports' hop evidence recorded from other bridges", registry=r)
        self.link_held = Counter(
            "nats_otel_link_held", "Downstream reports not yet linked, held for redelivery (JetStream mode, "
            "after a start) instead of exported unlinked", registry=r)
        self.link_evicted = Counter(
            "nats_otel_link_window_evicted",
            "Hop evidence forgotten before its time because the link window was full (link.capacity)",
            registry=r)
        self.spans_exported = Counter("nats_otel_spans_exported", "Spans accepted by an exporter",
                                      ["exporter"], registry=r)
        self.spans_rejected = Counter("nats_otel_spans_rejected_by_backend",
                                      "Spans the backend refused (OTLP partial success)", ["exporter"], registry=r)
        self.export_failures = Counter("nats_otel_export_failures", "Export batches that failed after retries",
                                       ["exporter"], registry=r)
        self.export_latency = Histogram(
            "nats_otel_export_duration_seconds", "Time to export one batch, retries included", ["exporter"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30), registry=r,
        )
        self.queue_depth = Gauge(
            "nats_otel_queue_depth",
            "Trace messages the bridge holds: core mode, waiting in the intake or out link.wait, or being "
            "converted; JetStream mode, fetched and not yet settled", registry=r)
        self.queue_bytes = Gauge("nats_otel_queue_bytes",
                                 "Bytes the held trace messages count against batch.queue_bytes "
                                 "(payload + 512 per message)", registry=r)
        self.queue_limit_bytes = Gauge("nats_otel_queue_limit_bytes",
                                       "The intake's bound (batch.queue_bytes): beyond it, queue_full drops",
                                       registry=r)
        self.js_pending = Gauge("nats_otel_jetstream_pending", "Messages the durable consumer has not yet delivered",
                                ["source"], registry=r)
        self.js_acks = Counter("nats_otel_jetstream_acks", "JetStream acknowledgements sent, by kind",
                               ["kind"], registry=r)
        self.js_consumer_recreated = Counter(
            "nats_otel_jetstream_consumer_recreated",
            "Times the durable consumer was found gone (deleted, or no responder) and set up again",
            ["source"], registry=r)
        self.js_consumer_setup_failed = Counter(
            "nats_otel_jetstream_consumer_setup_failed",
            "Attempts to set a gone durable consumer up again that failed (retried every second)",
            ["source"], registry=r)
        self.connected = Gauge("nats_otel_nats_connected", "1 while the source's connection is up",
                               ["source"], registry=r)
        self.reconnects = Counter("nats_otel_nats_reconnects", "Times the source's connection came back after "
                                  "a loss (to the same server or another of its cluster)", ["source"], registry=r)
        # What /readyz says, for alerts (config/prometheus/alerts.yml): read at scrape time
        # (`HealthServer` gives it the bridge's `ready`), 0 until then.
        self.ready = Gauge("nats_otel_ready", "1 while /readyz says ready: every source connected, every "
                           "exporter reaching its backend", registry=r)
        # Which core converts: "compiled" (the Cython twins) or "python" (not built, or
        # NATS_OTEL_NO_EXTENSIONS set). Exported as nats_otel_core_info{implementation=...} 1.
        self.core = Info("nats_otel_core", "The implementation of the core's hot path in use",
                         registry=r)
        self.core.info({"implementation": engine.implementation()})
        # What is running, as Prometheus' own build_info convention has it:
        # nats_otel_build_info{version, python, core} 1 (the version from the package metadata).
        self.build = Info("nats_otel_build", "The nats-otel version running, its Python and its core",
                          registry=r)
        self.build.info({"version": __version__, "python": platform.python_version(),
                         "core": engine.implementation()})
        self.core_reference = Counter(
            "nats_otel_core_reference",
            "Trace messages the compiled kernel handed whole to the pure-Python reference, by stage (prepare, "
            "map, network; request: export batches): what it does not take (converted all the same)",
            ["stage"], registry=r)

    def value(self, name: str, labels: dict[str, str] | None = None) -> float:
        """Current value of a sample (tests and logs); 0.0 if it was never set."""
        return self.registry.get_sample_value(name, labels or {}) or 0.0


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass


class HealthServer:
    """`/metrics`, `/healthz` (the loop is alive) and `/readyz` (connected and exporting)."""

    def __init__(self, metrics: Metrics, host: str, port: int,
                 healthy: Callable[[], tuple[bool, str]], ready: Callable[[], tuple[bool, str]]) -> None:
        self._metrics_app = make_wsgi_app(metrics.registry)
        self._healthy = healthy
        self._ready = ready
        metrics.ready.set_function(lambda: float(ready()[0]))
        self._server = make_server(host, port, self._app, server_class=_Server, handler_class=_QuietHandler)
        self.port: int = self._server.server_port
        self._thread = threading.Thread(target=self._server.serve_forever, name="nats-otel-http", daemon=True)

    def start(self) -> HealthServer:
        self._thread.start()
        return self

    def _app(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path in ("/healthz", "/readyz"):
            ok, why = (self._healthy if path == "/healthz" else self._ready)()
            body = json.dumps({"status": "ok" if ok else "unavailable", "detail": why}).encode()
            start_response("200 OK" if ok else "503 Service Unavailable",
                           [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
            return [body]
        if path in ("/metrics", "/"):
            return self._metrics_app(environ, start_response)
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"not found: try /metrics, /healthz or /readyz\n"]

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message and the record's `fields`."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            doc.update(fields)
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


class TextFormatter(logging.Formatter):
    """`time LEVEL logger: message key=value ...`: the same fields as the JSON lines, logfmt
    style (a value with spaces, quotes or `=` is quoted as a JSON string)."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        record.message = record.getMessage()
        record.asctime = self.formatTime(record)
        line = self.formatMessage(record)
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict) and fields:
            line += " " + " ".join(f"{key}={_logfmt(value)}" for key, value in fields.items())
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def _logfmt(value: Any) -> str:
    if isinstance(value, str):
        plain = value and not any(c in value for c in ' "=\\\n\t')
        return value if plain else json.dumps(value)
    # Numbers, booleans, None, lists: as in the JSON lines (true, null, ["a","b"]).
    return json.dumps(value, default=str, separators=(",", ":"))


def configure_logging(level: str = "INFO", fmt: str = "json") -> None:
    """Logs of the `nats_otel` loggers to stderr, as JSON lines or text lines with the same fields."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    logger = logging.getLogger("nats_otel")
    logger.handlers[:] = [handler]
    logger.setLevel(level)
    logger.propagate = False
