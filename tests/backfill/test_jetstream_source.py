"""The `nats-jetstream` data source by itself, as any PySpark user reads a stream: a real
nats-server with JetStream, a real SparkSession."""

from __future__ import annotations

import asyncio
import datetime
import itertools

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.integration]

STREAM = "EVENTS"


async def _fill(url: str, count: int) -> tuple[int, int, list[int]]:
    """`count` messages on `events.N` (every third with a header), the 5th deleted:
    (first, last, the sequences kept)."""
    import nats

    nc = await nats.connect(url)
    js = nc.jetstream()
    await js.add_stream(name=STREAM, subjects=["events.>"])
    for n in range(count):
        await js.publish(f"events.{n}", f"message {n}".encode(), headers={"X-N": str(n)} if n % 3 == 0 else None)
    await js.delete_msg(STREAM, 5)
    info = await js.stream_info(STREAM)
    consumers = info.state.consumer_count
    await nc.close()
    assert consumers == 0
    return info.state.first_seq, info.state.last_seq, [s for s in range(1, count + 1) if s != 5]


async def _consumers(url: str) -> int:
    import nats

    nc = await nats.connect(url)
    info = await nc.jetstream().stream_info(STREAM)
    await nc.close()
    return info.state.consumer_count


@pytest.fixture(scope="module")
def stream():
    from nats_otel.devkit.processes import start_topology
    from nats_otel.devkit.topology import single_server

    with start_topology(single_server(jetstream=True)) as topo:
        url = topo.client_url("n1", user="a")
        first, last, kept = asyncio.run(_fill(url, 40))
        yield {"url": url, "first": first, "last": last, "kept": kept}


def _reader(spark, stream, **options):
    from spark_backfill.jetstream import JetStreamDataSource

    spark.dataSource.register(JetStreamDataSource)
    reader = spark.read.format("nats-jetstream").option("servers", stream["url"]).option("stream", STREAM)
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


def test_a_stream_reads_as_a_dataframe_over_several_partitions(spark, stream):
    from pyspark.sql import functions as F  # noqa: N812 - the PySpark convention

    df = _reader(spark, stream, partitions=4, fetchBatch=7)
    rows = df.withColumn("part", F.spark_partition_id()).collect()
    assert [r["seq"] for r in sorted(rows, key=lambda r: r["seq"])] == stream["kept"]
    assert len({r["part"] for r in rows}) == 4
    # Each partition holds one contiguous range, in order.
    by_part: dict[int, list[int]] = {}
    for r in rows:
        by_part.setdefault(r["part"], []).append(r["seq"])
    spans = sorted((min(seqs), max(seqs)) for seqs in by_part.values())
    assert all(a[1] < b[0] for a, b in itertools.pairwise(spans))
    row = next(r for r in rows if r["seq"] == 7)  # message 6: a header, no stream headers
    assert (row["stream"], row["subject"], bytes(row["data"])) == (STREAM, "events.6", b"message 6")
    assert row["headers"] == {"X-N": ["6"]}
    assert next(r for r in rows if r["seq"] == 8)["headers"] == {}
    assert isinstance(row["published"], datetime.datetime)
    assert asyncio.run(_consumers(stream["url"])) == 0, "the ranges left consumers behind"


def test_sequence_ranges_are_inclusive_and_clamped_to_the_stream(spark, stream):
    inside = _reader(spark, stream, startSequence=3, endSequence=9, partitions=3)
    assert sorted(r["seq"] for r in inside.select("seq").collect()) == [3, 4, 6, 7, 8, 9]
    past = _reader(spark, stream, startSequence=stream["last"] + 10)
    assert past.count() == 0
    tail = _reader(spark, stream, startSequence=stream["last"] - 1, endSequence=stream["last"] + 100)
    assert sorted(r["seq"] for r in tail.select("seq").collect()) == [stream["last"] - 1, stream["last"]]


def test_a_missing_stream_is_one_clear_error(spark, stream):
    from spark_backfill.jetstream import JetStreamDataSource

    spark.dataSource.register(JetStreamDataSource)
    df = spark.read.format("nats-jetstream").option("servers", stream["url"]).option("stream", "NOPE").load()
    with pytest.raises(Exception) as caught:
        df.count()
    text = str(caught.value)
    assert "JetStream stream 'NOPE' not found on nats://127.0.0.1:" in text
    assert "a:" not in text.split("not found on ")[1].split()[0], "the password was shown"


def test_options_are_checked_by_name(spark, stream):
    from spark_backfill.jetstream import JetStreamDataSource

    spark.dataSource.register(JetStreamDataSource)
    with pytest.raises(Exception, match="needs the options 'servers' and 'stream'"):
        spark.read.format("nats-jetstream").option("servers", stream["url"]).load().count()
    with pytest.raises(Exception, match="option 'partitions': expected a positive number"):
        _reader(spark, stream, partitions="zero").count()
