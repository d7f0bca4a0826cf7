"""`nats-otel bridge`: the sidecar. Flags cover the everyday settings; the rest is YAML."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from nats_otel.commands.convert import SERVICE_NAME_HELP, service_name_arg

HELP = "subscribe to NATS trace destinations and export the spans over OTLP (the sidecar)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", help="YAML config file (see config/bridge.example.yaml)")
    nats = parser.add_argument_group("NATS (one source; a config file may list several)")
    nats.add_argument("--nats-url", action="append", metavar="URL", help="server URL (repeatable)")
    nats.add_argument("--subject", action="append", metavar="SUBJ",
                      help="trace subject: an account's msg_trace dest or an ad-hoc dest (repeatable)")
    nats.add_argument("--queue", metavar="GROUP", help="queue group, so several bridges share the load (core)")
    nats.add_argument("--creds", metavar="FILE", help="user credentials (JWT + nkey) file")
    nats.add_argument("--nkey-seed", metavar="FILE", help="nkey seed file")
    nats.add_argument("--user", help="user name (with --password)")
    nats.add_argument("--password", help="password (with --user)")
    nats.add_argument("--token", help="authentication token")
    nats.add_argument("--tls-ca", metavar="FILE", help="CA bundle to verify the servers")
    nats.add_argument("--tls-cert", metavar="FILE", help="client certificate (with --tls-key)")
    nats.add_argument("--tls-key", metavar="FILE", help="client key (with --tls-cert)")
    nats.add_argument("--nats-give-up-after", type=float, metavar="SECONDS",
                      help="exit with code 3 once a source has been disconnected SECONDS in a row, at "
                           "start-up or later (default: keep retrying, the wait growing to 10 s)")
    mode = parser.add_argument_group("intake")
    mode.add_argument("--mode", choices=["core", "jetstream"], help="core: at most once (default); "
                      "jetstream: at least once through a durable consumer")
    mode.add_argument("--stream", metavar="NAME", help="JetStream stream of the trace subjects")
    mode.add_argument("--durable", metavar="NAME", help="durable consumer name")
    mode.add_argument("--create-stream", action="store_true", default=None,
                      help="create the stream on the trace subjects if it does not exist")
    mode.add_argument("--jetstream-startup-wait", type=float, metavar="SECONDS",
                      help="wait this long at start-up, once connected, for JetStream to answer (a cluster "
                           "starting too), then exit with code 2 (default 30; 0: exit at once)")
    mode.add_argument("--link-exchange", metavar="SUBJECT", help="subject on which bridges sharing a "
                      "cluster's traces exchange hop evidence: auto (default: on with --queue or in JetStream "
                      "mode), off, or a subject")
    mode.add_argument("--link-exchange-key", metavar="FILE", help="shared key file: sign the evidence, drop "
                      "what is not signed with it")
    mode.add_argument("--link-ownership", choices=("on", "off"), help="with the exchange on, in core mode: each "
                      "trace linked by one owner among the bridges, the others forwarding its trace messages there "
                      "(default on); off: every report's evidence to every bridge")
    mode.add_argument("--workers", type=int, metavar="N", help="convert and export in N worker processes "
                      "(default 1: one thread); use about one per spare core")
    mode.add_argument("--cpu-affinity", metavar="CPUS", help="off (default), auto or a CPU list (e.g. 3): run "
                      "the bridge's process, and each worker process, on one CPU each (less CPU per message; "
                      "for CPUs you place: a process held on a CPU cannot move off it)")
    out = parser.add_argument_group("export")
    out.add_argument("--otlp-endpoint", metavar="URL", help="OTLP endpoint (default: OTEL_EXPORTER_OTLP_* "
                     "or localhost:4317 for grpc, :4318/v1/traces for http/protobuf)")
    out.add_argument("--otlp-protocol", choices=["grpc", "http/protobuf"], help="OTLP transport (default grpc)")
    out.add_argument("--output", metavar="FILE", help="append OTLP/JSON lines to FILE (instead of OTLP, "
                     "unless an OTLP endpoint is also given)")
    out.add_argument("--archive", metavar="FILE", help="also append every received raw trace message to FILE "
                     "as archive JSON Lines (input of `convert` and the backfill)")
    out.add_argument("--service-name", metavar="NAME", type=service_name_arg, help=SERVICE_NAME_HELP)
    ops = parser.add_argument_group("operations")
    ops.add_argument("--metrics-port", type=int, metavar="N", help="serve /metrics, /healthz, /readyz on N "
                     "(0: a free port, logged)")
    ops.add_argument("--log-format", choices=["json", "text"], help="log lines as JSON (default) or text")
    ops.add_argument("--log-level", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    ops.add_argument("--max-runtime", type=float, metavar="SECONDS", help="drain and exit after SECONDS")
    ops.add_argument("--check-config", action="store_true", help="validate the configuration, print it, exit")


def overrides_from(args: argparse.Namespace) -> dict[str, Any]:
    """The flags as a nested settings dict (only what was given)."""
    source: dict[str, Any] = {}
    for flag, key in (("nats_url", "urls"), ("subject", "subjects"), ("queue", "queue"), ("creds", "creds"),
                      ("nkey_seed", "nkey_seed"), ("user", "user"), ("password", "password"),
                      ("token", "token")):
        value = getattr(args, flag)
        if value is not None:
            source[key] = value
    tls = {k: getattr(args, f"tls_{k}") for k in ("ca", "cert", "key") if getattr(args, f"tls_{k}") is not None}
    if tls:
        source["tls"] = tls
    out: dict[str, Any] = {}
    if args.nats_give_up_after is not None:
        out["nats"] = {"give_up_after": args.nats_give_up_after}
    if source:
        # Flags describe one source; with a config file listing several, they apply to all.
        out["_source_flags"] = source
    js = {k: getattr(args, k) for k in ("stream", "durable", "create_stream") if getattr(args, k) is not None}
    if args.jetstream_startup_wait is not None:
        js["startup_wait"] = args.jetstream_startup_wait
    if js:
        out["jetstream"] = js
    otlp = {}
    if args.otlp_endpoint is not None:
        otlp["endpoint"] = args.otlp_endpoint
    if args.otlp_protocol is not None:
        otlp["protocol"] = args.otlp_protocol
    if otlp:
        out["otlp"] = otlp
    if args.output is not None:
        out["output"] = args.output
        if args.otlp_endpoint is None:
            out["export_otlp"] = False
    for flag in ("mode", "archive", "service_name", "max_runtime"):
        if getattr(args, flag) is not None:
            out[flag] = getattr(args, flag)
    batch = {k: v for k, v in (("workers", args.workers), ("cpu_affinity", args.cpu_affinity)) if v is not None}
    if batch:
        out["batch"] = batch
    link = {k: v for k, v in (("exchange", args.link_exchange), ("exchange_key_file", args.link_exchange_key))
            if v is not None}
    if args.link_ownership is not None:
        link["ownership"] = args.link_ownership == "on"
    if link:
        out["link"] = link
    if args.metrics_port is not None:
        out["telemetry"] = {"metrics_port": args.metrics_port}
    log = {k: v for k, v in (("format", args.log_format), ("level", args.log_level)) if v is not None}
    if log:
        out["log"] = log
    return out


def run(args: argparse.Namespace) -> int:
    from nats_otel.bridge.settings import SettingsError, load_settings
    from nats_otel.bridge.telemetry import configure_logging
    from nats_otel.gc_tuning import tune_gc_for_throughput

    try:
        settings = load_settings(args.config, overrides_from(args))
    except SettingsError as exc:
        print(f"nats-otel bridge: {exc}", file=sys.stderr)
        return 2
    if args.check_config:
        print(settings.model_dump_json(indent=2, exclude={"sources": {"__all__": {"password", "token"}}}))
        return 0
    configure_logging(settings.log.level, settings.log.format)
    try:  # before any thread starts: the threads started later inherit the CPU
        pin_processes(settings)
    except (OSError, ValueError) as exc:
        print(f"nats-otel bridge: {exc}", file=sys.stderr)
        return 2
    tune_gc_for_throughput()
    return asyncio.run(run_bridge(settings))


def pin_processes(settings: Any) -> None:
    """`batch.cpu_affinity`: this process on its CPU now, its workers on theirs when they start."""
    from nats_otel.bridge import cpu_affinity
    from nats_otel.bridge.loop import log

    if settings.batch.cpu_affinity == cpu_affinity.OFF:
        return
    allowed = cpu_affinity.process_cpus()
    chosen = cpu_affinity.plan(settings.batch.cpu_affinity, allowed, settings.batch.workers)
    cpu_affinity.use_plan(chosen)
    log.info("pinned to CPUs", extra={"fields": {
        "bridge": sorted(chosen.bridge or ()), "workers": [sorted(w or ()) for w in chosen.workers],
        "allowed": sorted(allowed)}})


async def run_bridge(settings: Any) -> int:
    """Run a bridge with SIGTERM/SIGINT starting the drain. Returns the exit code."""
    import signal

    from nats_otel.bridge.loop import Bridge, log

    try:
        bridge = Bridge(settings)
    except (OSError, ValueError) as exc:
        log.error("fatal: cannot set up exporters: %s", exc)
        return 2
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, bridge.request_stop)
    try:
        return await bridge.run()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
