"""The backfill on the corpora of older nats-server releases (issue 45): byte for byte what
`nats-otel convert` writes, and every hop linked under an upstream egress (2.11 and 2.12 add
`Nats-Trace-Origin-Account` across a service import, `core/shapes.RELEASE_HEADERS`)."""

from __future__ import annotations

import glob

import pytest

from tests.backfill.conftest import CORPUS, hop_spans, nats_otel_convert, read_parts

pytestmark = pytest.mark.spark


@pytest.mark.parametrize("release", ["2.11.0", "2.12.8"])
def test_backfill_of_an_older_release_links_every_hop_as_convert(spark, workdir, release):
    from spark_backfill.__main__ import run

    inputs = sorted(glob.glob(str(CORPUS.parent / f"corpus-{release}" / "*.jsonl")))
    assert len(inputs) >= 38
    out = workdir / f"release-{release}"
    assert run(spark, ["convert", "--input", *inputs, "--otlp-json-out", str(out / "otlp"),
                       "--otlp-json-partitions", "2"]) == 0
    produced = read_parts(out / "otlp")
    # Part files are range-partitioned and sorted by trace id: concatenated, the same file.
    assert produced == nats_otel_convert(inputs, workdir / f"{release}.jsonl")
    downstream, linked = hop_spans(produced)
    assert downstream >= 400 and linked == downstream, (downstream, linked)
