"""Archive files (JSON Lines, DESIGN §5): reading them, and writing them (raw archive)."""

from __future__ import annotations

import base64
import gzip
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO

import orjson

from nats_otel.core.decode import DecodeError, RawTraceMessage, parse_archive_line
from nats_otel.core.pipeline import Rejected

__all__ = ["archive_record", "expand_inputs", "read_archive"]

# Folders are expanded to JSON Lines files only: a manifest.json beside them is not an
# archive. A file named explicitly is read whatever its name.
_SUFFIXES = (".jsonl", ".ndjson", ".jsonl.gz", ".ndjson.gz")


def expand_inputs(inputs: Iterable[str]) -> list[str]:
    """Files as given, folders expanded to their archive files (sorted); '-' is stdin."""
    paths: list[str] = []
    for item in inputs:
        path = Path(item)
        if item != "-" and path.is_dir():
            paths.extend(str(p) for p in sorted(path.rglob("*")) if p.is_file() and p.name.endswith(_SUFFIXES))
        elif item == "-" or path.is_file():
            paths.append(item)
        else:
            raise FileNotFoundError(f"no such input file or folder: {item}")
    return paths


def _open(path: str) -> IO[bytes] | gzip.GzipFile:
    if path == "-":
        return sys.stdin.buffer
    if path.endswith(".gz"):
        return gzip.open(path, "rb")
    return open(path, "rb")


def read_archive(paths: Iterable[str]) -> Iterator[RawTraceMessage | Rejected]:
    """Every record of the files, in order; a bad line becomes a `Rejected` naming file:line."""
    for path in paths:
        stream = _open(path)
        try:
            for number, line in enumerate(stream, start=1):
                if not line.strip():
                    continue
                try:
                    yield parse_archive_line(line)
                except DecodeError as exc:
                    yield Rejected(exc.reason, f"{path}:{number}: {exc.detail}")
        finally:
            if stream is not sys.stdin.buffer:
                stream.close()


def archive_record(raw: RawTraceMessage) -> bytes:
    """One archive line (with newline) for a received trace message."""
    record = {
        "subject": raw.subject,
        "headers": raw.headers,
        "payload_b64": base64.b64encode(raw.payload).decode("ascii"),
        "received_at": raw.received_at,
    }
    return orjson.dumps(record) + b"\n"
