"""The backfill's JetStream reader works with exactly the permissions docs/security.md lists.

No Spark here: the driver's `stream_bounds` and the executors' `read_range` are plain
functions; the Spark wiring around them is tested in tests/backfill/test_jetstream.py.
"""

from __future__ import annotations

import asyncio
import glob
from pathlib import Path

import nats
import pytest

from nats_otel.core.decode import parse_archive_line
from tests.bridge.test_security_bridge import APP_PASSWORD, denied, nats_server

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

CORPUS = Path(__file__).resolve().parents[1] / "data" / "corpus"
BACKFILL_PASSWORD = "bf-Pa55word-8Kq"
# docs/security.md, "Backfill user": read one stream through short-lived ephemeral consumers.
BACKFILL_PERMISSIONS = """{
        publish: { allow: [
          "$JS.API.STREAM.INFO.NATS_TRACES",
          "$JS.API.CONSUMER.CREATE.NATS_TRACES",
          "$JS.API.CONSUMER.MSG.NEXT.NATS_TRACES.*",
          "$JS.API.CONSUMER.DELETE.NATS_TRACES.*"
        ] }
        subscribe: { allow: ["_INBOX.>"] }
      }"""


async def _record(url: str, raws) -> None:
    """What the servers would have written: trace messages in a stream an administrator made."""
    nc = await nats.connect(url)
    js = nc.jetstream()
    await js.add_stream(name="NATS_TRACES", subjects=["trace.a"])
    for raw in raws:
        await js.publish("trace.a", raw.payload, headers={k: v[0] for k, v in raw.headers.items()} or None)
    await nc.close()


async def _consumer_count(url: str) -> int:
    nc = await nats.connect(url)
    info = await nc.jetstream().stream_info("NATS_TRACES")
    await nc.close()
    return info.state.consumer_count


def test_backfill_reads_ranges_with_the_least_privilege_user(tmp_path: Path) -> None:
    from spark_backfill.jetstream import JetStreamSource, plan_ranges, stream_bounds
    from spark_backfill.sources import read_range

    raws = [parse_archive_line(line) for f in sorted(glob.glob(str(CORPUS / "*.jsonl")))
            for line in Path(f).read_bytes().splitlines(keepends=True) if line.strip()][:40]
    users = (f'      {{ user: backfill, password: "{BACKFILL_PASSWORD}", '
             f"permissions: {BACKFILL_PERMISSIONS} }}")
    with nats_server(tmp_path, users, jetstream=True) as hostport:
        admin_url = f"nats://app:{APP_PASSWORD}@{hostport}"
        url = f"nats://backfill:{BACKFILL_PASSWORD}@{hostport}"
        asyncio.run(_record(admin_url, raws))

        source = JetStreamSource((url,), "NATS_TRACES", timeout=2.0)
        first, last, count = stream_bounds(source)
        assert (first, last, count) == (1, len(raws), len(raws))
        lines = [line for part in plan_ranges(first, last, 3) for line, _ in read_range(part, source)]
        read = [parse_archive_line(line.encode()) for line in lines]
        assert [r.payload for r in read] == [r.payload for r in raws]
        assert asyncio.run(_consumer_count(admin_url)) == 0, "ephemeral consumers left behind"

        # Everything else is refused: deleting or purging the stream, writing trace subjects,
        # reading them outside JetStream, creating durables.
        for action in (
            lambda nc: nc.publish("$JS.API.STREAM.DELETE.NATS_TRACES", b""),
            lambda nc: nc.publish("$JS.API.STREAM.PURGE.NATS_TRACES", b""),
            lambda nc: nc.publish("trace.a", b"forged"),
            lambda nc: nc.subscribe("trace.a"),
            lambda nc: nc.publish("$JS.API.CONSUMER.DURABLE.CREATE.NATS_TRACES.mine", b"{}"),
        ):
            assert "permissions violation" in asyncio.run(denied(url, action))
