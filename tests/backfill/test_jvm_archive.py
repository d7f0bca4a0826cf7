"""The embedded JVM's class archive (`jvm_archive`): made after a first run, in the
background, from what that run loaded; used by the next; never half-made."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spark_backfill import jvm_archive
from tests.backfill.conftest import CORPUS, read_parts

pytestmark = pytest.mark.spark


def _run(out: Path, cache: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "NATS_OTEL_CACHE": str(cache), "SPARK_LOCAL_IP": "127.0.0.1"}
    env.pop("NATS_OTEL_SPARK_ARCHIVE", None)
    return subprocess.run([sys.executable, "-m", "spark_backfill", "convert", "--input", str(CORPUS),
                           "--otlp-json-out", str(out), "--overwrite", "--master", "local[1]"],
                          env=env, capture_output=True, text=True, timeout=600, check=False)


def _wait_for_dump(cache: Path, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while any(p.name.endswith(".dumping") for p in cache.iterdir()):
        assert time.monotonic() < deadline, f"the archive's dump still runs after {timeout_s} s"
        time.sleep(0.5)


def test_a_first_run_makes_the_archive_and_the_next_starts_from_it(tmp_path):
    cache = tmp_path / "cache"
    first = _run(tmp_path / "first", cache)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "making a class archive" in first.stderr
    _wait_for_dump(cache)
    archives = list(cache.glob("spark-*.jsa"))
    assert len(archives) == 1 and archives[0].stat().st_size > 10 << 20
    # Nothing else is left: no class list, no lock, no temporary archive, no failure.
    assert sorted(p.name for p in cache.iterdir()) == [archives[0].name]
    second = _run(tmp_path / "second", cache)
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"starts from its class archive {archives[0]}" in second.stderr
    assert "making a class archive" not in second.stderr
    assert read_parts(tmp_path / "second") == read_parts(tmp_path / "first") != b""


def _archive(tmp_path: Path) -> jvm_archive.Archive:
    classes = tmp_path / ".a.jsa.1.classes"
    classes.write_text("java/lang/Object\njava/lang/String\n")
    return jvm_archive.Archive(tmp_path / "a.jsa", classes)


def test_a_failed_dump_leaves_no_archive_and_says_why(tmp_path):
    archive = _archive(tmp_path)
    archive.lock.touch()
    status = jvm_archive.dump(archive, sys.executable, "nowhere")  # not a java: it fails
    assert status != 0
    assert not archive.path.exists() and archive.failed.exists()
    assert not archive.lock.exists() and not archive.classes.exists()
    assert [p.name for p in tmp_path.iterdir()] == [archive.failed.name]
    # No later run lists its classes again for nothing.
    assert archive.java_options() == ""


def test_options_map_an_archive_list_classes_without_one_and_one_dump_at_a_time(tmp_path, monkeypatch):
    archive = _archive(tmp_path)
    assert f"-XX:DumpLoadedClassList={archive.classes}" in archive.java_options()
    archive.lock.touch()  # another run's dump under way
    assert not jvm_archive.start_dump(archive, "java", "cp")
    assert not archive.classes.exists()
    archive.path.write_bytes(b"made")
    assert f"-XX:SharedArchiveFile={archive.path} -Xshare:auto" in archive.java_options()
    monkeypatch.setenv(jvm_archive.ENV_SWITCH, "off")
    assert jvm_archive.archive_for() is None
