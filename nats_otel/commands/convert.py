"""`nats-otel convert`: archive files -> OTLP/JSON lines, in one process."""

from __future__ import annotations

import argparse
import contextlib
import os
import pickle
import shutil
import sqlite3
import sys
import tempfile
from collections import Counter
from typing import IO

import orjson

from nats_otel.archive import expand_inputs, read_archive
from nats_otel.core.decode import DecodeError, DecodeLimits, RawTraceMessage
from nats_otel.core.encode import MAX_SPANS_PER_REQUEST, to_otlp_json_line
from nats_otel.core.engine import Linker, convert_batch, finish, prepare
from nats_otel.core.linking import LinkSettings
from nats_otel.core.mapping import DEFAULT_HEADER_ALLOWLIST, MappingOptions, check_service_name
from nats_otel.core.pipeline import Converted, Rejected
from nats_otel.core.records import SpanRecord

HELP = "convert archived trace messages (JSON Lines) to OTLP/JSON, one request per trace"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("inputs", nargs="+", metavar="INPUT", help="archive files or folders; '-' for stdin")
    parser.add_argument("-o", "--output", default="-", help="OTLP/JSON lines file; '-' for stdout (default)")
    parser.add_argument("--rejects", help="write rejected records (reason, detail) as JSON Lines here")
    parser.add_argument("--service-name", default="nats-server", type=service_name_arg, metavar="NAME",
                        help=SERVICE_NAME_HELP)
    parser.add_argument(
        "--allow-header",
        action="append",
        default=[],
        metavar="NAME",
        help="also copy this traced-message header into span attributes (repeatable)",
    )
    parser.add_argument("--strict", action="store_true", help="exit 1 if any record was rejected")
    parser.add_argument("--quiet", action="store_true", help="no summary on stderr")


SERVICE_NAME_HELP = ("service.name of the spans: fixed (default nats-server), or a template of the "
                     "reporting server: {server}, {cluster}, {domain}, e.g. 'nats/{cluster}'")


def service_name_arg(value: str) -> str:
    """argparse type: a usage error (exit 2) for a template with unknown fields."""
    try:
        check_service_name(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


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


# Rejected records printed one by one before "... and N more".
REJECTS_SHOWN = 10


class Tally:
    """What the summary says, counted record by record (nothing per record is kept), and
    the first rejects printed as they come when `show_rejects`."""

    def __init__(self, show_rejects: bool = False) -> None:
        self.records = self.converted = self.spans = 0
        self.rejects: Counter[str] = Counter()
        self.issues: Counter[str] = Counter()
        self.traces: set[bytes] = set()  # 16 bytes a trace: what the summary's count costs
        self.show_rejects = show_rejects

    def add(self, result: Converted | Rejected) -> None:
        self.records += 1
        if isinstance(result, Rejected):
            if self.show_rejects and self.rejected < REJECTS_SHOWN:
                print(f"rejected ({result.reason}): {result.detail}", file=sys.stderr)
            self.rejects[result.reason] += 1
            return
        self.converted += 1
        self.spans += len(result.spans)
        self.traces.add(result.spans[0].trace_id)
        self.issues.update(i.split(":", 1)[0] for i in result.issues)

    @property
    def rejected(self) -> int:
        return sum(self.rejects.values())

    def report(self) -> None:
        """The summary on stderr (after "... and N more rejected" if some were not shown)."""
        if self.show_rejects and self.rejected > REJECTS_SHOWN:
            print(f"... and {self.rejected - REJECTS_SHOWN} more rejected (use --rejects FILE)", file=sys.stderr)
        print(self.text(), file=sys.stderr)

    def text(self) -> str:
        text = (f"{self.records} records: {self.converted} trace messages converted to {self.spans} spans "
                f"in {len(self.traces)} traces; {self.rejected} rejected")
        if self.rejects:
            text += " (" + ", ".join(f"{k}: {v}" for k, v in sorted(self.rejects.items())) + ")"
        if self.issues:
            text += "; issues: " + ", ".join(f"{k}: {v}" for k, v in sorted(self.issues.items()))
        return text


def _stdin_to_file(paths: list[str], workdir: str) -> list[str]:
    """Two passes read the input twice: standard input is kept in a file for the second."""
    if "-" not in paths:
        return paths
    copy = os.path.join(workdir, "stdin.jsonl")
    with open(copy, "wb") as out:
        shutil.copyfileobj(sys.stdin.buffer, out)
    return [copy if p == "-" else p for p in paths]


def convert_streaming(paths: list[str], options: MappingOptions, out: IO[bytes], tally: Tally,
                      rejects: IO[bytes] | None, workdir: str) -> None:
    """`convert_batch`'s spans, one OTLP/JSON request per trace sorted by trace id, with
    memory that does not grow with the spans: pass 1 keeps only the hop evidence
    (`Linker`), pass 2 maps each record and spills its spans to an SQLite file, read back
    in trace order. Byte-identical to `split_by_trace` over `convert_batch` (tested)."""
    limits = DecodeLimits()
    linker = Linker(LinkSettings(), bounded=False)
    for raw in read_archive(paths):
        if isinstance(raw, Rejected):
            continue
        try:
            linker.observe(prepare(raw, limits))
        except DecodeError:
            continue
    db = sqlite3.connect(os.path.join(workdir, "spans.sqlite"))
    try:
        db.execute("PRAGMA journal_mode = OFF")
        db.execute("PRAGMA synchronous = OFF")
        db.execute("CREATE TABLE spans (trace BLOB, start INTEGER, end INTEGER, id BLOB, span BLOB)")
        pending: list[tuple[bytes, int, int, bytes, bytes]] = []
        for raw in read_archive(paths):
            result = _convert_one(raw, linker, options, limits)
            tally.add(result)
            if isinstance(result, Rejected):
                if rejects is not None:
                    rejects.write(orjson.dumps({"reason": result.reason, "detail": result.detail,
                                                "subject": result.subject}) + b"\n")
                continue
            pending.extend((s.trace_id, s.start_ns, s.end_ns, s.span_id, pickle.dumps(s, 5)) for s in result.spans)
            if len(pending) >= 2000:
                db.executemany("INSERT INTO spans VALUES (?, ?, ?, ?, ?)", pending)
                pending.clear()
        db.executemany("INSERT INTO spans VALUES (?, ?, ?, ?, ?)", pending)
        db.execute("CREATE INDEX by_trace ON spans (trace, start, end, id)")
        trace: list[SpanRecord] = []
        for trace_id, *_, data in db.execute("SELECT * FROM spans ORDER BY trace, start, end, id"):
            if trace and (trace[0].trace_id != trace_id or len(trace) >= MAX_SPANS_PER_REQUEST):
                out.write(to_otlp_json_line(trace))
                trace = []
            trace.append(pickle.loads(data))
        if trace:
            out.write(to_otlp_json_line(trace))
    finally:
        db.close()


def _convert_one(raw: RawTraceMessage | Rejected, linker: Linker, options: MappingOptions,
                 limits: DecodeLimits) -> Converted | Rejected:
    if isinstance(raw, Rejected):
        return raw
    try:
        return finish(prepare(raw, limits), linker, options)
    except DecodeError as exc:
        return Rejected(exc.reason, exc.detail, raw.subject)


def run(args: argparse.Namespace) -> int:
    try:
        paths = expand_inputs(args.inputs)
    except FileNotFoundError as exc:
        raise SystemExit(f"nats-otel {args.command}: {exc}") from None
    tally = Tally(show_rejects=not args.quiet)
    with tempfile.TemporaryDirectory(prefix="nats-otel-convert-") as workdir, contextlib.ExitStack() as stack:
        paths = _stdin_to_file(paths, workdir)
        out = sys.stdout.buffer if args.output == "-" else stack.enter_context(open(args.output, "wb"))
        rejects = stack.enter_context(open(args.rejects, "wb")) if args.rejects else None
        convert_streaming(paths, options_from(args), out, tally, rejects, workdir)
        out.flush()
    if not args.quiet:
        tally.report()
    return 1 if (args.strict and tally.rejects) else 0
