"""The key pass's own reading of local archives (`splits`): every non-blank line once,
whatever the split sizes, as `nats-otel convert` reads the file."""

from __future__ import annotations

import gzip
import random
from pathlib import Path

import pytest

from spark_backfill import splits


def _archive(path: Path, rnd: random.Random) -> list[bytes]:
    """A file of lines of random lengths (blank ones, CRLF ones, long ones, a last line
    without its newline); the lines `convert` reads of it."""
    lines = []
    for _ in range(rnd.randint(0, 300)):
        kind = rnd.random()
        if kind < 0.1:
            lines.append(rnd.choice([b"\n", b"  \n", b"\r\n", b"\t\n"]))
        else:
            body = bytes(rnd.choice(b"abc{}\":,0123") for _ in range(rnd.choice([1, 5, 40, 700, 5000])))
            lines.append(body + (b"\r\n" if kind < 0.2 else b"\n"))
    if lines and rnd.random() < 0.5:
        lines[-1] = lines[-1].rstrip(b"\r\n") or b"x"
    data = b"".join(lines)
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(data, mtime=0))
    else:
        path.write_bytes(data)
    return [line for line in data.splitlines(keepends=True) if line.strip()]


@pytest.mark.parametrize("seed", range(40))
def test_every_line_is_read_once_whatever_the_splits(tmp_path, seed):
    rnd = random.Random(seed)
    expected = {}
    for number in range(rnd.randint(1, 5)):
        path = tmp_path / f"part-{number}.jsonl{'.gz' if rnd.random() < 0.2 else ''}"
        expected[str(path)] = _archive(path, rnd)
    max_split = rnd.choice([1, 7, 100, 1000, 64 << 10])
    tasks = splits.plan(sorted(expected), max_split, cores=rnd.randint(1, 4), open_cost=rnd.choice([1, 50, 4 << 20]))
    read: dict[str, list[tuple[int, list[bytes]]]] = {}
    for task in tasks:
        for split in task:
            lines = [line for chunk in splits.read_lines(split, rows=rnd.randint(1, 50)) for line in chunk]
            read.setdefault(split.path, []).append((split.start, lines))
    for path, lines in expected.items():
        # A compressed file is one split.
        assert not path.endswith(".gz") or len(read[path]) == 1
        assert [line for _, part in sorted(read[path]) for line in part] == lines


def test_small_files_share_a_task_and_large_ones_are_split(tmp_path):
    small = [tmp_path / f"small-{n}.jsonl" for n in range(6)]
    for path in small:
        path.write_bytes(b"{}\n" * 10)
    large = tmp_path / "large.jsonl"
    large.write_bytes(b"{}\n" * 100_000)  # 300,000 bytes
    tasks = splits.plan([str(p) for p in [*small, large]], max_split_bytes=64_000, cores=2, open_cost=1_000)
    large_splits = [s for task in tasks for s in task if s.path == str(large)]
    assert len(large_splits) == 5 and all(s.end - s.start <= 64_000 for s in large_splits)
    # The six small files (30 bytes each, plus the open cost) fit in one task.
    assert sum(1 for task in tasks if any(Path(s.path).name.startswith("small") for s in task)) == 1
    assert splits.Split(str(large), 0, -1).source == large.as_uri()
