"""`nats-otel emulate`: traced load on a real NATS network, to load-test a bridge deployment."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # devkit is imported in run(): loading this module for its help line stays cheap
    from nats_otel.devkit.emulate import EmulationReport

HELP = ("publish traced messages over N client connections at a set rate, on an embedded topology of "
        "K nats-servers or an existing network, and report what was published")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    net = parser.add_argument_group("network (embedded unless --server is given)")
    net.add_argument("--servers", type=int, default=3, metavar="K",
                     help="embedded servers: 1 standalone, 2 hub+leaf, 3+ routes, a gateway and a leafnode (default 3)")
    net.add_argument("--server", action="append", metavar="URL",
                     help="drive an existing network instead: a server URL (repeatable; connections round-robin)")
    net.add_argument("--user", help="user for --server (its account needs msg_trace, or use --trace-dest)")
    net.add_argument("--password", help="password for --user")
    load = parser.add_argument_group("load")
    load.add_argument("--connections", type=int, default=10, metavar="N", help="client connections (default 10)")
    load.add_argument("--rate", type=float, default=100.0, help="traced messages per second in total (default 100)")
    load.add_argument("--duration", type=float, default=10.0, metavar="SECONDS",
                      help="how long to publish (default 10)")
    load.add_argument("--subject-prefix", default="emulate", help="subjects <prefix>.<connection> (default emulate)")
    load.add_argument("--trace-dest", metavar="SUBJ", help="add Nats-Trace-Dest: SUBJ (ad-hoc tracing)")
    load.add_argument("--payload-size", type=int, default=64, metavar="BYTES")
    out = parser.add_argument_group("output")
    out.add_argument("--published-out", type=Path, metavar="FILE", help="write every traceparent used, one a line")
    out.add_argument("--start-delay", type=float, default=0.0, metavar="SECONDS",
                     help="embedded: wait after printing the server URLs, so a bridge can attach")
    out.add_argument("--hold", type=float, default=0.0, metavar="SECONDS",
                     help="embedded: keep the servers up this long after publishing (bridge catching up)")
    out.add_argument("--workdir", type=Path, help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> int:
    from nats_otel.devkit.emulate import EmulationOptions, default_user, emulate, emulation_topology
    from nats_otel.devkit.processes import TopologyError, start_topology

    if args.connections < 1 or args.rate <= 0 or args.duration <= 0:
        print("nats-otel emulate: --connections, --rate and --duration must be positive", file=sys.stderr)
        return 2
    if (args.user is None) != (args.password is None):
        print("nats-otel emulate: --user and --password go together", file=sys.stderr)
        return 2
    options = EmulationOptions(urls=[], connections=args.connections, rate=args.rate, duration=args.duration,
                               subject_prefix=args.subject_prefix, trace_dest=args.trace_dest,
                               payload_size=args.payload_size, published_out=args.published_out)
    if args.server:
        options.urls = list(args.server)
        return _report(asyncio.run(emulate(options, args.user, args.password, keep_traceparents=False)))
    try:
        topo = start_topology(emulation_topology(args.servers), args.workdir)
    except (TopologyError, ValueError) as exc:
        print(f"nats-otel emulate: cannot start the topology: {exc}", file=sys.stderr)
        return 1
    try:
        user, password = default_user()
        names = list(topo.servers)
        options.urls = [topo.client_url(n, user, password) for n in names]
        options.server_names = names
        print(json.dumps({"servers": {n: topo.client_url(n, user, password) for n in names},
                          "trace_subject": "trace.a"}), flush=True)
        if args.start_delay:
            time.sleep(args.start_delay)
        code = _report(asyncio.run(emulate(options, keep_traceparents=False)))
        if args.hold:
            time.sleep(args.hold)
        return code
    finally:
        topo.stop()


def _report(report: EmulationReport) -> int:
    print(json.dumps(report.as_dict()), flush=True)
    return 0
