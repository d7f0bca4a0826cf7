"""Shared fixtures: the real corpus shipped in tests/data/corpus, and the core's two
implementations (`core`: every test that takes it runs on each)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import HealthCheck, settings

from nats_otel.core import accel, engine
from nats_otel.core.decode import parse_archive_line

# The backfill's runs make no JVM class archive in the user's cache (`spark_backfill.jvm_archive`):
# its own test turns it on, in a folder of its own.
os.environ.setdefault("NATS_OTEL_SPARK_ARCHIVE", "off")

# No test asserts a time (issue 47), Hypothesis's own checks included: its deadline per
# example and its health check on slow data generation are wall time, which a loaded or
# slower machine fails. Loaded here, before any test module makes its `@settings`, so every
# one of them inherits it.
settings.register_profile("nats-otel", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("nats-otel")

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


# The pure-Python reference always; the compiled kernel too unless NATS_OTEL_NO_EXTENSIONS
# is set (then CI's second run covers the install without it).
IMPLEMENTATIONS = ("python",) if accel.NO_EXTENSIONS else ("python", "compiled")


def _built(name: str) -> ModuleType:
    module = engine.IMPLEMENTATIONS.get(name)
    if module is None:
        pytest.fail(f"the compiled kernel is not built or refused to import ({engine.unavailable()}): "
                    "pip install -e . with a C compiler (or set NATS_OTEL_NO_EXTENSIONS=1 for the pure core)")
    return module


@pytest.fixture(params=IMPLEMENTATIONS, scope="session")
def core(request: pytest.FixtureRequest) -> ModuleType:
    """Each implementation of the core's hot path, by `engine.IMPLEMENTATIONS` name: the pure-
    Python reference (`core.reference`) and the compiled kernel (`core._kernel`), which export
    the same names (`Converter`, `convert_batch`, `prepare`, `Linker`, `map_encode`...)."""
    return _built(request.param)


@pytest.fixture(scope="session")
def kernel() -> ModuleType:
    """The compiled kernel alone, for tests that compare it with the reference (skipped when
    NATS_OTEL_NO_EXTENSIONS is set; failed when it should be built and is not)."""
    if accel.NO_EXTENSIONS:
        pytest.skip("NATS_OTEL_NO_EXTENSIONS is set: the compiled kernel is not used in this run")
    return _built("compiled")


@pytest.fixture(scope="session")
def primitives() -> ModuleType:
    """The compiled leaf of primitives (`core._primitives`), as `kernel`."""
    if accel.NO_EXTENSIONS:
        pytest.skip("NATS_OTEL_NO_EXTENSIONS is set: the compiled leaf is not used in this run")
    module = accel.compiled("_primitives")
    if module is None:
        pytest.fail(f"the compiled leaf of primitives is not built ({engine.unavailable()}): pip install -e .")
    return module


def pytest_itemcollected(item: pytest.Item) -> None:
    """Under pytest-xdist (`-n`, on by default: pyproject.toml), the backfill's tests that take
    the session's `spark` fixture share one worker, so one SparkSession (a JVM of ~2 GB,
    seconds to start) serves them all, as in a serial run. A backfill test that starts its
    own JVM (spark-submit, a Connect server, the class archive's runs) goes to whichever
    worker is free beside it, as every other test does (`--dist loadgroup`): on that one
    worker they were the suite's longest chain (issue 47). A module's own group
    (`xdist_group` in its `pytestmark`) keeps its module-scoped server on one worker."""
    if _BACKFILL in item.path.parents and "spark" in getattr(item, "fixturenames", ()) \
            and item.get_closest_marker("xdist_group") is None:
        item.add_marker(pytest.mark.xdist_group("spark"))


_BACKFILL = Path(__file__).parent / "backfill"
