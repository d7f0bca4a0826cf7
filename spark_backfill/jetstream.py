"""A JetStream stream as a Spark DataFrame: the Python data source `nats-jetstream`.

    from spark_backfill.jetstream import JetStreamDataSource
    spark.dataSource.register(JetStreamDataSource)
    df = (spark.read.format("nats-jetstream")
          .option("servers", "nats://host:4222").option("stream", "TRACES")
          .option("startSequence", 1000).option("endSequence", 2000)   # optional, inclusive
          .load())

One row per stored message (`stream`, `seq`, `subject`, `headers`: name -> values, `data`,
`published`), one Spark partition per sequence range. Nothing NATS-specific is shipped
from the driver: each task connects by itself (`servers`, `creds` must work where it runs),
reads only its range with an ephemeral, no-ack, in-memory consumer it deletes, and yields
an Arrow batch per fetch. The ranges are planned from the stream's first and last sequence
(one request, where Spark plans the read); a stream that does not exist is one error that
names it (`StreamNotFound`), never an empty DataFrame.

Options (names are case-insensitive, as Spark's):

| option | meaning | default |
|---|---|---|
| `servers` | NATS URLs, comma-separated (may hold `user:password@`) | required |
| `stream` | the stream's name | required |
| `creds` | a credentials file (must exist where the tasks run) | none |
| `startSequence`, `endSequence` | the sequences to read, inclusive; clamped to the stream's | whole stream |
| `partitions` | how many ranges (tasks) | one per 50,000 messages, at least `minPartitions` |
| `minPartitions` | the fewest ranges when `partitions` is not given | 1 |
| `fetchBatch` | messages per pull request | 512 |
| `timeout` | seconds for a connection or a request | 5 |
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import AsyncGenerator, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

__all__ = [
    "NAME",
    "SCHEMA",
    "JetStreamDataSource",
    "JetStreamRange",
    "JetStreamSource",
    "StreamNotFound",
    "plan_ranges",
    "read_messages",
    "stream_bounds",
]

log = logging.getLogger("spark_backfill")

NAME = "nats-jetstream"
SCHEMA = ("stream string, seq long, subject string, headers map<string,array<string>>, data binary, "
          "published timestamp")

# Headers the server adds to messages it hands out of a stream; not the message's own.
STREAM_HEADERS = frozenset(
    {"nats-stream", "nats-sequence", "nats-subject", "nats-time-stamp", "nats-num-pending", "nats-last-sequence"}
)

# A range per this many messages when `partitions` is not given: a task's Arrow batches
# stay small, and a large stream is read by as many tasks as the cluster runs.
MESSAGES_PER_RANGE = 50_000


class StreamNotFound(Exception):
    """The stream does not exist on the servers (or the user may not see it)."""

    def __init__(self, stream: str, servers: tuple[str, ...]) -> None:
        super().__init__(f"JetStream stream {stream!r} not found on {', '.join(_redact(s) for s in servers)}")
        self.stream = stream


def _redact(url: str) -> str:
    scheme, sep, rest = url.rpartition("://")
    return f"{scheme}{sep}{rest.rpartition('@')[2]}"


@dataclass(frozen=True, slots=True)
class JetStreamSource:
    """Where the stream is: shipped to the tasks, which connect themselves."""

    servers: tuple[str, ...]
    stream: str
    creds: str | None = None
    fetch_batch: int = 512
    timeout: float = 5.0

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> JetStreamSource:
        """From the data source's options; names the missing or bad one."""
        servers = tuple(s.strip() for s in str(options.get("servers", "")).split(",") if s.strip())
        stream = str(options.get("stream", "")).strip()
        if not servers or not stream:
            raise ValueError(f"the {NAME} data source needs the options 'servers' and 'stream'")
        return cls(servers, stream, options.get("creds") or None, _number(options, "fetchBatch", 512, int),
                   _number(options, "timeout", 5.0, float))


def _number(options: Mapping[str, str], name: str, default: Any, kind: type) -> Any:
    value = options.get(name)
    if value is None:
        return default
    try:
        number = kind(value)
    except ValueError:
        number = 0
    if number <= 0:
        raise ValueError(f"{NAME} option {name!r}: expected a positive number, got {value!r}")
    return number


@dataclass(frozen=True, slots=True)
class JetStreamRange(InputPartition):
    """Stream sequences `first`..`last` (inclusive): one task's share."""

    first: int
    last: int


def plan_ranges(first: int, last: int, parts: int) -> list[JetStreamRange]:
    """Split `first..last` into at most `parts` contiguous, non-overlapping ranges."""
    if last < first or first <= 0:
        return []
    total = last - first + 1
    size = math.ceil(total / max(1, parts))
    return [JetStreamRange(start, min(last, start + size - 1)) for start in range(first, last + 1, size)]


async def _connect(source: JetStreamSource) -> Any:
    import nats

    kwargs: dict[str, Any] = {"servers": list(source.servers), "connect_timeout": source.timeout,
                              "allow_reconnect": False}
    if source.creds:
        kwargs["user_credentials"] = source.creds
    return await nats.connect(**kwargs)


async def _bounds(source: JetStreamSource) -> tuple[int, int, int]:
    from nats.js.errors import NotFoundError

    nc = await _connect(source)
    try:
        info = await nc.jetstream(timeout=source.timeout).stream_info(source.stream)
    except NotFoundError:
        raise StreamNotFound(source.stream, source.servers) from None
    finally:
        await nc.close()
    return info.state.first_seq, info.state.last_seq, info.state.messages


def stream_bounds(source: JetStreamSource) -> tuple[int, int, int]:
    """(first sequence, last sequence, message count) of the stream; `StreamNotFound` if none."""
    return asyncio.run(_bounds(source))


# One message as the tasks yield it: (seq, subject, headers, data, published).
Message = tuple[int, str, dict[str, list[str]], bytes, Any]


def _message(msg: Any) -> Message:
    headers = {k: [v] for k, v in (msg.headers or {}).items() if k.lower() not in STREAM_HEADERS}
    return msg.metadata.sequence.stream, msg.subject, headers, msg.data, msg.metadata.timestamp


async def _fetches(source: JetStreamSource, part: JetStreamRange) -> AsyncGenerator[list[Message], None]:
    """The messages with sequences in `part`, a list per fetch.

    An ephemeral pull consumer starting at `part.first`, no acks, in memory, deleted when
    done (and by the server after `inactive_threshold` should this task die first): reads
    only this range and leaves no consumer state behind. Gaps (deleted messages) are
    skipped by the server.
    """
    from nats.errors import TimeoutError as NatsTimeout
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

    nc = await _connect(source)
    js = nc.jetstream(timeout=source.timeout)
    consumer = None
    try:
        config = ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=part.first,
                                ack_policy=AckPolicy.NONE, inactive_threshold=60.0, mem_storage=True, num_replicas=1)
        consumer = (await js.add_consumer(source.stream, config)).name
        sub = await js.pull_subscribe_bind(consumer=consumer, stream=source.stream)
        done = False
        while not done:
            try:
                msgs = await sub.fetch(batch=source.fetch_batch, timeout=source.timeout)
            except (TimeoutError, NatsTimeout):
                break  # nothing more in the stream
            fetched: list[Message] = []
            for msg in msgs:
                seq = msg.metadata.sequence.stream
                if seq > part.last:
                    done = True
                    break
                fetched.append(_message(msg))
                if seq == part.last or msg.metadata.num_pending == 0:
                    done = True
                    break
            yield fetched
        await sub.unsubscribe()
    finally:
        if consumer is not None:
            try:
                await js.delete_consumer(source.stream, consumer)
            except Exception as exc:  # noqa: BLE001 - the inactive threshold removes it anyway
                log.warning("could not delete ephemeral consumer %s: %s", consumer, exc)
        await nc.close()


def read_messages(source: JetStreamSource, part: JetStreamRange) -> Iterator[list[Message]]:
    """The messages of one range, a list per fetch, as they come (a task holds one fetch at
    a time); runs in a task, connects by itself, and cleans up when the iteration ends."""
    loop = asyncio.new_event_loop()
    fetches = _fetches(source, part)
    try:
        while True:
            try:
                yield loop.run_until_complete(anext(fetches))
            except StopAsyncIteration:
                return
    finally:
        loop.run_until_complete(fetches.aclose())
        loop.close()


def _arrow(stream: str, messages: list[Message]) -> Any:
    import pyarrow as pa

    return pa.RecordBatch.from_arrays(
        [pa.array([stream] * len(messages), pa.string()), pa.array([m[0] for m in messages], pa.int64()),
         pa.array([m[1] for m in messages], pa.string()),
         pa.array([list(m[2].items()) for m in messages], pa.map_(pa.string(), pa.list_(pa.string()))),
         pa.array([m[3] for m in messages], pa.binary()),
         pa.array([m[4] for m in messages], pa.timestamp("us", tz="UTC"))],
        names=["stream", "seq", "subject", "headers", "data", "published"])


class JetStreamReader(DataSourceReader):
    """Plans the ranges (where Spark plans the read) and reads one per task."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.source = JetStreamSource.from_options(options)
        self.start = _number(options, "startSequence", 1, int)
        self.end = _number(options, "endSequence", 1 << 63, int)
        self.parts = _number(options, "partitions", 0, int) if options.get("partitions") is not None else None
        self.min_parts = _number(options, "minPartitions", 1, int)

    def plan(self) -> tuple[list[JetStreamRange], int]:
        """(the ranges to read, the stream's message count): one request to the servers."""
        first, last, count = stream_bounds(self.source)
        parts = self.parts or max(self.min_parts, math.ceil(count / MESSAGES_PER_RANGE))
        return plan_ranges(max(first, self.start), min(last, self.end), parts), count

    def partitions(self) -> list[JetStreamRange]:
        return self.plan()[0]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if not isinstance(partition, JetStreamRange):  # Spark's one empty partition: nothing to read
            return
        for messages in read_messages(self.source, partition):
            if messages:
                yield _arrow(self.source.stream, messages)


class JetStreamDataSource(DataSource):
    """`spark.read.format("nats-jetstream")`: see the module's documentation for the options."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema: Any) -> JetStreamReader:
        return JetStreamReader(self.options)
