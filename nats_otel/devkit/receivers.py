"""Real OTLP trace receivers for tests and benchmarks, shipped with the package.

Like ``structlog.testing``: test doubles that are real servers, so the bridge's own
exporters are exercised over the wire instead of being mocked.

* :class:`OTLPGrpcReceiver` - a gRPC ``TraceService`` on 127.0.0.1.
* :class:`OTLPHttpReceiver` - ``POST /v1/traces`` (protobuf or JSON, gzip/deflate).

Both record every ``ExportTraceServiceRequest``, can simulate an outage
(``unavailable = True`` answers gRPC UNAVAILABLE / HTTP 503, with a suggested retry
delay if ``retry_after`` is set) or a slow backend (``response_delay``), and can be
stopped and started again on the same port::

    with OTLPGrpcReceiver() as rx:
        exporter = OTLPSpanExporter(endpoint=rx.endpoint, insecure=True)
        ...
        rx.wait_for_spans(3)
"""

from __future__ import annotations

import base64
import gzip
import http.server
import json
import socket
import threading
import time
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc import (
    TraceServiceServicer,
    add_TraceServiceServicer_to_server,
)
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import Span

__all__ = ["OTLPGrpcReceiver", "OTLPHttpReceiver", "Received"]


@dataclass(slots=True, frozen=True)
class Received:
    """One accepted export request, with the transport headers it came with."""

    request: ExportTraceServiceRequest
    headers: dict[str, str]
    received_at: float


class _Recorder:
    """What both receivers share: the record, the outage switch, waiting for spans."""

    __slots__ = (
        "_active",
        "_cond",
        "_received",
        "_rejected",
        "_span_count",
        "keep_requests",
        "max_concurrent",
        "refuse",
        "response_delay",
        "retry_after",
        "unavailable",
    )

    def __init__(self, keep_requests: bool = True) -> None:
        self._cond = threading.Condition()
        self._received: list[Received] = []
        self._span_count = 0
        self._rejected = 0
        #: When True, every export is refused as a transient outage (gRPC UNAVAILABLE,
        #: HTTP 503), which OTLP exporters retry.
        self.unavailable = False
        #: With ``unavailable``: the retry delay to suggest, in seconds (gRPC
        #: ``RetryInfo`` trailer, HTTP ``Retry-After``); None suggests nothing.
        self.retry_after: float | None = None
        #: Seconds to sleep before answering: a slow backend, for backpressure tests.
        self.response_delay = 0.0
        #: False keeps only counts (long benchmarks would otherwise hold every span).
        self.keep_requests = keep_requests
        #: A backend that finds some content invalid: called with each request, a text
        #: refuses it permanently (gRPC INVALID_ARGUMENT, HTTP 400) with that text.
        self.refuse: Callable[[ExportTraceServiceRequest], str | None] | None = None
        self._active = 0
        #: The most requests this receiver was handling at one time (exporters sending
        #: several at once show it with a ``response_delay``).
        self.max_concurrent = 0

    def _refusal(self, request: ExportTraceServiceRequest) -> str | None:
        """Why ``refuse`` finds the request invalid (counted as rejected), or None."""
        reason = self.refuse(request) if self.refuse is not None else None
        if reason is not None:
            with self._cond:
                self._rejected += 1
        return reason

    def _accept(self, request: ExportTraceServiceRequest, headers: dict[str, str]) -> bool:
        """Record ``request`` unless an outage is simulated; False means refuse it."""
        with self._cond:
            self._active += 1
            self.max_concurrent = max(self.max_concurrent, self._active)
        try:
            if self.response_delay:
                time.sleep(self.response_delay)
        finally:
            with self._cond:
                self._active -= 1
        n = sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
        with self._cond:
            if self.unavailable:
                self._rejected += 1
                return False
            if self.keep_requests:
                self._received.append(Received(request, headers, time.time()))
            self._span_count += n
            self._cond.notify_all()
        return True

    @property
    def received(self) -> list[Received]:
        """Every accepted request with its headers, in arrival order."""
        with self._cond:
            return list(self._received)

    @property
    def requests(self) -> list[ExportTraceServiceRequest]:
        """Every accepted ``ExportTraceServiceRequest``, in arrival order."""
        return [r.request for r in self.received]

    def spans(self) -> list[tuple[Resource, Span]]:
        """All received spans, flattened to (resource, span) pairs in arrival order."""
        return [
            (rs.resource, span)
            for r in self.received
            for rs in r.request.resource_spans
            for ss in rs.scope_spans
            for span in ss.spans
        ]

    @property
    def span_count(self) -> int:
        """Number of spans accepted so far (also counted when requests are not kept)."""
        with self._cond:
            return self._span_count

    @property
    def request_count(self) -> int:
        """Number of requests accepted so far."""
        with self._cond:
            return len(self._received)

    @property
    def rejected_count(self) -> int:
        """Number of requests refused while ``unavailable`` was set."""
        with self._cond:
            return self._rejected

    def wait_for_spans(self, n: int, timeout: float = 10.0) -> list[tuple[Resource, Span]]:
        """Block until at least ``n`` spans arrived; return :meth:`spans`.

        Raises ``TimeoutError`` saying how many came if fewer arrive within ``timeout``.
        """
        with self._cond:
            if not self._cond.wait_for(lambda: self._span_count >= n, timeout):
                raise TimeoutError(f"{self._span_count} of {n} spans arrived within {timeout}s")
        return self.spans()

    def clear(self) -> None:
        """Forget everything received so far (counts included)."""
        with self._cond:
            self._received.clear()
            self._span_count = 0
            self._rejected = 0


# --------------------------------------------------------------------------- gRPC


_RETRY_INFO_KEY = "google.rpc.retryinfo-bin"


def _retry_info(seconds: float) -> bytes:
    # Imported here: googleapis-common-protos comes with the OTLP exporters, which a
    # receiver that never suggests a delay does not need.
    from google.rpc.error_details_pb2 import RetryInfo

    info = RetryInfo()
    info.retry_delay.FromNanoseconds(int(seconds * 1e9))
    return info.SerializeToString()


class _TraceService(TraceServiceServicer):
    def __init__(self, recorder: _Recorder) -> None:
        self._recorder = recorder

    def Export(  # noqa: N802 - the gRPC method name
        self, request: ExportTraceServiceRequest, context: grpc.ServicerContext
    ) -> ExportTraceServiceResponse:
        rec = self._recorder
        headers = {k: v for k, v in context.invocation_metadata() if isinstance(v, str)}
        reason = rec._refusal(request)
        if reason is not None:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, reason)
        if not rec._accept(request, headers):
            if rec.retry_after is not None:
                context.set_trailing_metadata([(_RETRY_INFO_KEY, _retry_info(rec.retry_after))])
            context.abort(grpc.StatusCode.UNAVAILABLE, "simulated outage (OTLPGrpcReceiver)")
        return ExportTraceServiceResponse()


class OTLPGrpcReceiver(_Recorder):
    """An OTLP/gRPC trace receiver on ``host``: a real ``grpc.server``.

    ``port=0`` picks a free port at the first :meth:`start`; later starts reuse it, so
    an exporter configured once sees the same endpoint come back after :meth:`stop`.
    """

    __slots__ = ("_server", "host", "max_receive_bytes", "max_workers", "port", "tls")

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, max_workers: int = 4,
                 keep_requests: bool = True, tls: tuple[bytes, bytes, bytes | None] | None = None,
                 max_receive_bytes: int = 64 << 20) -> None:
        super().__init__(keep_requests)
        self.host = host
        self.port = port
        self.max_workers = max_workers
        #: The largest request taken; a larger one is refused RESOURCE_EXHAUSTED, as gRPC
        #: does. 64 MiB by default; real receivers take 4 MiB unless told otherwise.
        self.max_receive_bytes = max_receive_bytes
        #: ``(certificate PEM, key PEM, client CA PEM or None)``: serve TLS; with a client
        #: CA, clients must present a certificate it signed (mutual TLS).
        self.tls = tls
        self._server: grpc.Server | None = None

    @property
    def endpoint(self) -> str:
        """``http://host:port`` (``https://`` with ``tls``): what ``OTLPSpanExporter(endpoint=...)`` takes."""
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        """True between :meth:`start` and :meth:`stop`."""
        return self._server is not None

    def start(self) -> OTLPGrpcReceiver:
        """Start serving (on the same port as before, after a :meth:`stop`)."""
        if self._server is not None:
            return self
        server = grpc.server(
            ThreadPoolExecutor(max_workers=self.max_workers, thread_name_prefix="otlp-grpc-rx"),
            # gRPC sets SO_REUSEPORT by default: binding a port another process holds would
            # then "succeed" and split the traffic. Off, so a taken port fails loudly.
            options=[("grpc.so_reuseport", 0), ("grpc.max_receive_message_length", self.max_receive_bytes)],
        )
        add_TraceServiceServicer_to_server(_TraceService(self), server)
        try:
            if self.tls:
                cert, key, client_ca = self.tls
                credentials = grpc.ssl_server_credentials(
                    [(key, cert)], root_certificates=client_ca, require_client_auth=client_ca is not None)
                bound = server.add_secure_port(f"{self.host}:{self.port}", credentials)
            else:
                bound = server.add_insecure_port(f"{self.host}:{self.port}")
        except RuntimeError as e:  # newer grpcio raises instead of returning 0
            raise OSError(f"cannot bind OTLP/gRPC receiver to {self.host}:{self.port}: {e}") from e
        if bound == 0:
            raise OSError(f"cannot bind OTLP/gRPC receiver to {self.host}:{self.port}")
        self.port = bound
        server.start()
        self._server = server
        return self

    def stop(self, grace: float | None = None) -> None:
        """Stop serving and close all connections (the port is released)."""
        server, self._server = self._server, None
        if server is not None:
            server.stop(grace).wait()

    def restart(self) -> None:
        """:meth:`stop` then :meth:`start` on the same port."""
        self.stop()
        self.start()

    def __enter__(self) -> OTLPGrpcReceiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# --------------------------------------------------------------------------- HTTP


_DECOMPRESS = {"identity": lambda b: b, "gzip": gzip.decompress, "deflate": zlib.decompress}
_PROTOBUF, _JSON = "application/x-protobuf", "application/json"


def _parse_otlp_json(raw: bytes, into: ExportTraceServiceRequest) -> None:
    """OTLP/JSON differs from protobuf's JSON mapping in one way: ids are hex, not base64."""
    doc = json.loads(raw)
    for rs in doc.get("resourceSpans") or []:
        for ss in rs.get("scopeSpans") or []:
            for span in ss.get("spans") or []:
                for obj in (span, *(span.get("links") or [])):
                    for key in ("traceId", "spanId", "parentSpanId"):
                        if obj.get(key):
                            obj[key] = base64.b64encode(bytes.fromhex(obj[key])).decode()
    json_format.ParseDict(doc, into)


class _Handler(http.server.BaseHTTPRequestHandler):
    # Keep-alive, as the OTLP/HTTP exporter's requests.Session expects.
    protocol_version = "HTTP/1.1"
    server: _HttpServer

    def setup(self) -> None:
        super().setup()
        self.server.track(self.connection, add=True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.track(self.connection, add=False)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - base signature
        """Silent: a request line per export on stderr would drown the test output."""

    def _reply(self, code: int, body: bytes = b"", ctype: str = "text/plain",
               extra: dict[str, str] | None = None) -> None:
        self.send_response(code)
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        rx = self.server.receiver
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if rx.max_body_bytes is not None and len(body) > rx.max_body_bytes:
            self._reply(413, f"request body over {rx.max_body_bytes} bytes".encode())
            return
        if self.path.split("?", 1)[0] != rx.path:
            self._reply(404, b"not found")
            return
        ctype = self.headers.get_content_type()
        encoding = (self.headers.get("Content-Encoding") or "identity").strip().lower()
        if ctype not in (_PROTOBUF, _JSON) or encoding not in _DECOMPRESS:
            self._reply(415, f"unsupported {ctype} / {encoding}".encode())
            return
        request = ExportTraceServiceRequest()
        try:
            raw = _DECOMPRESS[encoding](body)
            if ctype == _PROTOBUF:
                request.ParseFromString(raw)
            else:
                _parse_otlp_json(raw, request)
        except (OSError, ValueError, zlib.error, DecodeError, json_format.ParseError) as e:
            self._reply(400, f"bad request body: {e}".encode())
            return
        reason = rx._refusal(request)
        if reason is not None:
            self._reply(400, reason.encode())
            return
        if not rx._accept(request, {k.lower(): v for k, v in self.headers.items()}):
            # RFC 9110 wants whole seconds; OTLP exporters also read fractions, which
            # keeps retry tests fast.
            retry = {} if rx.retry_after is None else {"Retry-After": f"{rx.retry_after:g}"}
            self._reply(503, b"simulated outage (OTLPHttpReceiver)", extra=retry)
            return
        response = ExportTraceServiceResponse()
        if ctype == _PROTOBUF:
            self._reply(200, response.SerializeToString(), _PROTOBUF)
        else:
            self._reply(200, json_format.MessageToJson(response).encode(), _JSON)


class _HttpServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, addr: tuple[str, int], receiver: OTLPHttpReceiver) -> None:
        self.receiver = receiver
        self._conns: set[socket.socket] = set()
        self._conns_lock = threading.Lock()
        super().__init__(addr, _Handler)

    def track(self, conn: socket.socket, *, add: bool) -> None:
        with self._conns_lock:
            (self._conns.add if add else self._conns.discard)(conn)

    def close_connections(self) -> None:
        # shutdown() only stops accepting; a kept-alive connection would go on being
        # served by its handler thread, and an "outage" would not be one.
        with self._conns_lock:
            conns = list(self._conns)
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                continue  # already closed by the peer


class OTLPHttpReceiver(_Recorder):
    """An OTLP/HTTP trace receiver: ``POST /v1/traces`` on a threading HTTP server.

    Accepts ``application/x-protobuf`` and ``application/json`` bodies, plain, gzip or
    deflate. ``port=0`` picks a free port at the first :meth:`start`; restarts reuse it.
    """

    __slots__ = ("_server", "_thread", "host", "max_body_bytes", "path", "port")

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, path: str = "/v1/traces",
                 keep_requests: bool = True, max_body_bytes: int | None = None) -> None:
        super().__init__(keep_requests)
        self.host = host
        self.port = port
        self.path = path
        #: A body larger than this (as sent) is refused 413, as a receiver with a bound does.
        self.max_body_bytes = max_body_bytes
        self._server: _HttpServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def endpoint(self) -> str:
        """``http://host:port/v1/traces``: the full URL the OTLP/HTTP exporter takes."""
        return f"http://{self.host}:{self.port}{self.path}"

    @property
    def running(self) -> bool:
        """True between :meth:`start` and :meth:`stop`."""
        return self._server is not None

    def start(self) -> OTLPHttpReceiver:
        """Start serving (on the same port as before, after a :meth:`stop`)."""
        if self._server is not None:
            return self
        server = _HttpServer((self.host, self.port), self)
        self.port = server.server_address[1]
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05},
            name=f"otlp-http-rx-{self.port}", daemon=True,
        )
        self._server = server
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and drop open connections (the port is released)."""
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.close_connections()
        server.server_close()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def restart(self) -> None:
        """:meth:`stop` then :meth:`start` on the same port."""
        self.stop()
        self.start()

    def __enter__(self) -> OTLPHttpReceiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
