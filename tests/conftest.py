"""Shared fixtures: the real corpus shipped in tests/data/corpus."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nats_otel.core.decode import parse_archive_line

CORPUS = Path(__file__).parent / "data" / "corpus"
GOLDEN = Path(__file__).parent / "golden"


def corpus_files() -> list[Path]:
    return sorted(CORPUS.glob("*.jsonl"))


def read_raws(path: Path):
    return [parse_archive_line(line) for line in path.read_bytes().splitlines() if line.strip()]


@pytest.fixture(scope="session")
def corpus_raws():
    return [raw for path in corpus_files() for raw in read_raws(path)]


@pytest.fixture(scope="session")
def manifest():
    return json.loads((CORPUS / "manifest.json").read_text())
