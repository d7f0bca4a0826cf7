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
from typing import Any, NoReturn

# Absolute imports: spark-submit runs this file as a script, outside the package.
from nats_otel.core.mapping import DEFAULT_HEADER_ALLOWLIST, MappingOptions
from spark_backfill import checks
from spark_backfill.checks import UsageError
from spark_backfill.outputs import DEFAULT_TARGET_FILE_BYTES

log = logging.getLogger("spark_backfill")


class _Parser(argparse.ArgumentParser):
    """argparse, but a mistake is one line (the usage of `convert` alone is 20 lines)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (--help lists the flags)\n")


def _count(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text}")
    return value


def _rate(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text}")
    return value


_UNITS = {"": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mb": 1 << 20, "mib": 1 << 20,
          "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30}


def _size(text: str) -> int:
    """Bytes, with an optional K/M/G suffix (binary: 64M is 64 MiB)."""
    number = text.rstrip("kKmMgGiIbB")
    unit = text[len(number):].lower()
    if unit not in _UNITS or not number.isdigit() or int(number) < 1:
        raise argparse.ArgumentTypeError(f"expected a size such as 64M or 1G, got {text}")
    return int(number) * _UNITS[unit]


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m spark_backfill", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    c = sub.add_parser("convert", help="trace messages (archives, Parquet, JetStream) -> spans")
    c.add_argument("--input", nargs="+", default=[], metavar="PATH",
                   help="archive JSON Lines files/folders/globs/URIs, or Parquet of archive records")
    c.add_argument("--input-format", choices=("auto", "jsonl", "parquet"), default="auto")
    c.add_argument("--jetstream-url", help="NATS URL (may hold user:password@) of the stream's server")
    c.add_argument("--stream", help="JetStream stream that recorded the trace subjects")
    c.add_argument("--jetstream-creds", help="NATS credentials file (must exist on the executors)")
    c.add_argument("--jetstream-ranges", type=_count, help="sequence ranges (tasks); default: by size")
    c.add_argument("--otlp-json-out", metavar="DIR", help="OTLP/JSON lines (part-NNNNN.jsonl), one request per trace")
    c.add_argument("--target-file-bytes", type=_size, default=DEFAULT_TARGET_FILE_BYTES,
                   metavar="SIZE", help="OTLP/JSON bytes per file before compression (default 64M)")
    c.add_argument("--otlp-json-files", "--otlp-json-partitions", type=_count, metavar="N",
                   help="exactly N OTLP/JSON files instead (default: by --target-file-bytes)")
    c.add_argument("--compress", choices=("none", "gzip"), default="none",
                   help="compress the JSON Lines outputs (.jsonl.gz)")
    c.add_argument("--parquet-out", metavar="DIR", help="Parquet span table, one row per span")
    c.add_argument("--otlp-endpoint", metavar="URL", help="OTLP/HTTP endpoint (…:4318 or …/v1/traces)")
    c.add_argument("--otlp-header", action="append", default=[], metavar="K=V", help="OTLP request header")
    c.add_argument("--otlp-batch", type=_count, default=512, help="spans per OTLP request")
    c.add_argument("--otlp-rate", type=_rate, default=0.0, help="max spans/s exported in total (0: no limit)")
    c.add_argument("--rejects-out", metavar="DIR", help="rejected records (reason, detail, record) as JSON Lines")
    c.add_argument("--mark-incomplete", action="store_true",
                   help="flag traces with a forwarded hop whose downstream trace message is missing")
    c.add_argument("--placeholders", action="store_true", help="with --mark-incomplete: add a placeholder span")
    c.add_argument("--service-name", default="nats-server", metavar="NAME",
                   help="service.name of the spans: fixed, or a template of the reporting server "
                        "({server}, {cluster}, {domain}), as in nats-otel convert")
    c.add_argument("--allow-header", action="append", default=[], metavar="NAME")
    c.add_argument("--overwrite", action="store_true", help="replace existing output folders (once the job succeeded)")
    _spark_args(c)

    r = sub.add_parser("report", help="hop latency per edge, errors, and the network picture")
    r.add_argument("--spans", required=True, metavar="DIR", help="the Parquet span table (convert --parquet-out)")
    r.add_argument("--out", required=True, metavar="DIR")
    r.add_argument("--no-picture", action="store_true", help="tables only (the picture needs Graphviz's dot)")
    r.add_argument("--overwrite", action="store_true", help="replace an existing report folder")
    _spark_args(r)
    return parser


def _spark_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--master", help="Spark master (default local[*]; under spark-submit: spark-submit's)")
    p.add_argument("--remote", metavar="sc://HOST:PORT", help="run on a Spark Connect server instead")
    p.add_argument("--shuffle-partitions", type=_count, help="spark.sql.shuffle.partitions")
    p.add_argument("--conf", action="append", default=[], metavar="K=V", help="extra Spark setting")
    p.add_argument("--verbose", action="store_true", help="debug logging, and the full trace of a failed job")


def _pairs(items: list[str], what: str) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"{what} {item!r} is not KEY=VALUE")
        out[key.strip()] = value.strip()
    return out


def _check(args: argparse.Namespace, starting_spark: bool, local_paths: bool) -> None:
    """Every check of the command line that needs no Spark (`checks`); raises UsageError."""
    _pairs(args.conf, "--conf")
    if args.command == "convert":
        _pairs(args.otlp_header, "--otlp-header")
        checks.check_convert(args, starting_spark=starting_spark, local_paths=local_paths)
    else:
        checks.check_report(args, starting_spark=starting_spark, local_paths=local_paths)


def _convert(spark: Any, args: argparse.Namespace) -> int:
    from spark_backfill import sources, transform
    from spark_backfill.keys import KeyTally
    from spark_backfill.outputs import open_outputs
    from spark_backfill.session import is_remote

    started = time.monotonic()
    # Every output is checked (and staged) before any job runs.
    outputs = open_outputs(spark, args.overwrite)
    targets = {flag: outputs.stage(path, jsonl=flag != "--parquet-out")
               for flag, path in checks.output_paths(args).items()}
    frames = []
    if args.input:
        frames.extend(sources.read_inputs(spark, args.input, args.input_format))
    if args.stream:
        frames.append(sources.read_jetstream(spark, args.jetstream_url, args.stream, args.jetstream_creds,
                                             args.jetstream_ranges))
    options = MappingOptions(
        service_name=args.service_name,
        header_allowlist=DEFAULT_HEADER_ALLOWLIST | {h.lower() for h in args.allow_header},
    )
    settings = transform.ConvertSettings(options=options)
    # OTLP/JSON files (and rejects) alone: lines straight from the records (`traces`),
    # counted by accumulators, which a Spark Connect client has not.
    lines = args.otlp_json_out and not (args.parquet_out or args.mark_incomplete or args.otlp_endpoint
                                        or is_remote(spark))
    key_tally = None if is_remote(spark) else spark.sparkContext.accumulator(KeyTally.zero({}), KeyTally())
    keyed = transform.keyed(frames, settings, tally=key_tally)
    persisted = [keyed.records]
    try:
        if lines and key_tally is not None:  # (a classic session: `lines` says so)
            status = _write_lines(spark, args, keyed, key_tally.value, settings, started, targets, outputs.mode)
        else:
            rows = transform.span_rows_of(keyed, settings)
            persisted.append(rows)
            status = _load(spark, args, rows, keyed.rejects(), started, targets, outputs.mode)
        outputs.commit()
        return status
    except BaseException:
        outputs.abort()
        raise
    finally:
        for frame in persisted:
            frame.unpersist()


# OTLP/JSON bytes per payload byte, to pick a file count before converting: 3.8 on the
# corpus replicated (bench/backfill_throughput.py: 563 MB of OTLP/JSON from 149 MB of
# payloads); compressed payloads give more (fewer, larger files than the target).
_OTLP_JSON_PER_PAYLOAD_BYTE = 3.8


def _whole_waves(files: int, cores: int) -> int:
    """`files` rounded up to a multiple of the cores when there are more files than cores:
    a file is a task that converts, and 9 on 2 cores left one core idle for a ninth of the
    conversion (0.5 s of 15 at 200k trace messages)."""
    return files if files <= cores else -(-files // cores) * cores


def _write_lines(spark: Any, args: argparse.Namespace, keyed: Any, key_counts: dict[str, Any], settings: Any,
                 started: float, targets: dict[str, str], mode: str) -> int:
    from spark_backfill import sinks, traces
    from spark_backfill.outputs import otlp_json_files
    from spark_backfill.session import default_parallelism

    rejects, payload = key_counts["rejects"], key_counts["payload"]
    if "--rejects-out" in targets:
        sinks.write_rejects(keyed.rejects(), targets["--rejects-out"], mode, args.compress)
        log.info("wrote %d rejects to %s", sum(rejects.values()), args.rejects_out)
    estimated = int(payload * _OTLP_JSON_PER_PAYLOAD_BYTE)
    files = args.otlp_json_files or _whole_waves(otlp_json_files(estimated, args.target_file_bytes),
                                                 default_parallelism(spark))
    tally = spark.sparkContext.accumulator(traces.Tally.zero({}), traces.Tally())
    traces.write_otlp_json(keyed.records, settings, keyed.run_index, files, spark, targets["--otlp-json-out"], mode,
                           args.compress, tally)
    counts = tally.value
    log.info(
        "converted %d trace messages to %d spans; %d rejected %s; issues %s (%.1fs)",
        counts["messages"], counts["spans"], sum(rejects.values()), dict(sorted(rejects.items())),
        dict(sorted(counts["issues"].items())), time.monotonic() - started,
    )
    log.info("wrote OTLP/JSON in %d files to %s (%.1fs)", files, args.otlp_json_out, time.monotonic() - started)
    log.info("done in %.1fs", time.monotonic() - started)
    return 0


def _count_rows(rows: Any, rejects: Any) -> tuple[int, int, dict[str, int], dict[str, int], int]:
    """(messages, spans, rejects by reason, issues by kind, estimated OTLP/JSON bytes): two jobs."""
    from pyspark.sql import functions as F

    server = F.col("role") == "server"
    # Each span once, and its resource about once per trace message (a server span's).
    encoded = F.length("otlp_span") + 1 + F.when(server, F.length("otlp_resource") + 100).otherwise(0)
    messages = spans_total = estimated = 0
    issues: dict[str, int] = {}
    for r in rows.groupBy(server.alias("server"), "issues").agg(F.count("*").alias("n"),
                                                                 F.sum(encoded).alias("bytes")).collect():
        spans_total += r["n"]
        estimated += r["bytes"] or 0
        messages += r["n"] if r["server"] else 0
        for issue in r["issues"] or []:
            name = issue.split(":")[0]
            issues[name] = issues.get(name, 0) + r["n"]
    rejected = {r["reason"]: r["n"] for r in rejects.groupBy("reason").agg(F.count("*").alias("n")).collect()}
    return messages, spans_total, rejected, issues, estimated


def _load(spark: Any, args: argparse.Namespace, rows: Any, rejects_df: Any, started: float,
          targets: dict[str, str], mode: str) -> int:
    from pyspark import StorageLevel

    from spark_backfill import completeness, sinks
    from spark_backfill.outputs import otlp_json_files
    from spark_backfill.session import default_parallelism

    messages, spans_total, rejects, issues, estimated = _count_rows(rows, rejects_df)
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
    if "--rejects-out" in targets:
        sinks.write_rejects(rejects_df, targets["--rejects-out"], mode, args.compress)
        log.info("wrote %d rejects to %s", sum(rejects.values()), args.rejects_out)
    # File counts by size, not by trace count. Parquet is some 5-10x smaller than OTLP/JSON:
    # as many Parquet files keeps them a few MB each, not one per input split.
    files = args.otlp_json_files or otlp_json_files(estimated, args.target_file_bytes)
    if "--otlp-json-out" in targets:
        sinks.write_otlp_json(spans, targets["--otlp-json-out"], files, mode, args.compress)
        log.info("wrote OTLP/JSON (~%.1f MB before compression) in %d files to %s (%.1fs)", estimated / 1e6, files,
                 args.otlp_json_out, time.monotonic() - started)
    if "--parquet-out" in targets:
        sinks.write_parquet(spans, targets["--parquet-out"], mode, files)
        log.info("wrote Parquet span table to %s (%.1fs)", args.parquet_out, time.monotonic() - started)
    status = 0
    if args.otlp_endpoint:
        settings = sinks.OtlpExportSettings(
            args.otlp_endpoint, tuple(_pairs(args.otlp_header, "--otlp-header").items()),
            batch_spans=args.otlp_batch, spans_per_second=args.otlp_rate,
        )
        sent, failed, error = sinks.export_otlp(spans, settings, default_parallelism(spark))
        log.info("exported %d spans to %s; %d failed%s", sent, settings.url, failed,
                 f" (last error: {error})" if failed else "")
        status = 1 if failed else 0
    log.info("done in %.1fs", time.monotonic() - started)
    return status


def _report(spark: Any, args: argparse.Namespace) -> int:
    from spark_backfill.outputs import local_folder
    from spark_backfill.report import run_report

    with local_folder(args.out, args.overwrite) as out:
        edges, errors = run_report(spark, args.spans, str(out), picture=not args.no_picture)
    log.info("report: %d edges, %d error groups -> %s", len(edges), len(errors), args.out)
    return 0


def _dispatch(spark: Any, args: argparse.Namespace) -> int:
    return _convert(spark, args) if args.command == "convert" else _report(spark, args)


def _say(args: argparse.Namespace, message: str) -> None:
    print(f"python -m spark_backfill {args.command}: error: {message}", file=sys.stderr, flush=True)


def _root_cause(exc: BaseException) -> str:
    """One line that says why a job failed: the deepest Java cause, or the Python error."""
    java = getattr(exc, "java_exception", None) or getattr(exc, "_origin", None)
    text = str(exc)
    if java is not None:
        try:
            while java.getCause() is not None:
                java = java.getCause()
            text = java.toString()
        except Exception:  # noqa: BLE001 - the gateway may be gone: keep the Python text
            pass
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    # A Python worker's traceback ends with the error; anything else starts with it.
    line = lines[-1] if any(ln.startswith("Traceback") for ln in lines) else lines[0]
    return line[:400]


def _user_mistake(exc: BaseException) -> str | None:
    """The one-line answer to a mistake only the cluster could see (paths under --remote)."""
    text = str(exc)
    if "PATH_ALREADY_EXISTS" in text:
        return f"{_root_cause(exc)}; pass --overwrite to replace it"
    if "PATH_NOT_FOUND" in text:
        return _root_cause(exc)
    return None


def _guarded(args: argparse.Namespace, job: Any) -> int:
    """Run `job()`: a user's mistake is one line and status 2, a failed job one line and 1."""
    try:
        return int(job())
    except UsageError as exc:
        _say(args, str(exc))
        return 2
    except KeyboardInterrupt:
        _say(args, "interrupted (outputs of this run removed)")
        return 130
    except Exception as exc:  # the error policy's boundary: say why, in one line
        mistake = _user_mistake(exc)
        if mistake is not None:
            _say(args, mistake)
            return 2
        log.debug("the job failed", exc_info=True)
        _say(args, f"the job failed: {_root_cause(exc)}" + ("" if args.verbose else " (--verbose for the full trace)"))
        return 1


def run(spark: Any, argv: list[str]) -> int:
    """Run one command on an existing session (what `main` does after building one)."""
    from spark_backfill.session import is_remote

    args = _parser().parse_args(argv)
    remote = is_remote(spark)

    def job() -> int:
        _check(args, starting_spark=False, local_paths=not remote)
        return _dispatch(spark, args)

    return _guarded(args, job)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        _check(args, starting_spark=True, local_paths=not args.remote)
    except UsageError as exc:
        _say(args, str(exc))
        return 2

    def job() -> int:
        from spark_backfill import jvm_archive
        from spark_backfill.session import build_session, under_spark_submit

        # An embedded JVM starts from a class archive, made after the first run (`jvm_archive`).
        archive = None if args.remote or under_spark_submit() else jvm_archive.archive_for()
        if archive is not None and archive.path.exists():
            log.info("the JVM starts from its class archive %s", archive.path)
        elif archive is not None and archive.failed.exists():
            log.info("no JVM class archive: making it failed (java's message in %s; delete it to try again)",
                     archive.failed)
        spark = build_session(args.master, shuffle_partitions=args.shuffle_partitions,
                              extra_conf=_pairs(args.conf, "--conf"), remote=args.remote, archive=archive)
        status = 1
        try:
            status = _dispatch(spark, args)
            return status
        finally:
            try:
                jvm_archive.after_run(archive, spark, succeeded=status == 0)
            finally:
                spark.stop()

    return _guarded(args, job)


if __name__ == "__main__":
    sys.exit(main())
