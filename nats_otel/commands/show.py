"""`nats-otel show`: trace trees in the terminal, from archive files."""

from __future__ import annotations

import argparse
import sys

from nats_otel.commands.convert import Tally, convert_inputs
from nats_otel.core.pipeline import Converted
from nats_otel.core.render import render_traces

HELP = "draw the traces of archived trace messages as trees (servers, hops, latency, errors)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("inputs", nargs="+", metavar="INPUT", help="archive files or folders; '-' for stdin")
    parser.add_argument("--trace-id", help="only this trace (hex)")
    parser.add_argument("--color", choices=("auto", "always", "never"), default="auto")
    parser.add_argument("--service-name", default="nats-server", help=argparse.SUPPRESS)
    parser.add_argument("--allow-header", action="append", default=[], help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> int:
    results = convert_inputs(args)
    spans = [span for r in results if isinstance(r, Converted) for span in r.spans]
    if args.trace_id:
        spans = [s for s in spans if s.trace_id.hex() == args.trace_id.lower()]
    color = args.color == "always" or (args.color == "auto" and sys.stdout.isatty())
    print(render_traces(spans, color=color), flush=True)
    tally = Tally(show_rejects=True)
    for result in results:
        tally.add(result)
    tally.report()
    return 0
