"""The JetStream source, against a real nats-server holding recorded trace messages."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from nats_otel.core.decode import parse_archive_line
from tests.backfill.conftest import corpus_files, nats_otel_convert, read_parts

pytestmark = [pytest.mark.spark, pytest.mark.integration]

STREAM = "TRACES"


async def _fill(url: str, raws) -> tuple[int, int]:
    import nats

    nc = await nats.connect(url)
    js = nc.jetstream()
    await js.add_stream(name=STREAM, subjects=["trace.>", "adhoc.trace.>"])
    # A few messages deleted in the middle: ranges must cope with gaps.
    await js.publish("trace.noise", b"deleted below")
    for raw in raws:
        headers = {k: v[0] for k, v in raw.headers.items()} or None
        await js.publish(raw.subject, raw.payload, headers=headers)
    await js.publish("trace.noise", b"deleted below")
    info = await js.stream_info(STREAM)
    await js.delete_msg(STREAM, 1)
    await js.delete_msg(STREAM, info.state.last_seq)
    await nc.close()
    return info.state.first_seq, info.state.last_seq


async def _consumers(url: str) -> int:
    import nats

    nc = await nats.connect(url)
    info = await nc.jetstream().stream_info(STREAM)
    await nc.close()
    return info.state.consumer_count


def test_jetstream_ranges_give_the_same_spans_as_convert(spark, workdir):
    from nats_otel.devkit.processes import start_topology
    from nats_otel.devkit.topology import single_server
    from spark_backfill import jetstream
    from spark_backfill.__main__ import run

    files = corpus_files()
    raws = [parse_archive_line(line) for f in files for line in Path(f).read_bytes().splitlines(keepends=True)
            if line.strip()]
    with start_topology(single_server(jetstream=True)) as topo:
        url = topo.client_url("n1", user="a")
        first, last = asyncio.run(_fill(url, raws))
        assert last - first + 1 == len(raws) + 2
        bounds = jetstream.stream_bounds(jetstream.JetStreamSource((url,), STREAM))
        # JetStream keeps last_seq when the last message is deleted: the last range ends in a gap.
        assert bounds == (first + 1, last, len(raws))
        out = workdir / "jetstream"
        status = run(
            spark,
            ["convert", "--jetstream-url", url, "--stream", STREAM, "--jetstream-ranges", "5",
             "--otlp-json-out", str(out / "otlp"), "--rejects-out", str(out / "rejects"),
             "--otlp-json-partitions", "2"],
        )
        assert status == 0
        assert asyncio.run(_consumers(url)) == 0, "the ranges left consumers behind"
    reference = nats_otel_convert(files, workdir / "jetstream-reference.jsonl")
    assert read_parts(out / "otlp") == reference
    assert not any(p.read_text().strip() for p in (out / "rejects").glob("part-*"))


def test_plan_ranges_cover_each_sequence_once():
    from spark_backfill.jetstream import plan_ranges

    for first, last, parts in [(1, 1, 4), (1, 10, 3), (5, 1004, 7), (3, 4, 10)]:
        ranges = plan_ranges(first, last, parts)
        covered = [seq for r in ranges for seq in range(r.first, r.last + 1)]
        assert covered == list(range(first, last + 1))
        assert len(ranges) <= parts
    assert plan_ranges(0, 0, 4) == []
