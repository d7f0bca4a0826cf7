"""`python -m spark_backfill convert|report` (also `spark-submit .../spark_backfill/__main__.py`).

Error policy, in one place: bad configuration stops with a message (exit 2); bad records
are dropped to the rejects output and counted; OTLP export failures are retried in the
executors and, if they persist, counted and reported with exit code 1.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

# Absolute imports: spark-submit runs this file as a script, outside the package.
from nats_otel.core.mapping import DEFAULT_HEADER_ALLOWLIST, MappingOptions

log = logging.getLogger("spark_backfill")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m spark_backfill", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    c = sub.add_parser("convert", help="trace messages (archives, Parquet, JetStream) -> spans")
    c.add_argument("--input", nargs="+", default=[], metavar="PATH",
                   help="archive JSON Lines files/folders/globs/URIs, or Parquet of archive records")
    c.add_argument("--input-format", choices=("auto", "jsonl", "parquet"), default="auto")
    c.add_argument("--jetstream-url", help="NATS URL (may hold user:password@) of the stream's server")
    c.add_argument("--stream", help="JetStream stream that recorded the trace subjects")
    c.add_argument("--jetstream-creds", help="NATS credentials file (must exist on the executors)")
    c.add_argument("--jetstream-ranges", type=int, help="sequence ranges (tasks); default: by size")
    c.add_argument("--otlp-json-out", metavar="DIR", help="OTLP/JSON lines, one request per trace")
    c.add_argument("--otlp-json-partitions", type=int, help="files of OTLP/JSON (default: shuffle partitions)")
    c.add_argument("--parquet-out", metavar="DIR", help="Parquet span table, one row per span")
    c.add_argument("--otlp-endpoint", metavar="URL", help="OTLP/HTTP endpoint (…:4318 or …/v1/traces)")
    c.add_argument("--otlp-header", action="append", default=[], metavar="K=V", help="OTLP request header")
    c.add_argument("--otlp-batch", type=int, default=512, help="spans per OTLP request")
    c.add_argument("--otlp-rate", type=float, default=0.0, help="max spans/s exported in total (0: no limit)")
    c.add_argument("--rejects-out", metavar="DIR", help="rejected records (reason, detail, record) as JSON Lines")
    c.add_argument("--mark-incomplete", action="store_true",
                   help="flag traces with a forwarded hop whose downstream trace message is missing")
    c.add_argument("--placeholders", action="store_true", help="with --mark-incomplete: add a placeholder span")
    c.add_argument("--service-name", default="nats-server")
    c.add_argument("--allow-header", action="append", default=[], metavar="NAME")
    c.add_argument("--overwrite", action="store_true", help="replace existing output folders")
    _spark_args(c)

    r = sub.add_parser("report", help="hop latency per edge, errors, and the network picture")
    r.add_argument("--spans", required=True, metavar="DIR", help="the Parquet span table (convert --parquet-out)")
    r.add_argument("--out", required=True, metavar="DIR")
    _spark_args(r)
    return parser


def _spark_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--master", help="Spark master (default local[*]; under spark-submit: spark-submit's)")
    p.add_argument("--shuffle-partitions", type=int, help="spark.sql.shuffle.partitions")
    p.add_argument("--conf", action="append", default=[], metavar="K=V", help="extra Spark setting")


def _pairs(items: list[str], what: str) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"spark_backfill: {what} {item!r} is not KEY=VALUE")
        out[key.strip()] = value.strip()
    return out


def _validate(args: argparse.Namespace) -> None:
    if args.command != "convert":
        return
    if bool(args.jetstream_url) != bool(args.stream):
        raise SystemExit("spark_backfill convert: --jetstream-url and --stream go together")
    if not args.input and not args.stream:
        raise SystemExit("spark_backfill convert: give --input PATH... and/or --jetstream-url URL --stream NAME")
    if args.placeholders and not args.mark_incomplete:
        raise SystemExit("spark_backfill convert: --placeholders needs --mark-incomplete")


def _convert(spark, args: argparse.Namespace) -> int:
    from pyspark import StorageLevel

    from spark_backfill import sources, transform

    started = time.monotonic()
    frames = []
    if args.input:
        try:
            frames.append(sources.read_inputs(spark, args.input, args.input_format))
        except FileNotFoundError as exc:
            raise SystemExit(f"spark_backfill convert: {exc}") from None
    if args.stream:
        js = sources.JetStreamSource(args.jetstream_url, args.stream, args.jetstream_creds)
        # Read the stream once: both passes of the transform use it.
        frames.append(sources.read_jetstream(spark, js, args.jetstream_ranges).persist(StorageLevel.MEMORY_AND_DISK))
    lines = frames[0]
    for other in frames[1:]:
        lines = lines.unionByName(other)

    options = MappingOptions(
        service_name=args.service_name,
        header_allowlist=DEFAULT_HEADER_ALLOWLIST | {h.lower() for h in args.allow_header},
    )
    rows, persisted = transform.convert(lines, transform.ConvertSettings(options=options))
    try:
        return _load(spark, args, rows, started)
    finally:
        persisted.unpersist()


def _load(spark, args: argparse.Namespace, rows, started: float) -> int:
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    from spark_backfill import completeness, sinks

    # One job for every count: row kind, server span or not, reject reason, issues (few distinct).
    messages = spans_total = 0
    rejects: dict[str, int] = {}
    issues: dict[str, int] = {}
    for r in rows.groupBy("row_type", (F.col("role") == "server").alias("server"), "reject_reason", "issues").agg(
        F.count("*").alias("n")
    ).collect():
        if r["row_type"] == "reject":
            rejects[r["reject_reason"]] = rejects.get(r["reject_reason"], 0) + r["n"]
            continue
        spans_total += r["n"]
        messages += r["n"] if r["server"] else 0
        for issue in r["issues"] or []:
            name = issue.split(":")[0]
            issues[name] = issues.get(name, 0) + r["n"]
    log.info(
        "converted %d trace messages to %d spans; %d rejected %s; issues %s (%.1fs)",
        messages, spans_total, sum(rejects.values()), dict(sorted(rejects.items())),
        dict(sorted(issues.items())), time.monotonic() - started,
    )

    spans = sinks.span_table(rows)
    if args.mark_incomplete:
        spans, missing = completeness.mark_incomplete(spans, args.placeholders)
        spans = spans.persist(StorageLevel.MEMORY_AND_DISK)
        log.info("incomplete traces: %d missing downstream hops in %d traces%s", missing.count(),
                 missing.select("trace_id").distinct().count(), " (placeholders added)" if args.placeholders else "")
    mode = "overwrite" if args.overwrite else "errorifexists"
    parts = args.otlp_json_partitions or int(spark.conf.get("spark.sql.shuffle.partitions"))
    if args.rejects_out:
        sinks.write_rejects(rows, args.rejects_out, mode)
        log.info("wrote %d rejects to %s", sum(rejects.values()), args.rejects_out)
    if args.otlp_json_out:
        sinks.write_otlp_json(spans, args.otlp_json_out, parts, mode)
        log.info("wrote OTLP/JSON to %s (%.1fs)", args.otlp_json_out, time.monotonic() - started)
    if args.parquet_out:
        sinks.write_parquet(spans, args.parquet_out, mode)
        log.info("wrote Parquet span table to %s (%.1fs)", args.parquet_out, time.monotonic() - started)
    status = 0
    if args.otlp_endpoint:
        settings = sinks.OtlpExportSettings(
            args.otlp_endpoint, tuple(_pairs(args.otlp_header, "--otlp-header").items()),
            batch_spans=args.otlp_batch, spans_per_second=args.otlp_rate,
        )
        sent, failed, error = sinks.export_otlp(spans, settings, spark.sparkContext.defaultParallelism)
        log.info("exported %d spans to %s; %d failed%s", sent, settings.url, failed,
                 f" (last error: {error})" if failed else "")
        status = 1 if failed else 0
    log.info("done in %.1fs", time.monotonic() - started)
    return status


def run(spark, argv: list[str]) -> int:
    """Run one command on an existing session (what `main` does after building one)."""
    args = _parser().parse_args(argv)
    _validate(args)
    return _dispatch(spark, args)


def _dispatch(spark, args: argparse.Namespace) -> int:
    if args.command == "convert":
        return _convert(spark, args)
    from spark_backfill.report import run_report

    edges, errors = run_report(spark, args.spans, args.out)
    log.info("report: %d edges, %d error groups -> %s", len(edges), len(errors), args.out)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    _validate(args)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    from spark_backfill.session import build_session

    spark = build_session(args.master, shuffle_partitions=args.shuffle_partitions,
                          extra_conf=_pairs(args.conf, "--conf"))
    try:
        return _dispatch(spark, args)
    finally:
        spark.stop()


if __name__ == "__main__":
    sys.exit(main())
