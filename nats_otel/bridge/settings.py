"""The bridge's configuration: one pydantic model, loaded once at start-up.

Sources, lowest precedence first (each overrides the one before, field by field):

1. the models' defaults (`settings_sections.py`, `BridgeSettings` below: the only place defaults live);
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

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from nats_otel.bridge.settings_sections import (
    BatchSettings,
    JetStreamSettings,
    LimitsSettings,
    LinkSettingsModel,
    LogSettings,
    NatsSettings,
    NatsSource,
    OtlpSettings,
    SettingsError,
    TelemetrySettings,
    _Model,
)
from nats_otel.core.mapping import check_service_name

# The sections are defined in `settings_sections` (and importable from here, as before);
# these are this module's own.
__all__ = ["BridgeSettings", "load_settings"]

ENV_PREFIX = "NATS_OTEL_"

# The project's own switches that share the prefix but are no bridge setting: read where
# they act (`core.accel`; the backfill's `spark_backfill.jvm_archive`), skipped here, or
# a bridge started with one set would refuse its configuration ("extra inputs").
NOT_SETTINGS = frozenset({"NATS_OTEL_NO_EXTENSIONS", "NATS_OTEL_SPARK_ARCHIVE", "NATS_OTEL_CACHE"})


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
    def queue_group(self) -> str | None:
        """The queue group the sources subscribe in (the first named), or None: a bridge alone."""
        return next((source.queue for source in self.sources if source.queue), None)

    @property
    def exchange_subject(self) -> str | None:
        """Where this bridge exchanges hop evidence (`link.exchange`), or None: off. 'auto' is on
        where bridges may share the traces: a queue group, or JetStream mode (a shared durable)."""
        chosen = self.link.exchange
        if chosen != "auto":
            return None if chosen == "off" else chosen
        if self.mode == "jetstream":
            return f"nats-otel.links.{self.jetstream.durable}"
        queue = self.queue_group
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

    def read_interval_allowed(self) -> float:
        """The longest `nats.read_interval` this link window allows: a report forwarded to its
        owner is read twice on the way, each read up to an interval late, and waits two
        batches (at the bridge the queue group chose, then at the owner), all inside
        `link.wait`; half the slack left by the two batch delays goes to the reads."""
        return max(0.0, (self.link.wait - 2 * self.batch.max_delay) / 4)

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
        # A fetched message stays unacked through its link window, the small batches' wait to
        # be exported together, and the export with its retries: the server must not
        # redeliver it meanwhile (a duplicate, and the work twice).
        held = self.link.wait + self.batch.coalesce + self.otlp.retry_max_elapsed + self.otlp.timeout
        if self.mode == "jetstream" and held >= self.jetstream.ack_wait:
            raise ValueError(f"jetstream.ack_wait: must exceed link.wait + batch.coalesce + otlp.retry_max_elapsed "
                             f"+ otlp.timeout ({held:g} s; it is {self.jetstream.ack_wait:g} s), or batches are "
                             "redelivered while still waiting or being exported")
        if self.mode == "jetstream" and self.link.retention < self.jetstream_link_retention():
            needed = self.jetstream_link_retention()
            if "retention" in self.link.model_fields_set:
                raise ValueError(f"link.retention: at least {needed:g} s in JetStream mode (twice jetstream.ack_wait, "
                                 "plus nak_delay_max and twice link.wait): a report's partner may be redelivered "
                                 "that late after a restart, and must still find its evidence")
            # The default, raised to what JetStream mode needs (frozen model: set as pydantic would).
            object.__setattr__(self, "link", self.link.model_copy(update={"retention": needed}))
        if self.mode == "core" and self.link.retention <= self.link.wait + self.batch.coalesce:
            raise ValueError(f"link.retention ({self.link.retention:g}) must exceed link.wait plus batch.coalesce "
                             f"({self.link.wait + self.batch.coalesce:g}): a small batch is mapped that long after "
                             "it arrived, and its hops' evidence must still be there")
        paced = self.read_interval_allowed()
        if self.nats.read_interval > paced:
            if "read_interval" in self.nats.model_fields_set:
                raise ValueError(f"nats.read_interval: at most {paced:g} s with link.wait {self.link.wait:g} s and "
                                 f"batch.max_delay {self.batch.max_delay:g} s: a hop's two reports at two bridges "
                                 "are each read up to one interval late, and batched twice, and must still meet "
                                 "within the link window")
            # The default, lowered to what this link window allows (frozen model: set as pydantic would).
            object.__setattr__(self, "nats", self.nats.model_copy(update={"read_interval": paced}))
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
        if not name.startswith(ENV_PREFIX) or name in NOT_SETTINGS:
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
