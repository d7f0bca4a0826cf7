"""`nats-otel convert`: archive files -> OTLP/JSON lines, in one process."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections import Counter

import orjson

from nats_otel.archive import expand_inputs, read_archive
from nats_otel.core.decode import DecodeLimits
from nats_otel.core.encode import split_by_trace, to_otlp_json_line
from nats_otel.core.mapping import DEFAULT_HEADER_ALLOWLIST, MappingOptions
from nats_otel.core.pipeline import Converted, Rejected, convert_batch

HELP = "convert archived trace messages (JSON Lines) to OTLP/JSON, one request per trace"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("inputs", nargs="+", metavar="INPUT", help="archive files or folders; '-' for stdin")
    parser.add_argument("-o", "--output", default="-", help="OTLP/JSON lines file; '-' for stdout (default)")
    parser.add_argument("--rejects", help="write rejected records (reason, detail) as JSON Lines here")
    parser.add_argument("--service-name", default="nats-server", help="service.name of the server spans")
    parser.add_argument(
        "--allow-header",
        action="append",
        default=[],
        metavar="NAME",
        help="also copy this traced-message header into span attributes (repeatable)",
    )
    parser.add_argument("--strict", action="store_true", help="exit 1 if any record was rejected")
    parser.add_argument("--quiet", action="store_true", help="no summary on stderr")


def options_from(args: argparse.Namespace) -> MappingOptions:
    allow = DEFAULT_HEADER_ALLOWLIST | {name.lower() for name in args.allow_header}
    return MappingOptions(service_name=args.service_name, header_allowlist=allow)


def convert_inputs(args: argparse.Namespace) -> list[Converted | Rejected]:
    """Read and convert every input record (shared with `show`)."""
    try:
        paths = expand_inputs(args.inputs)
    except FileNotFoundError as exc:
        raise SystemExit(f"nats-otel {args.command}: {exc}") from None
    return convert_batch(read_archive(paths), options_from(args), DecodeLimits())


def summary(results: list[Converted | Rejected]) -> tuple[str, Counter]:
    rejects = Counter(r.reason for r in results if isinstance(r, Rejected))
    issues = Counter(i.split(":", 1)[0] for r in results if isinstance(r, Converted) for i in r.issues)
    converted = [r for r in results if isinstance(r, Converted)]
    spans = sum(len(r.spans) for r in converted)
    traces = len({r.spans[0].trace_id for r in converted})
    text = (
        f"{len(results)} records: {len(converted)} trace messages converted to {spans} spans "
        f"in {traces} traces; {sum(rejects.values())} rejected"
    )
    if rejects:
        text += " (" + ", ".join(f"{k}: {v}" for k, v in sorted(rejects.items())) + ")"
    if issues:
        text += "; issues: " + ", ".join(f"{k}: {v}" for k, v in sorted(issues.items()))
    return text, rejects


def write_rejects(path: str, results: list[Converted | Rejected]) -> None:
    with open(path, "wb") as out:
        for r in results:
            if isinstance(r, Rejected):
                out.write(orjson.dumps({"reason": r.reason, "detail": r.detail, "subject": r.subject}) + b"\n")


def report_rejects(results: list[Converted | Rejected], limit: int = 10) -> None:
    shown = 0
    for r in results:
        if isinstance(r, Rejected):
            if shown < limit:
                print(f"rejected ({r.reason}): {r.detail}", file=sys.stderr)
            shown += 1
    if shown > limit:
        print(f"... and {shown - limit} more rejected (use --rejects FILE)", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    from nats_otel.gc_tuning import tune_gc_for_throughput

    # The whole input is held while it converts: without this the collector keeps
    # re-walking it (measured: ~10 % of convert's time, docs/performance.md).
    tune_gc_for_throughput()
    results = convert_inputs(args)
    spans = [span for r in results if isinstance(r, Converted) for span in r.spans]
    with contextlib.nullcontext(sys.stdout.buffer) if args.output == "-" else open(args.output, "wb") as out:
        for trace in split_by_trace(spans):
            out.write(to_otlp_json_line(trace))
        out.flush()
    if args.rejects:
        write_rejects(args.rejects, results)
    text, rejects = summary(results)
    if not args.quiet:
        report_rejects(results)
        print(text, file=sys.stderr)
    return 1 if (args.strict and rejects) else 0
