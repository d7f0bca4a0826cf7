"""Bridge configuration: precedence, the standard OTLP variables, errors naming the field."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from nats_otel.bridge.settings import BridgeSettings, SettingsError, load_settings
from nats_otel.commands import bridge as bridge_command

ROOT = Path(__file__).resolve().parents[2]


def flags(*argv: str) -> dict:
    parser = argparse.ArgumentParser()
    bridge_command.add_arguments(parser)
    return bridge_command.overrides_from(parser.parse_args(list(argv)))


def test_defaults_need_only_a_subject() -> None:
    s = load_settings(overrides=flags("--subject", "trace.a"), env={})
    assert s.mode == "core" and s.sources[0].subjects == ["trace.a"]
    assert s.otlp.protocol == "grpc" and s.otlp.resolved_endpoint == "http://localhost:4317"
    assert s.export_otlp and s.output is None and s.telemetry.metrics_port is None


def test_precedence_file_then_prefixed_env_then_flags(tmp_path: Path) -> None:
    config = tmp_path / "b.yaml"
    config.write_text("mode: jetstream\nservice_name: from-file\nsources: [{subjects: [trace.a]}]\n"
                      "otlp: {endpoint: 'http://file:4317', timeout: 3}\n")
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel:4317", "OTEL_EXPORTER_OTLP_TIMEOUT": "1500",
           "NATS_OTEL_SERVICE_NAME": "from-env", "NATS_OTEL_JETSTREAM__MAX_ACK_PENDING": "7"}
    s = load_settings(config, flags("--service-name", "from-flag", "--stream", "S1"), env)
    assert s.mode == "jetstream"
    assert s.otlp.endpoint == "http://file:4317"  # the file beats the OTel variable ...
    assert s.otlp.timeout == 3
    assert s.service_name == "from-flag"          # ... flags beat everything
    assert s.jetstream.max_ack_pending == 7 and s.jetstream.stream == "S1"


@pytest.mark.parametrize(
    ("env", "endpoint", "protocol"),
    [
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"},
         "http://c:4318/v1/traces", "http/protobuf"),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://c/custom", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:1",
          "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"}, "https://c/custom", "http/protobuf"),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317"}, "http://c:4317", "grpc"),
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}, "http://localhost:4318/v1/traces", "http/protobuf"),
    ],
)
def test_standard_otlp_variables(env: dict, endpoint: str, protocol: str) -> None:
    s = load_settings(overrides=flags("--subject", "t"), env=env)
    assert (s.otlp.resolved_endpoint, s.otlp.protocol) == (endpoint, protocol)


def test_otlp_headers_compression_insecure_timeout_from_env() -> None:
    env = {"OTEL_EXPORTER_OTLP_HEADERS": "Authorization=Bearer%20x, x-tenant = t1",
           "OTEL_EXPORTER_OTLP_COMPRESSION": "gzip", "OTEL_EXPORTER_OTLP_INSECURE": "true",
           "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "2500"}
    s = load_settings(overrides=flags("--subject", "t"), env=env)
    assert s.otlp.headers == {"authorization": "Bearer x", "x-tenant": "t1"}
    assert (s.otlp.compression, s.otlp.insecure, s.otlp.timeout) == ("gzip", True, 2.5)


def test_output_alone_turns_otlp_off_and_flags_apply_to_every_file_source(tmp_path: Path) -> None:
    config = tmp_path / "b.yaml"
    config.write_text("sources:\n  - {name: a, subjects: [trace.a]}\n  - {name: b, subjects: [trace.b]}\n")
    s = load_settings(config, flags("--output", str(tmp_path / "o.jsonl"), "--user", "u", "--password", "p"), {})
    assert not s.export_otlp and s.output == tmp_path / "o.jsonl"
    assert [(x.name, x.user, x.password) for x in s.sources] == [("a", "u", "p"), ("b", "u", "p")]
    both = load_settings(config, flags("--output", "o.jsonl", "--otlp-endpoint", "http://h:4317"), {})
    assert both.export_otlp and both.output is not None


@pytest.mark.parametrize(
    ("yaml_text", "where", "field", "what"),
    [
        ("otlp: {protocol: thrift}", "config file", "otlp.protocol", "'grpc' or 'http/protobuf'"),
        ("otlp: {endpont: x}", "config file", "otlp.endpont", "Extra inputs are not permitted"),
        ("batch: {max_messages: 0}", "config file", "batch.max_messages", "greater than or equal to 1"),
        ("batch: {max_messages: 20000}", "config file", "batch.max_messages", "less than or equal to 10000"),
        ("otlp: {max_request_bytes: 1000}", "config file", "otlp.max_request_bytes", "greater than or equal to 65536"),
        ("sources: [{subjects: [t], user: u}]", "config file", "sources.0", "user and password"),
        ("sources: [{subjects: []}]", "config file", "sources.0.subjects", "at least one trace subject"),
        ("mode: jetstream\nsources: [{subjects: [t], queue: q}]", "config file", "sources.0.queue", "core mode"),
        ("mode: jetstream\njetstream: {ack_wait: 5}", "config file", "jetstream.ack_wait", "must exceed"),
        ("sources: [{subjects: [t], urls: ['http://x']}]", "config file", "sources.0.urls", "not a NATS URL"),
        ("jetstream: {stream: 'a.b'}", "config file", "jetstream.stream", "not a valid JetStream name"),
        ("service_name: 'nats/{zone}'", "config file", "service_name", "may use only {server}, {cluster}"),
        ("telemetry: {network_labels: [user]}", "config file", "telemetry.network_labels.0", "'account' or"),
    ],
)
def test_errors_name_file_and_field(tmp_path: Path, yaml_text: str, where: str, field: str, what: str) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text(yaml_text + ("" if "sources" in yaml_text else "\nsources: [{subjects: [t]}]"))
    with pytest.raises(SettingsError) as info:
        load_settings(config, env={})
    message = str(info.value)
    assert f"{where} {config}: field '{field}'" in message and what in message, message


def test_errors_name_the_variable_or_flag() -> None:
    with pytest.raises(SettingsError, match=r"NATS_OTEL_\* environment: field 'telemetry.metrics_port'"):
        load_settings(overrides=flags("--subject", "t"), env={"NATS_OTEL_TELEMETRY__METRICS_PORT": "70000"})
    with pytest.raises(SettingsError, match=r"command line: field 'sources.0.creds': .*no such file"):
        load_settings(overrides=flags("--subject", "t", "--creds", "/nonexistent.creds"), env={})
    with pytest.raises(SettingsError, match=r"OTEL_EXPORTER_OTLP_\* environment: field 'otlp.compression'"):
        load_settings(overrides=flags("--subject", "t"), env={"OTEL_EXPORTER_OTLP_COMPRESSION": "zstd"})


def test_the_projects_own_switches_are_no_settings() -> None:
    """`NATS_OTEL_NO_EXTENSIONS`, the backfill's archive switch and cache folder share the
    prefix: a bridge started with them set runs (an unknown NATS_OTEL_ name still fails)."""
    env = {"NATS_OTEL_NO_EXTENSIONS": "1", "NATS_OTEL_SPARK_ARCHIVE": "off", "NATS_OTEL_CACHE": "/tmp/c"}
    assert load_settings(overrides=flags("--subject", "t"), env=env) == load_settings(
        overrides=flags("--subject", "t"), env={})
    with pytest.raises(SettingsError, match=r"NATS_OTEL_\* environment: field 'cache_dir'"):
        load_settings(overrides=flags("--subject", "t"), env={"NATS_OTEL_CACHE_DIR": "/tmp/c"})


def test_unreadable_or_malformed_file(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="cannot read"):
        load_settings(tmp_path / "missing.yaml", env={})
    bad = tmp_path / "bad.yaml"
    bad.write_text("mode: [core\n")
    with pytest.raises(SettingsError, match=f"config file {bad}: not valid YAML"):
        load_settings(bad, env={})


def test_shipped_example_is_valid() -> None:
    s = load_settings(ROOT / "config" / "bridge.example.yaml", env={})
    assert isinstance(s, BridgeSettings) and [x.name for x in s.sources] == ["account-a", "account-b"]
    assert s.telemetry.metrics_port == 9464


def test_nats_give_up_flag_and_burst_defaults() -> None:
    s = load_settings(overrides=flags("--subject", "t", "--nats-give-up-after", "30"), env={})
    assert s.nats.give_up_after == 30 and s.nats.reconnect_wait_max == 10
    assert s.batch.queue_bytes == 256 * 1024 * 1024 and s.batch.queue_size is None
    with pytest.raises(SettingsError, match=r"field 'nats.reconnect_wait_max': must be at least"):
        load_settings(overrides={**flags("--subject", "t"), "nats": {"reconnect_wait_max": 0.1}}, env={})
    with pytest.raises(SettingsError, match=r"NATS_OTEL_\* environment: field 'batch.queue_bytes'"):
        load_settings(overrides=flags("--subject", "t"), env={"NATS_OTEL_BATCH__QUEUE_BYTES": "10"})


def test_jetstream_startup_wait_default_file_env_flag(tmp_path: Path) -> None:
    assert load_settings(overrides=flags("--subject", "t"), env={}).jetstream.startup_wait == 30
    config = tmp_path / "b.yaml"
    config.write_text("mode: jetstream\nsources: [{subjects: [t]}]\njetstream: {startup_wait: 5}\n")
    assert load_settings(config, env={}).jetstream.startup_wait == 5
    env = {"NATS_OTEL_JETSTREAM__STARTUP_WAIT": "7.5"}
    assert load_settings(config, env=env).jetstream.startup_wait == 7.5
    assert load_settings(config, flags("--jetstream-startup-wait", "0"), env).jetstream.startup_wait == 0
    with pytest.raises(SettingsError, match=r"command line: field 'jetstream.startup_wait': .*greater than or equal"):
        load_settings(config, flags("--jetstream-startup-wait", "-1"), env)


def test_service_name_flag_with_an_unknown_field_is_a_usage_error() -> None:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "nats_otel.cli", "convert", "--service-name", "nats/{zone}",
                           "-"], input=b"", capture_output=True, timeout=60)
    assert done.returncode == 2
    assert b"may use only {server}, {cluster}, {domain}" in done.stderr and b"Traceback" not in done.stderr


def test_link_exchange_subject_and_key(tmp_path: Path) -> None:
    def load(*argv: str) -> BridgeSettings:
        return load_settings(overrides=flags("--subject", "t", *argv), env={})

    assert load().exchange_subject is None  # one bridge: no new setting, nothing exchanged
    assert load("--queue", "g").exchange_subject == "nats-otel.links.g"
    assert load("--mode", "jetstream", "--durable", "d").exchange_subject == "nats-otel.links.d"
    assert load("--queue", "g", "--link-exchange", "off").exchange_subject is None
    assert load("--link-exchange", "links.here").exchange_subject == "links.here"
    with pytest.raises(SettingsError, match="not a plain subject"):
        load("--link-exchange", "links.>")
    short, good = tmp_path / "short.key", tmp_path / "good.key"
    short.write_bytes(b"too short\n")
    good.write_bytes(b"0123456789abcdef0123\n")
    for path in (short, tmp_path / "missing.key"):
        with pytest.raises(SettingsError, match="16 bytes or more"):
            load("--queue", "g", "--link-exchange-key", str(path))
    assert load("--queue", "g", "--link-exchange-key", str(good)).exchange_key() == b"0123456789abcdef0123"


def test_jetstream_mode_keeps_hop_evidence_as_long_as_a_partner_may_come_back() -> None:
    js = {"mode": "jetstream", "sources": [{"name": "a", "subjects": ["trace.a"]}],
          "jetstream": {"stream": "TRACES", "durable": "d", "nak_delay_max": 5.0}}
    raised = load_settings(overrides=js, env={})
    assert raised.link.retention == raised.link.core().retention_s == 2 * 30.0 + 5.0 + 2 * 1.0 + 1.0
    core = load_settings(overrides={"sources": [{"name": "a", "subjects": ["trace.a"]}]}, env={})
    assert core.link.retention == 30.0  # core mode: nothing is redelivered
    with pytest.raises(SettingsError, match=r"link.retention.*at least 68 s in JetStream mode"):
        load_settings(overrides={**js, "link": {"retention": 60.0}}, env={})


def test_small_batches_coalesce_within_the_link_windows_memory() -> None:
    """`batch.coalesce` (0.8 s; 0 off) maps a small batch that much after its link window
    closed: the window must remember its hops' evidence that long (`link.retention`)."""
    source = {"sources": [{"name": "a", "subjects": ["trace.a"]}]}
    assert load_settings(overrides=source, env={}).batch.coalesce == 0.8
    assert load_settings(overrides=source, env={"NATS_OTEL_BATCH__COALESCE": "0"}).batch.coalesce == 0.0
    with pytest.raises(SettingsError, match=r"link.retention \(1.5\) must exceed link.wait plus batch.coalesce"):
        load_settings(overrides={**source, "link": {"retention": 1.5}}, env={})
    assert load_settings(overrides={**source, "link": {"retention": 1.5}, "batch": {"coalesce": 0}},
                         env={}).link.retention == 1.5


def test_jetstream_ack_wait_covers_the_link_window_and_coalescing() -> None:
    """A fetched message is unacked through its link window, the small batches' wait to be
    exported together and the export's retries: an ack_wait shorter than all of them would
    have the server redeliver it meanwhile (before, only the export was counted)."""
    js = {"sources": [{"subjects": ["t"]}], "mode": "jetstream"}  # retries 10 s + timeout 10 s
    with pytest.raises(SettingsError, match=r"'jetstream.ack_wait': must exceed .* \(21.8 s; it is 21.5 s\)"):
        load_settings(overrides={**js, "jetstream": {"ack_wait": 21.5}}, env={})
    assert load_settings(overrides={**js, "jetstream": {"ack_wait": 21.5}, "batch": {"coalesce": 0}},
                         env={}).jetstream.ack_wait == 21.5
