"""Local archive files read by the Python workers themselves, in line-aligned byte ranges.

Spark's text source reads an archive in the JVM, checks it as UTF-8 text, and hands every
line to the Python worker through Arrow, where it becomes a Python string before being
parsed: the JVM carried each record only to give it away (issue 38: the key pass's stage
was 4.1 JVM CPU-s of the run's 18.7 at 200k trace messages). Local inputs (the embedded
Spark, or a cluster whose executors share the file system, which Spark's own reading of
a local path needs too) are read by the key pass instead: the driver plans byte ranges,
each task opens its files and reads their lines as bytes, exactly as `nats-otel convert`
reads them (`nats_otel.archive.read_archive`: split on `\\n`, blank lines dropped). Remote
URIs (`s3a://`, `hdfs://`) and Spark Connect still go through Spark's text source.

The plan follows Spark's own for files (`FilePartition`): a split is at most
`max_split_bytes`, but no smaller than the input spread over the cores; a compressed file
is one split; small files are packed into one task, each costing `open_cost` bytes.
A split owns the lines that start inside it, so every line is read once, whatever the
split boundaries (a line runs past its split's end into the next).
"""

from __future__ import annotations

import gzip
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["OPEN_COST_BYTES", "Split", "plan", "read_lines"]

# What opening a file costs, in bytes read: Spark's `spark.sql.files.openCostInBytes` default.
OPEN_COST_BYTES = 4 << 20


@dataclass(frozen=True, slots=True)
class Split:
    """The lines of `path` that start in [`start`, `end`); `end` -1: to the end (a whole file)."""

    path: str
    start: int
    end: int

    @property
    def source(self) -> str:
        """The file as Spark's `input_file_name()` names it (`file:///...`)."""
        return Path(self.path).as_uri()


def plan(files: Sequence[str], max_split_bytes: int, cores: int, open_cost: int = OPEN_COST_BYTES) -> list[list[Split]]:
    """The tasks (each a list of splits) that read `files` (local, absolute paths).

    As Spark plans a file scan: splits of at most `max_split_bytes`, or of the input
    spread over `cores` when that is smaller (never below `open_cost`), a `.gz` whole;
    then splits taken largest first into tasks of at most that size."""
    sizes = {path: os.path.getsize(path) for path in files}
    total = sum(size + open_cost for size in sizes.values())
    split_bytes = max(1, min(max_split_bytes, max(open_cost, total // max(1, cores))))
    splits: list[tuple[int, Split]] = []
    for path in files:
        size = sizes[path]
        if path.endswith(".gz") or size <= split_bytes:
            splits.append((size, Split(path, 0, -1)))
            continue
        for start in range(0, size, split_bytes):
            end = min(size, start + split_bytes)
            splits.append((end - start, Split(path, start, end)))
    splits.sort(key=lambda item: item[0], reverse=True)
    tasks: list[list[Split]] = []
    current: list[Split] = []
    current_bytes = 0
    for size, split in splits:
        if current and current_bytes + size > split_bytes:
            tasks.append(current)
            current, current_bytes = [], 0
        current.append(split)
        current_bytes += size + open_cost
    if current:
        tasks.append(current)
    return tasks


def read_lines(split: Split, rows: int) -> Iterator[list[bytes]]:
    """The non-blank lines of `split`, `rows` at a time (each with its `\\n`, as read)."""
    if split.path.endswith(".gz"):
        with gzip.open(split.path, "rb") as stream:
            yield from _chunks(iter(stream), rows)
        return
    with open(split.path, "rb") as stream:
        if split.start > 0:
            # The line that starts before the split belongs to the one before: skip it. A
            # line starts at `start` only if the byte before it ends a line.
            stream.seek(split.start - 1)
            stream.readline()
        yield from _chunks(_until(stream, split.end), rows)


def _until(stream, end: int) -> Iterator[bytes]:  # stream: a binary file
    """The lines of `stream` from where it is, while they start before `end` (-1: all)."""
    position = stream.tell()
    while end < 0 or position < end:
        line = stream.readline()
        if not line:
            return
        position += len(line)
        yield line


def _chunks(lines: Iterator[bytes], rows: int) -> Iterator[list[bytes]]:
    chunk: list[bytes] = []
    for line in lines:
        if not line.strip():
            continue
        chunk.append(line)
        if len(chunk) >= rows:
            yield chunk
            chunk = []
    if chunk:
        yield chunk
