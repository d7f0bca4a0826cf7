"""Every check of a command line that can be made before Spark starts.

A user's mistake (a missing input, an output that exists, no output at all, a flag without
its partner) must answer in a second with one line, not after the JVM's 10-30 s start with a
Java traceback, and must leave nothing behind. So the checks here touch only this machine's
file system and PATH, and for a JetStream source its server (`stream_check`: one connection,
one request, bounded): no pyspark import, no SparkSession. What only the cluster can tell
(remote URIs) is checked by `outputs` once the session exists, still before any job runs.

What the user typed (flags, inputs, outputs) is checked before what the machine lacks
(Graphviz, Java, pyspark): told first that a tool is missing, a user installs it, runs
again, and only then learns that the input was wrong.
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import os
import shutil
import urllib.parse
from collections.abc import Sequence
from pathlib import Path

from nats_otel.archive import expand_inputs
from nats_otel.core.mapping import check_service_name

__all__ = ["UsageError", "check_convert", "check_report", "is_local", "local_inputs", "output_paths"]


class UsageError(Exception):
    """A mistake in the command line or its paths: one line for the user, exit status 2."""


def is_local(path: str) -> bool:
    """A path of this machine's file system (no scheme, or `file://`)."""
    return "://" not in path or path.startswith("file://")


def _local(path: str) -> Path:
    return Path(path.removeprefix("file://"))


def local_inputs(paths: Sequence[str]) -> list[str]:
    """Local files, folders and globs as `nats-otel convert` sees them; remote URIs left as given.

    Raises `UsageError` naming the first input that matches nothing.
    """
    out: list[str] = []
    for path in paths:
        if not is_local(path):
            out.append(path)
            continue
        local = str(_local(path))
        matches = sorted(glob.glob(local)) if any(ch in local for ch in "*?[") else [local]
        if not matches:
            raise UsageError(f"no input matches {path}")
        try:
            files = expand_inputs(matches)
        except FileNotFoundError:
            raise UsageError(f"input {path} does not exist") from None
        if not files:
            raise UsageError(f"input {path} holds no archive files (*.jsonl, *.ndjson, optionally .gz)")
        unreadable = [f for f in files if not os.access(f, os.R_OK)]
        if unreadable:
            raise UsageError(f"input {unreadable[0]} is not readable")
        out.extend(str(Path(f).resolve()) for f in files)
    return out


def _parquet_inputs(paths: Sequence[str]) -> None:
    for path in paths:
        if not is_local(path):
            continue
        local = _local(path)
        matches = [Path(p) for p in glob.glob(str(local))] if any(ch in str(local) for ch in "*?[") else [local]
        if not any(m.exists() for m in matches):
            raise UsageError(f"input {path} does not exist")
        if not any(m.is_file() or any(m.rglob("*.parquet")) for m in matches):
            raise UsageError(f"input {path} holds no Parquet files")


def output_paths(args: argparse.Namespace) -> dict[str, str]:
    """The folder outputs of a convert command line, by flag."""
    flags = {"--otlp-json-out": args.otlp_json_out, "--parquet-out": args.parquet_out,
             "--rejects-out": args.rejects_out}
    return {flag: path for flag, path in flags.items() if path}


def _inside(inner: Path, outer: Path) -> bool:
    return inner == outer or outer in inner.parents


def _check_output(flag: str, path: str, overwrite: bool) -> None:
    local = _local(path).absolute()
    if local.is_file():
        raise UsageError(f"output {path} ({flag}) is a file; give a folder")
    if local.is_dir() and any(local.iterdir()) and not overwrite:
        raise UsageError(f"output {path} exists; pass --overwrite to replace it")
    ancestor = local.parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise UsageError(f"cannot create output {path}: {ancestor} is a file")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise UsageError(f"cannot create output {path}: {ancestor} is not writable")


def _check_outputs(outputs: dict[str, str], inputs: Sequence[str], overwrite: bool) -> None:
    local = {flag: _local(p).absolute() for flag, p in outputs.items() if is_local(p)}
    for flag, path in outputs.items():
        if is_local(path):
            _check_output(flag, path, overwrite)
    flags = list(local)
    for i, a in enumerate(flags):
        for b in flags[i + 1:]:
            if _inside(local[a], local[b]) or _inside(local[b], local[a]):
                raise UsageError(f"{a} and {b} overlap ({outputs[a]}, {outputs[b]}): give each its own folder")
    for path in inputs:
        if not is_local(path):
            continue
        source = _local(path).absolute()
        for flag, out in local.items():
            if _inside(source, out) or _inside(out, source):
                raise UsageError(f"output {outputs[flag]} ({flag}) overlaps input {path}: "
                                 "the job would read its own output")


def _check_spark_runtime(args: argparse.Namespace, starting_spark: bool) -> None:
    """pyspark importable, and for an embedded Spark a Java to start it with."""
    if not starting_spark:
        return
    if importlib.util.find_spec("pyspark") is None:
        raise UsageError("pyspark is not installed: pip install 'nats-otel[spark]'")
    if args.remote or "PYSPARK_GATEWAY_PORT" in os.environ:
        return  # a Connect server or spark-submit has its JVM already
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        if not os.access(Path(java_home) / "bin" / "java", os.X_OK):
            raise UsageError(f"JAVA_HOME={java_home} has no bin/java; Spark needs Java 17 or newer")
    elif shutil.which("java") is None:
        raise UsageError("Spark needs Java 17 or newer: install it, or set JAVA_HOME")


def _check_machine(args: argparse.Namespace, starting_spark: bool, picture: bool = False) -> None:
    """What this machine lacks: checked last, once what the user typed is known to be right."""
    if picture and shutil.which("dot") is None:
        raise UsageError("the network picture needs Graphviz's `dot` on PATH (apt-get install graphviz); "
                         "or pass --no-picture")
    _check_spark_runtime(args, starting_spark)


def _check_common(args: argparse.Namespace) -> None:
    if args.remote:
        if args.master:
            raise UsageError("--remote and --master exclude each other: a Connect server has its own master")
        parts = urllib.parse.urlsplit(args.remote)
        if parts.scheme != "sc" or not parts.hostname:
            raise UsageError(f"--remote {args.remote}: expected sc://HOST:PORT")


def check_convert(args: argparse.Namespace, starting_spark: bool = True, local_paths: bool = True) -> None:
    """Everything about a `convert` command line that is knowable before Spark starts.

    `local_paths`: the paths are this machine's (not those of a Spark Connect server).
    """
    _check_common(args)
    if bool(args.jetstream_url) != bool(args.stream):
        raise UsageError("--jetstream-url and --stream go together")
    if not args.input and not args.stream:
        raise UsageError("no input: give --input PATH... and/or --jetstream-url URL --stream NAME")
    if args.placeholders and not args.mark_incomplete:
        raise UsageError("--placeholders needs --mark-incomplete")
    try:
        check_service_name(args.service_name)
    except ValueError as exc:
        raise UsageError(f"--service-name: {exc}") from None
    outputs = output_paths(args)
    if not outputs and not args.otlp_endpoint:
        raise UsageError("nothing to write: give --otlp-json-out DIR, --parquet-out DIR, --otlp-endpoint URL "
                         "and/or --rejects-out DIR")
    if args.otlp_endpoint:
        parts = urllib.parse.urlsplit(args.otlp_endpoint)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise UsageError(f"--otlp-endpoint {args.otlp_endpoint}: expected http(s)://HOST:PORT[/v1/traces]")
    if args.jetstream_url and urllib.parse.urlsplit(args.jetstream_url).scheme not in ("nats", "tls"):
        raise UsageError(f"--jetstream-url {args.jetstream_url}: expected nats://HOST:PORT")
    if local_paths:
        # With --remote the paths are the Connect server's: it checks them.
        if args.input_format == "parquet":
            _parquet_inputs(args.input)
        else:
            local_inputs([p for p in args.input if not p.endswith(".parquet")])
        _check_outputs(outputs, args.input, args.overwrite)
        if args.jetstream_creds and "PYSPARK_GATEWAY_PORT" not in os.environ and not Path(
                args.jetstream_creds).is_file():
            raise UsageError(f"--jetstream-creds {args.jetstream_creds} does not exist")
    if args.stream and (not args.jetstream_creds or Path(args.jetstream_creds).is_file()):
        # The one check that asks the network: the driver plans the stream's ranges from
        # this process, so it must reach the stream from here (`stream_check`).
        from spark_backfill.stream_check import stream_problem

        problem = stream_problem(args.jetstream_url, args.stream, args.jetstream_creds)
        if problem is not None:
            raise UsageError(problem)
    _check_machine(args, starting_spark)


def check_report(args: argparse.Namespace, starting_spark: bool = True, local_paths: bool = True) -> None:
    """Everything about a `report` command line that is knowable before Spark starts."""
    _check_common(args)
    if not is_local(args.out):
        raise UsageError(f"--out {args.out}: the report is written by this process: give a local folder")
    if local_paths and is_local(args.spans):
        spans = _local(args.spans)
        if not spans.exists():
            raise UsageError(f"span table {args.spans} does not exist (convert --parquet-out writes it)")
        if not (spans.is_file() or any(spans.rglob("*.parquet"))):
            raise UsageError(f"{args.spans} holds no Parquet files: not a span table "
                             "(convert --parquet-out writes one)")
    # The report is written here, by this process, whatever Spark reads from.
    _check_outputs({"--out": args.out}, [args.spans] if local_paths else [], args.overwrite)
    _check_machine(args, starting_spark, picture=not args.no_picture)
