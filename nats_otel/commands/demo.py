"""`nats-otel demo`: embedded nats-servers + instrumented app + bridge, traces in the terminal."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HELP = ("run an embedded NATS cluster + leafnode, a traced producer/consumer and the bridge; "
        "print the traces and write them as OTLP/JSON")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--messages", type=int, default=5, metavar="N", help="traced messages to send (default 5)")
    parser.add_argument("--output", type=Path, default=Path("nats-otel-demo.otlp.jsonl"), metavar="FILE",
                        help="OTLP/JSON lines with every span of the run (default nats-otel-demo.otlp.jsonl)")
    parser.add_argument("--otlp-endpoint", metavar="URL",
                        help="also send every span to this OTLP/gRPC endpoint, e.g. http://localhost:4317")
    parser.add_argument("--subject", default="demo.orders", help="subject of the traced messages")
    parser.add_argument("--timeout", type=float, default=20.0,
                        help="seconds to wait for deliveries, and then for complete traces (default 20)")
    parser.add_argument("--color", choices=("auto", "always", "never"), default="auto")
    parser.add_argument("--workdir", type=Path, help=argparse.SUPPRESS)  # tests: where server files go


def run(args: argparse.Namespace) -> int:
    from nats_otel.devkit.demo import DemoError, DemoOptions, run_demo

    if not 1 <= args.messages <= 1000:
        print("nats-otel demo: --messages must be between 1 and 1000", file=sys.stderr)
        return 2
    color = args.color == "always" or (args.color == "auto" and sys.stdout.isatty())
    options = DemoOptions(messages=args.messages, output=args.output, otlp_endpoint=args.otlp_endpoint,
                          subject=args.subject, timeout=args.timeout, color=color, workdir=args.workdir)
    try:
        report = run_demo(options)
    except DemoError as exc:
        print(f"nats-otel demo: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("nats-otel demo: interrupted; every process it started is stopped", file=sys.stderr)
        return 130
    if report.missing or (report.forwarded and "FAILED" in report.forwarded):
        return 1
    return 0
