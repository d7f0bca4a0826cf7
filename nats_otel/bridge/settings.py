"""The bridge's configuration: one pydantic model, loaded once at start-up.

Sources, lowest precedence first (each overrides the one before, field by field):

1. the defaults below (the only place defaults live);
2. the standard `OTEL_EXPORTER_OTLP_*` variables (OpenTelemetry's exporter spec);
3. the YAML file (`--config`);
4. `NATS_OTEL_<SECTION>__<FIELD>` variables (e.g. `NATS_OTEL_OTLP__ENDPOINT`);
5. command-line flags.

A validation error is a `SettingsError` whose message names where the bad value came from
(file, variable or flag), the field's dotted path, and what is wrong with it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from nats_otel.core.linking import LinkSettings
from nats_otel.core.mapping import check_service_name

__all__ = [
    "BatchSettings",
    "BridgeSettings",
    "JetStreamSettings",
    "LimitsSettings",
    "LogSettings",
    "NatsSettings",
    "NatsSource",
    "OtlpSettings",
    "SettingsError",
    "TelemetrySettings",
    "TlsFiles",
    "load_settings",
]

ENV_PREFIX = "NATS_OTEL_"
OTLP_GRPC_DEFAULT = "http://localhost:4317"
OTLP_HTTP_DEFAULT = "http://localhost:4318/v1/traces"


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
        if (self.cert is None) != (self.key is None):
            raise ValueError("cert and key must be given together")
        for name in ("ca", "cert", "key"):
            path = getattr(self, name)
            if path is not None and not path.is_file():
                raise ValueError(f"{name}: no such file: {path}")
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

    @model_validator(mode="after")
    def _tls(self) -> OtlpSettings:
        if (self.client_key is None) != (self.client_certificate is None):
            raise ValueError("client_key and client_certificate must be given together")
        for name in ("certificate", "client_key", "client_certificate"):
            path = getattr(self, name)
            if path is not None and not path.is_file():
                raise ValueError(f"{name}: no such file: {path}")
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

    @model_validator(mode="after")
    def _waits(self) -> NatsSettings:
        if self.reconnect_wait_max < self.reconnect_wait_initial:
            raise ValueError("reconnect_wait_max: must be at least reconnect_wait_initial")
        return self


class BatchSettings(_Model):
    """Batching and the bounded intake (core mode)."""

    max_messages: int = Field(512, ge=1, description="trace messages per export batch")
    max_delay: float = Field(0.2, gt=0, description="seconds a message may wait for its batch")
    # Sized for bursts: 60,000 trace messages of ~1 KB (a second of one busy publisher) take
    # ~90 MB here. Bytes, not a count, bound the memory whatever the messages' size.
    queue_bytes: int = Field(256 * 1024 * 1024, ge=1024, description="bytes of received messages waiting "
                             "(payload + 512 per message); beyond: core mode drops and counts, JetStream mode "
                             "stops fetching until some are settled")
    queue_size: int | None = Field(None, ge=1, description="core mode: optional cap on the messages waiting")
    pending_msgs_limit: int = Field(65_536, ge=1, description="core mode: nats-py per-subscription limit")
    workers: int = Field(1, ge=1, le=64, description="1: convert/export in one thread; N > 1: in N worker "
                         "processes (sharded by trace id), for more than one core")
    # One export at a time capped a bridge at one batch per round trip (~15k messages/s to a
    # local receiver; less to a remote backend); the Collector's exporters send 10 at once.
    exports_in_flight: int = Field(4, ge=1, le=64, description="export requests sent at once (per worker "
                                   "process with workers > 1), while the next batch is converted")


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


class BridgeSettings(_Model):
    """Everything `nats-otel bridge` needs; resolved once, passed down explicitly."""

    mode: Literal["core", "jetstream"] = "core"
    sources: list[NatsSource] = Field(default_factory=lambda: [NatsSource()], min_length=1)
    jetstream: JetStreamSettings = JetStreamSettings()
    nats: NatsSettings = NatsSettings()
    otlp: OtlpSettings = OtlpSettings()
    export_otlp: bool = Field(True, description="False: only --output (set when --output is given alone)")
    output: Path | None = None
    archive: Path | None = None
    batch: BatchSettings = BatchSettings()
    limits: LimitsSettings = LimitsSettings()
    link: LinkSettingsModel = LinkSettingsModel()
    telemetry: TelemetrySettings = TelemetrySettings()
    log: LogSettings = LogSettings()
    #: Fixed, or a template of the reporting server ({server}, {cluster}, {domain}).
    service_name: str = "nats-server"
    allow_headers: list[str] = Field(default_factory=list)
    drain_timeout: float = Field(10.0, gt=0)
    max_runtime: float | None = Field(None, gt=0, description="drain and exit after this many seconds")

    @field_validator("service_name")
    @classmethod
    def _service_name(cls, value: str) -> str:
        check_service_name(value)
        return value

    @property
    def exchange_subject(self) -> str | None:
        """Where this bridge exchanges hop evidence (`link.exchange`), or None: off. 'auto' is on
        where bridges may share the traces: a queue group, or JetStream mode (a shared durable)."""
        chosen = self.link.exchange
        if chosen != "auto":
            return None if chosen == "off" else chosen
        if self.mode == "jetstream":
            return f"nats-otel.links.{self.jetstream.durable}"
        queue = next((source.queue for source in self.sources if source.queue), None)
        return f"nats-otel.links.{queue}" if queue else None

    def exchange_key(self) -> bytes | None:
        """The shared key of `link.exchange_key_file` (checked at load, read at start), or None."""
        path = self.link.exchange_key_file
        return None if path is None else path.read_bytes().strip()

    def jetstream_link_retention(self) -> float:
        """How long hop evidence must stay in the link window in JetStream mode: a bridge
        killed with reports unacked restarts and replays the evidence it had shared; a
        report's partner comes back up to an ack wait later (unacked when the bridge died,
        or after its nak delay), waits `link.wait`, and may be held for up to another ack wait
        (`JetStreamSource.hold`) before it is mapped."""
        js = self.jetstream
        return 2 * js.ack_wait + js.nak_delay_max + 2 * self.link.wait + 1.0

    @model_validator(mode="after")
    def _check(self) -> BridgeSettings:
        names = [s.name for s in self.sources]
        if len(set(names)) != len(names):
            raise ValueError(f"sources: source names must be unique, got {names}")
        for i, source in enumerate(self.sources):
            if not source.subjects:
                raise ValueError(f"sources.{i}.subjects: at least one trace subject is needed")
            if self.mode == "jetstream" and source.queue:
                raise ValueError(f"sources.{i}.queue: queue groups are for core mode; "
                                 "JetStream bridges share one durable consumer instead")
        if self.mode == "jetstream" and self.otlp.retry_max_elapsed + self.otlp.timeout >= self.jetstream.ack_wait:
            raise ValueError("jetstream.ack_wait: must exceed otlp.retry_max_elapsed + otlp.timeout, "
                             "or batches are redelivered while still being exported")
        if self.mode == "jetstream" and self.link.retention < self.jetstream_link_retention():
            needed = self.jetstream_link_retention()
            if "retention" in self.link.model_fields_set:
                raise ValueError(f"link.retention: at least {needed:g} s in JetStream mode (twice jetstream.ack_wait, "
                                 "plus nak_delay_max and twice link.wait): a report's partner may be redelivered "
                                 "that late after a restart, and must still find its evidence")
            # The default, raised to what JetStream mode needs (frozen model: set as pydantic would).
            object.__setattr__(self, "link", self.link.model_copy(update={"retention": needed}))
        if not self.export_otlp and self.output is None:
            raise ValueError("export_otlp: nothing to export to (no output file either)")
        subject = self.exchange_subject
        if subject is not None and (any(c.isspace() for c in subject) or ">" in subject or "*" in subject):
            raise ValueError(f"link.exchange: {subject!r} is not a plain subject (no wildcards or spaces)")
        try:
            key = self.exchange_key()
        except OSError:
            key = b""
        if key is not None and len(key) < 16:
            raise ValueError(f"link.exchange_key_file: {self.link.exchange_key_file} must be a readable file "
                             "holding a key of 16 bytes or more")
        return self


# --- loading ------------------------------------------------------------------------------


def _otel_env(env: Mapping[str, str]) -> dict[str, Any]:
    """The standard OTLP exporter variables, traces-specific first (OTel spec)."""

    def get(name: str) -> str | None:
        return env.get(f"OTEL_EXPORTER_OTLP_TRACES_{name}") or env.get(f"OTEL_EXPORTER_OTLP_{name}")

    otlp: dict[str, Any] = {}
    protocol = get("PROTOCOL")
    if protocol:
        otlp["protocol"] = protocol
    # The generic endpoint is a base URL; `resolved_endpoint` appends `/v1/traces` for HTTP
    # when it has no path. The traces-specific one is used as is.
    endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    if endpoint:
        otlp["endpoint"] = endpoint
    if get("HEADERS"):
        otlp["headers"] = _parse_headers(get("HEADERS") or "")
    for name, key in (("COMPRESSION", "compression"), ("CERTIFICATE", "certificate"),
                      ("CLIENT_KEY", "client_key"), ("CLIENT_CERTIFICATE", "client_certificate")):
        if get(name):
            otlp[key] = get(name)
    if get("TIMEOUT"):
        try:
            otlp["timeout"] = float(get("TIMEOUT") or 0) / 1000.0  # the spec says milliseconds
        except ValueError:
            otlp["timeout"] = get("TIMEOUT")
    if get("INSECURE"):
        otlp["insecure"] = (get("INSECURE") or "").strip().lower() == "true"
    return {"otlp": otlp} if otlp else {}


def _parse_headers(text: str) -> dict[str, str]:
    from urllib.parse import unquote

    headers = {}
    for item in text.split(","):
        if "=" in item:
            key, value = item.split("=", 1)
            headers[unquote(key.strip()).lower()] = unquote(value.strip())
    return headers


def _prefixed_env(env: Mapping[str, str]) -> dict[str, Any]:
    """`NATS_OTEL_OTLP__ENDPOINT=x` -> {"otlp": {"endpoint": "x"}}; lists as YAML flow text."""
    tree: dict[str, Any] = {}
    for name, value in env.items():
        if not name.startswith(ENV_PREFIX):
            continue
        path = [p.lower() for p in name[len(ENV_PREFIX):].split("__") if p]
        node = tree
        for part in path[:-1]:
            node = node.setdefault(part, {})
        # YAML parsing gives `true`, numbers and `[a, b]` their types; plain text stays text.
        try:
            node[path[-1]] = yaml.safe_load(value) if value else value
        except yaml.YAMLError:
            node[path[-1]] = value
    return tree


def _merge(base: dict[str, Any], top: Mapping[str, Any], origin: dict[str, str], label: str,
           prefix: str = "") -> None:
    """Deep-merge `top` into `base`, noting for each leaf which source set it."""
    for key, value in top.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and isinstance(base.get(key), dict) and key != "headers":
            _merge(base[key], value, origin, label, f"{path}.")
        else:
            base[key] = value.copy() if isinstance(value, dict) else value
            for known in [k for k in origin if k.startswith(f"{path}.")]:
                del origin[known]
            origin[path] = label


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise SettingsError(f"config file {path}: cannot read it: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise SettingsError(f"config file {path}: not valid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise SettingsError(f"config file {path}: the top level must be a mapping, not {type(data).__name__}")
    return data


def _where(loc: tuple[Any, ...], origin: dict[str, str]) -> str:
    parts = [str(p) for p in loc]
    for n in range(len(parts), 0, -1):
        label = origin.get(".".join(parts[:n]))
        if label:
            return label
    return "defaults"


def load_settings(
    config_file: str | os.PathLike[str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
) -> BridgeSettings:
    """Settings from defaults, OTel variables, the YAML file, `NATS_OTEL_*` and `overrides`.

    `overrides` is a nested dict (the command line's flags); its `_source_flags` entry holds
    NATS source fields that apply to every source (or make the only one when none is
    configured). `env` defaults to `os.environ`.
    Raises `SettingsError` naming the source, the field and the problem.
    """
    env = os.environ if env is None else env
    data: dict[str, Any] = {}
    origin: dict[str, str] = {}
    otel = _otel_env(env)
    _merge(data, otel, origin, "OTEL_EXPORTER_OTLP_* environment")
    if config_file is not None:
        path = Path(config_file)
        _merge(data, _read_yaml(path), origin, f"config file {path}")
    _merge(data, _prefixed_env(env), origin, f"{ENV_PREFIX}* environment")
    if overrides:
        overrides = dict(overrides)
        source_flags = overrides.pop("_source_flags", None)
        _merge(data, overrides, origin, "command line")
        if source_flags:
            sources = data.get("sources")
            if not isinstance(sources, list) or not sources:
                data["sources"] = sources = [{}]
            for i, source in enumerate(sources):
                if isinstance(source, dict):
                    _merge(source, source_flags, origin, "command line", f"sources.{i}.")
    try:
        return BridgeSettings.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            loc = tuple(err["loc"])
            message = err["msg"].removeprefix("Value error, ")
            head, sep, rest = message.partition(": ")
            if sep and head.replace("_", "a").replace(".", "a").isalnum() and head.islower():
                # A cross-field check names its field at the start of its message (relative
                # to the model that checks it).
                loc, message = (*loc, *head.split(".")), rest
            field = ".".join(str(p) for p in loc) or "(top level)"
            problems.append(f"{_where(loc, origin)}: field '{field}': {message}")
        raise SettingsError("invalid configuration:\n  " + "\n  ".join(problems)) from None
