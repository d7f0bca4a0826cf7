"""Output folders as users get them: files by size, `.jsonl` names, no checksum files, and
nothing partial or empty left behind when the job fails."""

from __future__ import annotations

import gzip
import math
from pathlib import Path

import pytest

from tests.backfill.conftest import corpus_files, nats_otel_convert

pytestmark = pytest.mark.spark


def _names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def _leftovers(folder: Path) -> list[str]:
    """Checksum files and staging folders anywhere below `folder`."""
    return sorted(str(p) for p in folder.rglob("*") if p.name.endswith(".crc") or ".incomplete-" in p.name)


@pytest.fixture(scope="module")
def reference(workdir) -> bytes:
    return nats_otel_convert(corpus_files(), workdir / "outputs-reference.jsonl")


def test_default_is_one_jsonl_file_per_64_mib(spark, workdir, reference):
    from spark_backfill.__main__ import run

    out = workdir / "sized-default"
    assert run(spark, ["convert", "--input", *corpus_files(), "--otlp-json-out", str(out / "otlp"),
                       "--parquet-out", str(out / "spans"), "--rejects-out", str(out / "rejects")]) == 0
    # The corpus is 0.7 MB of OTLP/JSON: one file (Spark's default gave one per trace).
    assert _names(out / "otlp") == ["_SUCCESS", "part-00000.jsonl"]
    assert (out / "otlp" / "part-00000.jsonl").read_bytes() == reference
    assert _names(out / "rejects") == ["_SUCCESS", "part-00000.jsonl"]
    assert len(list((out / "spans").glob("*.parquet"))) == 1
    assert spark.read.parquet(str(out / "spans")).count() > 0
    assert _leftovers(workdir) == []


def test_target_size_and_gzip_give_jsonl_gz_files_that_concatenate_to_convert(spark, workdir, reference):
    from spark_backfill.__main__ import run

    out = workdir / "sized-64k"
    target = 64 << 10
    assert run(spark, ["convert", "--input", *corpus_files(), "--otlp-json-out", str(out / "otlp"),
                       "--target-file-bytes", "64K", "--compress", "gzip"]) == 0
    parts = sorted((out / "otlp").glob("part-*"))
    assert [p.name for p in parts] == [f"part-{i:05d}.jsonl.gz" for i in range(len(parts))]
    assert b"".join(gzip.decompress(p.read_bytes()) for p in parts) == reference
    # File count from the estimated size: within a third of what the real size asks for.
    wanted = math.ceil(len(reference) / target)
    assert wanted >= 8
    assert wanted * 2 / 3 <= len(parts) <= wanted * 4 / 3, (len(parts), wanted)
    assert _leftovers(workdir) == []


def test_a_failed_job_leaves_no_output_and_keeps_the_old_one(spark, workdir, capsys):
    from spark_backfill.__main__ import run

    out = workdir / "failing"
    old = out / "otlp"
    old.mkdir(parents=True)
    (old / "part-00000.jsonl").write_bytes(b"the run before\n")
    # The Parquet sink, last of three, fails in the middle of the job: this codec is in
    # Spark's list but not on its class path.
    spark.conf.set("spark.sql.parquet.compression.codec", "brotli")
    try:
        status = run(spark, ["convert", "--input", *corpus_files()[:4], "--otlp-json-out", str(old),
                             "--rejects-out", str(out / "new" / "rejects"), "--parquet-out", str(out / "new" / "spans"),
                             "--overwrite"])
    finally:
        spark.conf.unset("spark.sql.parquet.compression.codec")
    assert status == 1
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(errors) == 1 and "the job failed:" in errors[0] and "brotli" in errors[0].lower(), errors
    # The old output is untouched, the new folders (and their new parent) are gone.
    assert _names(out) == ["otlp"]
    assert _names(old) == ["part-00000.jsonl"]
    assert (old / "part-00000.jsonl").read_bytes() == b"the run before\n"


def test_overwrite_replaces_the_old_output_once_the_job_succeeded(spark, workdir):
    from spark_backfill.__main__ import run

    old = workdir / "replaced"
    old.mkdir()
    (old / "part-00000-0000-c000.txt").write_bytes(b"the run before\n")
    (old / "stale.txt").write_bytes(b"x")
    files = corpus_files()[:2]
    assert run(spark, ["convert", "--input", *files, "--otlp-json-out", str(old), "--overwrite"]) == 0
    assert _names(old) == ["_SUCCESS", "part-00000.jsonl"]
    assert (old / "part-00000.jsonl").read_bytes() == nats_otel_convert(files, workdir / "replaced-reference.jsonl")


def test_a_corrupt_input_fails_in_one_line_without_an_empty_output(spark, workdir, capsys):
    from spark_backfill.__main__ import run

    broken = workdir / "broken.jsonl.gz"
    broken.write_bytes(gzip.compress(Path(corpus_files()[0]).read_bytes())[:-40])  # cut short
    out = workdir / "from-broken" / "otlp"
    assert run(spark, ["convert", "--input", str(broken), "--otlp-json-out", str(out)]) == 1
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(errors) == 1 and "the job failed:" in errors[0], errors
    assert not (workdir / "from-broken").exists()
