"""OTLP/gRPC and OTLP/HTTP (protobuf) exporters: all network code of exporting lives here.

Blocking by design (the bridge runs them in a worker thread, never on the event loop).
Retry is bounded, jittered, exponential and deadline-aware, on the codes the OTLP spec calls
retryable; a failure is an `ExportResult`, never an exception, whose `kind` says what it
was (unreachable, authorization...). `probe()` sends one empty export request: the cheapest
request that shows the endpoint is there, speaks OTLP and accepts our credentials.
"""

from __future__ import annotations

import dataclasses
import gzip
import random
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from urllib.parse import urlsplit, urlunsplit

import grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from nats_otel import __version__
from nats_otel.bridge.export.request_split import split_request
from nats_otel.bridge.export.result import ExportResult
from nats_otel.bridge.settings import OtlpSettings
from nats_otel.core.encode import to_protobuf_bytes
from nats_otel.core.records import SpanRecord

__all__ = ["GrpcExporter", "HttpExporter", "make_otlp_exporter", "retry"]

# The method of opentelemetry-proto's TraceService. Called with a bytes serializer: the
# request is already serialized by `to_protobuf_bytes` (or by a worker process), so no
# generated message objects are built on the hot path.
_EXPORT_METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"

USER_AGENT = f"nats-otel/{__version__}"
RETRYABLE_GRPC = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.DEADLINE_EXCEEDED,
     grpc.StatusCode.ABORTED, grpc.StatusCode.CANCELLED}
)
RETRYABLE_HTTP = frozenset({429, 502, 503, 504})

# What a refusal is called (`ExportResult.kind`); tables, not ladders.
_GRPC_KIND = {
    grpc.StatusCode.UNAUTHENTICATED: "authorization", grpc.StatusCode.PERMISSION_DENIED: "authorization",
    grpc.StatusCode.UNIMPLEMENTED: "not_found", grpc.StatusCode.INVALID_ARGUMENT: "invalid",
    grpc.StatusCode.DEADLINE_EXCEEDED: "timeout", grpc.StatusCode.RESOURCE_EXHAUSTED: "unavailable",
}
_HTTP_KIND = {401: "authorization", 403: "authorization", 404: "not_found", 405: "not_found", 400: "invalid",
              429: "unavailable", 502: "unavailable", 503: "unavailable", 504: "unavailable"}
# gRPC reports "no connection" and "the server said unavailable" with one code; its detail
# text tells them apart.
_NO_CONNECTION = ("failed to connect", "connection refused", "dns resolution failed", "name resolution",
                  "no route to host", "network is unreachable", "connection reset", "handshake")
# An empty ExportTraceServiceRequest serializes to no bytes at all.
_EMPTY_REQUEST = b""
_PROBE_TIMEOUT_MAX_S = 5.0


def display_url(url: str) -> str:
    """The endpoint as logged and shown in `/readyz`: no user information, no query."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))

# One attempt: (result, server-suggested delay or None).
Attempt = Callable[[float], tuple[ExportResult, float | None]]


def retry(
    attempt: Attempt,
    settings: OtlpSettings,
    deadline: float | None,
    stop: threading.Event,
    rng: random.Random,
) -> ExportResult:
    """Run `attempt(timeout)` until it succeeds, fails for good, or time is up.

    Time is up at `retry_max_elapsed` after the first attempt, or at `deadline` (monotonic)
    if that is sooner, or when `stop` is set. Backoff doubles up to `retry_max_backoff`,
    with full jitter; a server's retry-after hint is respected when it fits.
    """
    start = time.monotonic()
    give_up = start + settings.retry_max_elapsed
    if deadline is not None:
        give_up = min(give_up, deadline)
    backoff = settings.retry_initial_backoff
    attempts = 0
    while True:
        attempts += 1
        timeout = (settings.timeout if deadline is None
                   else max(0.05, min(settings.timeout, deadline - time.monotonic())))
        result, hint = attempt(timeout)
        if result.ok or not result.retryable:
            return _with_attempts(result, attempts)
        delay = hint if hint is not None else rng.uniform(0, backoff)
        backoff = min(backoff * 2, settings.retry_max_backoff)
        if time.monotonic() + delay >= give_up or stop.is_set():
            return _with_attempts(result, attempts)
        if stop.wait(delay):
            return _with_attempts(result, attempts)


def _with_attempts(result: ExportResult, attempts: int) -> ExportResult:
    return dataclasses.replace(result, attempts=attempts)


def in_parts(request: bytes, max_bytes: int, send: Callable[[bytes], ExportResult]) -> ExportResult:
    """`send` the request, or, over `max_bytes`, each of its parts in turn (`split_request`):
    ok when every part was taken (their refused spans summed); else the failing part's
    result, with every attempt counted. The parts before it were delivered: a retried batch
    sends them again, as after any failure (duplicates a backend takes; never a loss). Bytes
    that cannot be cut (not a serialized request: never ours) go whole, and the backend
    decides: an export fails as a result, never an exception."""
    try:
        parts = split_request(request, max_bytes)
    except ValueError:
        parts = [request]
    if len(parts) == 1:
        return send(parts[0])
    attempts = rejected = 0
    for part in parts:
        result = send(part)
        attempts += result.attempts
        if not result.ok:
            return _with_attempts(result, attempts)
        rejected += result.rejected_spans
    return ExportResult.success(attempts, rejected)


class GrpcExporter:
    """OTLP/gRPC (opentelemetry-proto's TraceService/Export, pre-serialized requests): TLS, headers, gzip, timeout."""

    name = "otlp-grpc"

    def __init__(self, settings: OtlpSettings, rng: random.Random | None = None) -> None:
        self.settings = settings
        self._stop = threading.Event()
        self._rng = rng or random.Random()
        url = urlsplit(settings.resolved_endpoint)
        self.endpoint = display_url(settings.resolved_endpoint)
        target = f"{url.hostname}:{url.port or 4317}"
        insecure = settings.insecure if settings.insecure is not None else url.scheme == "http"
        # gRPC waits up to 120 s between connection attempts to a dead endpoint by default:
        # a backend back after an outage would stay unused (and the bridge unready) that long.
        options = [("grpc.primary_user_agent", USER_AGENT), ("grpc.initial_reconnect_backoff_ms", 500),
                   ("grpc.max_reconnect_backoff_ms", int(settings.retry_max_backoff * 1000))]
        if insecure:
            self._channel = grpc.insecure_channel(target, options=options)
        else:
            credentials = grpc.ssl_channel_credentials(
                root_certificates=_read(settings.certificate),
                private_key=_read(settings.client_key),
                certificate_chain=_read(settings.client_certificate),
            )
            self._channel = grpc.secure_channel(target, credentials, options=options)
        self._export = self._channel.unary_unary(
            _EXPORT_METHOD, request_serializer=_identity, response_deserializer=ExportTraceServiceResponse.FromString)
        self._metadata = tuple((k.lower(), v) for k, v in settings.headers.items())
        self._compression = grpc.Compression.Gzip if settings.compression == "gzip" else grpc.Compression.NoCompression

    def export(self, spans: Sequence[SpanRecord], deadline: float | None = None) -> ExportResult:
        """Send the spans as one request, retrying transient failures."""
        return self.export_bytes(to_protobuf_bytes(spans), deadline)

    def export_bytes(self, request: bytes, deadline: float | None = None) -> ExportResult:
        """Send one serialized `ExportTraceServiceRequest` (in parts over `max_request_bytes`),
        retrying transient failures."""
        return in_parts(request, self.settings.max_request_bytes, lambda part: self._send(part, deadline))

    def _send(self, request: bytes, deadline: float | None) -> ExportResult:
        return retry(lambda timeout: self._attempt(request, timeout), self.settings, deadline, self._stop, self._rng)

    def probe(self) -> ExportResult:
        """One empty export request, no retry: can the backend be reached, and will it take ours?"""
        return self._attempt(_EMPTY_REQUEST, min(self.settings.timeout, _PROBE_TIMEOUT_MAX_S))[0]

    def _attempt(self, request: bytes, timeout: float) -> tuple[ExportResult, float | None]:
        try:
            response = self._export(
                request, timeout=timeout, metadata=self._metadata, compression=self._compression
            )
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
            detail = (exc.details() if hasattr(exc, "details") else str(exc)) or ""
            kind = _GRPC_KIND.get(code, "refused")
            if code == grpc.StatusCode.UNAVAILABLE:
                kind = "unreachable" if any(s in detail.lower() for s in _NO_CONNECTION) else "unavailable"
            return ExportResult(False, error=f"{code.name}: {detail}", retryable=code in RETRYABLE_GRPC,
                                invalid=code == grpc.StatusCode.INVALID_ARGUMENT, kind=kind), None
        return ExportResult.success(rejected_spans=response.partial_success.rejected_spans), None

    def close(self) -> None:
        self._stop.set()
        self._channel.close()


class HttpExporter:
    """OTLP/HTTP with protobuf bodies over the standard library's HTTP client."""

    name = "otlp-http"

    def __init__(self, settings: OtlpSettings, rng: random.Random | None = None) -> None:
        self.settings = settings
        self.url = settings.resolved_endpoint
        self.endpoint = display_url(self.url)
        self._stop = threading.Event()
        self._rng = rng or random.Random()
        context = None
        if self.url.startswith("https://"):
            context = ssl.create_default_context(cafile=str(settings.certificate) if settings.certificate else None)
            if settings.client_certificate and settings.client_key:
                context.load_cert_chain(str(settings.client_certificate), str(settings.client_key))
            if settings.insecure:
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
        # No proxy from the environment: collectors are usually next door, and a proxy
        # silently in the path of telemetry is a surprise. HTTPS_PROXY users can front it.
        self._opener = urllib.request.build_opener(
            urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context)
        )
        self._headers = {"Content-Type": "application/x-protobuf", "User-Agent": USER_AGENT, **settings.headers}
        if settings.compression == "gzip":
            self._headers["Content-Encoding"] = "gzip"

    def export(self, spans: Sequence[SpanRecord], deadline: float | None = None) -> ExportResult:
        """POST the spans as one request, retrying transient failures."""
        return self.export_bytes(to_protobuf_bytes(spans), deadline)

    def export_bytes(self, body: bytes, deadline: float | None = None) -> ExportResult:
        """POST one serialized `ExportTraceServiceRequest` (in parts over `max_request_bytes`),
        retrying transient failures."""
        return in_parts(body, self.settings.max_request_bytes, lambda part: self._send(part, deadline))

    def _send(self, body: bytes, deadline: float | None) -> ExportResult:
        if self.settings.compression == "gzip":
            body = gzip.compress(body, compresslevel=6)
        return retry(lambda timeout: self._attempt(body, timeout), self.settings, deadline, self._stop, self._rng)

    def probe(self) -> ExportResult:
        """One empty export request, no retry: can the backend be reached, and will it take ours?"""
        body = gzip.compress(_EMPTY_REQUEST) if self.settings.compression == "gzip" else _EMPTY_REQUEST
        return self._attempt(body, min(self.settings.timeout, _PROBE_TIMEOUT_MAX_S))[0]

    def _attempt(self, body: bytes, timeout: float) -> tuple[ExportResult, float | None]:
        request = urllib.request.Request(self.url, data=body, headers=self._headers, method="POST")
        try:
            with self._opener.open(request, timeout=timeout) as response:
                payload = response.read()
        except urllib.error.HTTPError as exc:
            retryable = exc.code in RETRYABLE_HTTP
            hint = _retry_after(exc.headers.get("Retry-After")) if retryable else None
            text = exc.read()[:200].decode("utf-8", "replace")
            return ExportResult(False, error=f"HTTP {exc.code}: {text}", retryable=retryable,
                                invalid=exc.code == 400, kind=_HTTP_KIND.get(exc.code, "refused")), hint
        except (OSError, ValueError) as exc:  # refused, reset, timeout, TLS: the backend is not there
            reason = getattr(exc, "reason", exc)
            kind = "timeout" if isinstance(reason, TimeoutError) else "unreachable"
            return ExportResult(False, error=f"{type(exc).__name__}: {reason}", retryable=True, kind=kind), None
        rejected = 0
        if payload:
            try:
                rejected = ExportTraceServiceResponse.FromString(payload).partial_success.rejected_spans
            except Exception:  # noqa: BLE001 - a 2xx with an odd body is still a success
                rejected = 0
        return ExportResult.success(rejected_spans=rejected), None

    def close(self) -> None:
        self._stop.set()


def _identity(data: bytes) -> bytes:
    return data


def _retry_after(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value else None
    except ValueError:
        return None


def _read(path: object) -> bytes | None:
    if path is None:
        return None
    with open(path, "rb") as f:  # type: ignore[call-overload]
        return f.read()


def make_otlp_exporter(settings: OtlpSettings) -> GrpcExporter | HttpExporter:
    """The exporter for `settings.protocol`."""
    return GrpcExporter(settings) if settings.protocol == "grpc" else HttpExporter(settings)
