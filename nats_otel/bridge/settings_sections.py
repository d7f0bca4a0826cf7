"""The sections of the bridge's configuration (`settings.BridgeSettings` holds one of each):
pydantic models whose defaults are the only place defaults live (docs in their fields)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from nats_otel.bridge.cpu_affinity import check_setting
from nats_otel.core.linking import LinkSettings

__all__ = [
    "OTLP_GRPC_DEFAULT",
    "OTLP_HTTP_DEFAULT",
    "BatchSettings",
    "JetStreamSettings",
    "LimitsSettings",
    "LinkSettingsModel",
    "LogSettings",
    "NatsSettings",
    "NatsSource",
    "OtlpSettings",
    "SettingsError",
    "TelemetrySettings",
    "TlsFiles",
]

OTLP_GRPC_DEFAULT = "http://localhost:4317"
OTLP_HTTP_DEFAULT = "http://localhost:4318/v1/traces"


def _files_exist(model: BaseModel, names: tuple[str, ...], together: tuple[str, str]) -> None:
    """A certificate and its key come together, and every file named exists."""
    first, second = together
    if (getattr(model, first) is None) != (getattr(model, second) is None):
        raise ValueError(f"{first} and {second} must be given together")
    for name in names:
        path = getattr(model, name)
        if path is not None and not path.is_file():
            raise ValueError(f"{name}: no such file: {path}")


class SettingsError(ValueError):
    """Configuration that cannot work: fatal, the message says where and what."""


class _Model(BaseModel):
    # A misspelt key must be an error, not a silently ignored setting.
    model_config = ConfigDict(extra="forbid", frozen=True)


class TlsFiles(_Model):
    """Client TLS: CA bundle to trust, and an optional client certificate and key."""

    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None

    @model_validator(mode="after")
    def _pair(self) -> TlsFiles:
        _files_exist(self, ("ca", "cert", "key"), together=("cert", "key"))
        return self

    @property
    def enabled(self) -> bool:
        return any((self.ca, self.cert, self.key))


class NatsSource(_Model):
    """One NATS connection (one account) and the trace subjects it subscribes to."""

    name: str = "default"
    urls: list[str] = Field(default_factory=lambda: ["nats://127.0.0.1:4222"], min_length=1)
    subjects: list[str] = Field(default_factory=list)
    queue: str | None = None
    creds: Path | None = None
    nkey_seed: Path | None = None
    user: str | None = None
    password: str | None = None
    token: str | None = None
    tls: TlsFiles = TlsFiles()

    @field_validator("urls")
    @classmethod
    def _urls(cls, urls: list[str]) -> list[str]:
        for url in urls:
            if urlsplit(url if "://" in url else f"nats://{url}").scheme not in {"nats", "tls", "ws", "wss"}:
                raise ValueError(f"not a NATS URL: {url!r}")
        return urls

    @field_validator("creds", "nkey_seed")
    @classmethod
    def _exists(cls, path: Path | None) -> Path | None:
        if path is not None and not path.is_file():
            raise ValueError(f"no such file: {path}")
        return path

    @model_validator(mode="after")
    def _auth(self) -> NatsSource:
        if (self.user is None) != (self.password is None):
            raise ValueError("user and password must be given together")
        methods = [m for m in ("creds", "nkey_seed", "user", "token") if getattr(self, m) is not None]
        if len(methods) > 1:
            raise ValueError(f"choose one authentication method, not {' and '.join(methods)}")
        return self


class JetStreamSettings(_Model):
    """At-least-once intake: a durable pull consumer on a stream of the trace subjects."""

    stream: str = "NATS_TRACES"
    durable: str = "nats-otel"
    create_stream: bool = False
    stream_max_age: float = Field(24 * 3600.0, gt=0, description="seconds kept, when created")
    # Messages wait `link.wait` before they are mapped and acked: at 10k msgs/s and 1 s that
    # is 10k in flight, so the default leaves room for bursts above that.
    max_ack_pending: int = Field(20_000, ge=1)
    ack_wait: float = Field(30.0, gt=0, description="seconds before an unacked message is redelivered")
    fetch_batch: int = Field(256, ge=1)
    nak_delay_initial: float = Field(0.5, gt=0)
    nak_delay_max: float = Field(15.0, gt=0)
    # A bridge started with its cluster (a pod, `docker compose up`) is connected before
    # JetStream answers: its meta group elects a leader seconds after the servers start.
    startup_wait: float = Field(30.0, ge=0, description="seconds to wait at start-up, once connected, for "
                                "JetStream to answer (no responders, no answer, 503), retrying; then exit "
                                "(code 2); 0: exit at the first such answer")

    @field_validator("stream", "durable")
    @classmethod
    def _name(cls, name: str) -> str:
        if not name or any(c in name for c in " .*>\t"):
            raise ValueError(f"{name!r} is not a valid JetStream name (no spaces, '.', '*' or '>')")
        return name


class OtlpSettings(_Model):
    """OTLP exporter; `None` endpoint means the protocol's default (localhost)."""

    endpoint: str | None = None
    protocol: Literal["grpc", "http/protobuf"] = "grpc"
    headers: dict[str, str] = Field(default_factory=dict)
    compression: Literal["none", "gzip"] = "none"
    timeout: float = Field(10.0, gt=0, description="seconds per export attempt")
    insecure: bool | None = None
    certificate: Path | None = None
    client_key: Path | None = None
    client_certificate: Path | None = None
    retry_max_elapsed: float = Field(10.0, ge=0, description="seconds of retries before giving up a batch")
    retry_initial_backoff: float = Field(0.2, gt=0)
    retry_max_backoff: float = Field(5.0, gt=0)
    # gRPC receivers refuse a message over 4 MiB unless told otherwise (the OpenTelemetry
    # Collector, Jaeger, Tempo): a batch's request over this is sent in parts
    # (export/request_split.py), never refused whole at every retry.
    max_request_bytes: int = Field(4_000_000, ge=64 * 1024, description="bytes of one export request at most: a "
                                   "larger batch is sent in several (default: under the 4 MiB a gRPC receiver "
                                   "takes by default)")

    @model_validator(mode="after")
    def _tls(self) -> OtlpSettings:
        _files_exist(self, ("certificate", "client_key", "client_certificate"),
                     together=("client_key", "client_certificate"))
        if self.endpoint is not None:
            url = self.endpoint if "://" in self.endpoint else f"http://{self.endpoint}"
            parts = urlsplit(url)
            if parts.scheme not in {"http", "https"} or not parts.hostname:
                raise ValueError(f"endpoint: not an http(s) URL or host:port: {self.endpoint!r}")
        return self

    @property
    def resolved_endpoint(self) -> str:
        """The URL exported to: gRPC `scheme://host:port`, HTTP the full `/v1/traces` URL."""
        if self.endpoint is None:
            return OTLP_GRPC_DEFAULT if self.protocol == "grpc" else OTLP_HTTP_DEFAULT
        url = self.endpoint if "://" in self.endpoint else f"http://{self.endpoint}"
        if self.protocol == "http/protobuf" and urlsplit(url).path in ("", "/"):
            url = url.rstrip("/") + "/v1/traces"
        return url


class NatsSettings(_Model):
    """How every source (re)connects: backoff between attempts, and when to give up."""

    connect_timeout: float = Field(5.0, gt=0, description="seconds for one connection attempt")
    reconnect_wait_initial: float = Field(0.5, gt=0, description="seconds before the second attempt; "
                                          "doubles with each failure in a row (with jitter)")
    reconnect_wait_max: float = Field(10.0, gt=0, description="the cap of the wait between attempts")
    give_up_after: float | None = Field(None, gt=0, description="exit (code 3) once a source has been "
                                        "disconnected this many seconds, at start-up or later; None: never")
    read_interval: float = Field(0.1, ge=0, description="seconds: at a low rate (reads under 64 KiB) a "
                                 "connection is read at most this often, so that a sidecar wakes a few times a "
                                 "second for its share, not at every message (read_pacing.py); 0: as data comes")

    @model_validator(mode="after")
    def _waits(self) -> NatsSettings:
        if self.reconnect_wait_max < self.reconnect_wait_initial:
            raise ValueError("reconnect_wait_max: must be at least reconnect_wait_initial")
        return self


class BatchSettings(_Model):
    """Batching and the bounded intake (core mode)."""

    # Each batch pays fixed costs whatever it holds: trips between the event loop and a thread
    # (the export's; observe's and convert's too where the pure-Python reference runs:
    # ~70-110 µs of CPU each on this project's machine, wake-ups mostly; `processor_lane`)
    # and an export request (~250-400 µs with gRPC). Under load, batches of
    # 512 paid ~1 µs a trace message for them; 1,024 halve it. The messages in flight to the
    # backend (`exports_in_flight` times this: what the exports hold, and what one round
    # trip carries) stay 2,048, as before: the same memory, the same reach to a slow backend
    # (docs/performance.md, session 42).
    # At most 10,000: ownership.py bounds a forwarded share of one batch as hostile input
    # (`_MAX_FRAMES`) on that promise; and past `otlp.max_request_bytes` a batch's request
    # goes in parts anyway.
    max_messages: int = Field(1024, ge=1, le=10_000, description="trace messages per export batch")
    max_delay: float = Field(0.2, gt=0, description="seconds a message may wait for its batch")
    # At a moderate rate a sidecar's batches hold tens of trace messages, and each is converted
    # and exported on its own: a conversion, an export request and their hand-offs per fifth
    # of a second, the most of what eight sidecars cost beyond one (docs/scale-out.md, eighth
    # round). Merged once ripe, they cost one of each; spans reach the backend that much later.
    coalesce: float = Field(0.8, ge=0, le=5, description="a batch of fewer than 128 trace messages, once its "
                            "link window closed, takes in the batches waiting behind it that ripen within this "
                            "many seconds: converted and exported together (fewer, larger exports at a low "
                            "rate); core mode: a SIGKILLed bridge loses that much more of its own share; "
                            "JetStream mode: they are acked that much later; 0: off")
    # Sized for bursts: 60,000 trace messages of ~1 KB (a second of one busy publisher) take
    # ~90 MB here. Bytes, not a count, bound the memory whatever the messages' size.
    queue_bytes: int = Field(256 * 1024 * 1024, ge=1024, description="bytes of received messages waiting "
                             "(payload + 512 per message); beyond: core mode drops and counts, JetStream mode "
                             "stops fetching until some are settled")
    queue_size: int | None = Field(None, ge=1, description="core mode: optional cap on the messages waiting")
    pending_msgs_limit: int = Field(65_536, ge=1, description="core mode: nats-py per-subscription limit")
    workers: int = Field(1, ge=1, le=64, description="1: convert in this process, export in its threads; "
                         "N > 1: in N worker processes (sharded by trace id), for more than one core")
    cpu_affinity: str = Field("off", description="off: the bridge's processes run where the scheduler puts them; "
                              "auto: each on one CPU of those the bridge may use, the highest first (the bridge's own "
                              "process, then each worker process in turn); or a CPU list (e.g. 3, or 2-3): those, "
                              "in that order. Less CPU per message (bridge/cpu_affinity.py), but a "
                              "process held on a CPU cannot move off it when something else keeps it busy")
    # One export at a time capped a bridge at one batch per round trip (~15k messages/s to a
    # local receiver; less to a remote backend); the Collector's exporters send 10 at once.
    exports_in_flight: int = Field(2, ge=1, le=64, description="export requests sent at once (per worker "
                                   "process with workers > 1), while the next batch is converted")

    @field_validator("cpu_affinity", mode="before")
    @classmethod
    def _cpu_affinity(cls, value: object) -> object:
        # YAML reads a bare `off` as false (and `on` as true): off is off; on says too little
        if value is False:
            return "off"
        if value is True:
            raise ValueError("on/true is not a placement: auto, off or a CPU list")
        if isinstance(value, int):  # `cpu_affinity: 3` in YAML
            return check_setting(str(value))
        return check_setting(value) if isinstance(value, str) else value


class LinkSettingsModel(_Model):
    """How downstream server spans find the upstream egress that forwarded their message
    (the core's `LinkSettings`; docs/span-model.md). Defaults fit hours of traffic: the
    window's memory is bounded by `retention` seconds and `capacity` entries."""

    wait: float = Field(1.0, ge=0, description="seconds a trace message waits before it is mapped, so that "
                        "the other side of its hops can arrive (trace messages arrive in any order)")
    max_hop_latency: float = Field(0.5, gt=0, description="an egress at most this long before the ingress")
    max_clock_skew: float = Field(0.1, ge=0, description="... or at most this long after it (server clocks)")
    capacity: int = Field(1_000_000, ge=100, description="egresses and arrivals remembered (oldest dropped first, "
                          "counted)")
    retention: float = Field(30.0, gt=0, description="seconds an egress or arrival is remembered")
    exchange: str = Field("auto", min_length=1, max_length=200, description="subject on which bridges sharing the "
                          "traces exchange hop evidence: 'auto' (a queue group: nats-otel.links.<queue>; JetStream "
                          "mode: nats-otel.links.<durable>), 'off', or a subject (bridge/exchange.py)")
    exchange_key_file: Path | None = Field(None, description="file holding a shared key: evidence batches are "
                                           "signed with it, and unsigned or badly signed ones are dropped")
    ownership: bool = Field(True, description="core mode, one process, with the exchange on: each trace has one "
                            "owner among the bridges, and the others forward its trace messages there (bridge/"
                            "routing.py); false: every bridge sends every report's evidence to every other")

    @model_validator(mode="after")
    def _check(self) -> LinkSettingsModel:
        if self.retention <= self.wait:
            raise ValueError(f"link.retention ({self.retention}) must exceed link.wait ({self.wait})")
        return self

    def core(self) -> LinkSettings:
        """The core's settings object."""
        return LinkSettings(self.max_hop_latency, self.max_clock_skew, self.capacity, self.retention)


class LimitsSettings(_Model):
    """Bounds on one trace message (the core's `DecodeLimits`): bigger ones are rejected `too_large`."""

    max_payload_bytes: int = Field(8 * 1024 * 1024, ge=1, description="payload as received")
    max_decompressed_bytes: int = Field(16 * 1024 * 1024, ge=1, description="after gzip/snappy")
    max_events: int = Field(10_000, ge=1, description="events in one trace message")


class TelemetrySettings(_Model):
    """`/metrics`, `/healthz`, `/readyz` on one port; `None` disables, 0 picks a free port."""

    metrics_port: int | None = Field(None, ge=0, le=65535)
    metrics_host: str = "0.0.0.0"
    #: Labels the network metrics add to server names (hop and server latency, server
    #: errors). Accounts and subjects can be many: only when asked, and bounded below.
    network_labels: list[Literal["account", "subject"]] = Field(default_factory=list)
    #: Label sets per network metric; past it, samples go to one `_other` series (counted).
    network_max_series: int = Field(1000, ge=1)


class LogSettings(_Model):
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    format: Literal["json", "text"] = "json"
