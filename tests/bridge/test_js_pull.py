"""The JetStream puller (`bridge/sources/js_pull.py`) served directly against nats-py's own
path, over a real nats-server with JetStream: the same deliveries, settled alike.

Two durables on one stream each see every message: one pulled on a `DirectClient` (the
replies handed over inside the parser), one on a plain nats-py `Client` (the fallback).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import nats
import pytest
from nats.js.api import AckPolicy, ConsumerConfig, StreamConfig

from nats_otel.bridge.sources import direct
from nats_otel.bridge.sources.js_pull import Puller
from nats_otel.bridge.telemetry import Metrics
from nats_otel.devkit.processes import start_topology
from nats_otel.devkit.topology import single_server

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

STREAM = "PULLED"
MESSAGES = 40


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with start_topology(single_server(jetstream=True)) as topo:
        yield topo.client_url("n1", "a")


async def _client(url: str, direct_client: bool) -> nats.NATS:
    nc = direct.DirectClient() if direct_client else nats.NATS()
    await nc.connect(url)
    return nc


async def _stream(nc: nats.NATS, subject: str, durables: list[str]) -> None:
    js = nc.jetstream()
    await js.add_stream(StreamConfig(name=STREAM + subject.replace(".", "_"), subjects=[subject]))
    for durable in durables:
        await js.add_consumer(STREAM + subject.replace(".", "_"), ConsumerConfig(
            durable_name=durable, ack_policy=AckPolicy.EXPLICIT, ack_wait=30.0))
    for i in range(MESSAGES):
        await js.publish(subject, b'{"i":%d}' % i, headers={"traceparent": f"00-{i:032x}-{i + 1:016x}-01",
                                                            "Nats-Trace-Dest": "x"})


async def _one_puller(url: str, subject: str, metrics: Metrics | None = None
                      ) -> tuple[nats.NATS, nats.NATS, Puller, str]:
    """A stream of MESSAGES on `subject` with the durable "fast", pulled on a DirectClient:
    (the setup's connection, the puller's, the puller, the stream)."""
    setup = await nats.connect(url)
    nc = await _client(url, True)
    await _stream(setup, subject, ["fast"])
    stream = STREAM + subject.replace(".", "_")
    puller = Puller(nc, stream, "fast", (metrics or Metrics()).issues.labels("malformed_header"))
    await puller.start(pending_limit=1024)
    return setup, nc, puller, stream


async def _pull_all(puller: Puller) -> list:
    out: list = []
    while len(out) < MESSAGES:
        got = await puller.fetch(16, 2.0)
        assert got, f"fetched {len(out)} of {MESSAGES}"
        out += got
    return out


async def test_direct_replies_give_what_nats_pys_path_gives(url: str) -> None:
    setup = await nats.connect(url)
    fast, fallback = await _client(url, True), await _client(url, False)
    try:
        await _stream(setup, "pull.same", ["fast", "slow"])
        metrics = Metrics()
        stream = STREAM + "pull_same"
        fast_puller = Puller(fast, stream, "fast", metrics.issues.labels("malformed_header"))
        slow_puller = Puller(fallback, stream, "slow", metrics.issues.labels("malformed_header"))
        for puller in (fast_puller, slow_puller):
            await puller.start(pending_limit=1024)
        assert fast_puller.direct and not slow_puller.direct
        fast_pulled, slow_pulled = await _pull_all(fast_puller), await _pull_all(slow_puller)
        # The same trace messages, in order: subject, headers, payload (the receive time aside).
        assert [(r.subject, r.headers, r.payload) for _, r in fast_pulled] == \
               [(r.subject, r.headers, r.payload) for _, r in slow_pulled]
        assert fast_pulled[3][1].headers["traceparent"] == [f"00-{3:032x}-{4:016x}-01"]
        # The same metadata, read from the ack subject.
        for (fast_msg, _), (slow_msg, _) in zip(fast_pulled, slow_pulled, strict=True):
            assert fast_msg.metadata.sequence.stream == slow_msg.metadata.sequence.stream
            assert fast_msg.metadata.num_delivered == slow_msg.metadata.num_delivered == 1
        assert fast_pulled[-1][0].metadata.num_pending == 0
        # Nothing more: the status reply ends the round (404/408), no message.
        assert await fast_puller.fetch(16, 0.5) == []
    finally:
        for nc in (setup, fast, fallback):
            await nc.close()


async def test_direct_deliveries_settle_as_nats_pys_do(url: str) -> None:
    """Acked ones are gone, a naked one comes back delivered twice, a termed one never."""
    setup, nc, puller, stream = await _one_puller(url, "pull.settle")
    try:
        pulled = await _pull_all(puller)
        for msg, _ in pulled[2:]:
            await msg.ack()
        await pulled[0][0].nak(delay=0.2)
        await pulled[1][0].term()
        again = await puller.fetch(16, 5.0)
        assert [(m.metadata.sequence.stream, m.metadata.num_delivered) for m, _ in again] == \
               [(pulled[0][0].metadata.sequence.stream, 2)]
        await again[0][0].ack()
        await asyncio.sleep(0.3)
        info = await setup.jetstream().consumer_info(stream, "fast")
        assert (info.num_ack_pending, info.num_pending, info.num_redelivered) == (0, 0, 0)
        assert await puller.fetch(16, 0.5) == []  # the termed one never comes back
    finally:
        await setup.close()
        await nc.close()


async def test_a_deleted_durable_is_reported_by_the_direct_path(url: str) -> None:
    setup, nc, puller, stream = await _one_puller(url, "pull.gone")
    try:
        await _pull_all(puller)
        await setup.jetstream().delete_consumer(stream, "fast")
        assert await puller.fetch(16, 1.0) == []
        assert puller.consumer_gone is not None, "a pull to a deleted durable must say it is gone"
    finally:
        await setup.close()
        await nc.close()


async def _publish_raw_headers(url: str, subject: str, block: bytes, payload: bytes) -> None:
    """One message with exactly `block` as its header block (nats-py writes only valid ones)."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    await reader.readline()  # INFO
    connect = json.dumps({"user": parts.username, "pass": parts.password, "verbose": False, "pedantic": False,
                          "headers": True, "protocol": 1})
    frame = b"HPUB %s %d %d\r\n" % (subject.encode(), len(block), len(block) + len(payload))
    writer.write(b"CONNECT " + connect.encode() + b"\r\n" + frame + block + payload + b"\r\nPING\r\n")
    await writer.drain()
    assert (await reader.readline()).startswith(b"PONG")
    writer.close()


async def test_a_malformed_header_block_is_counted_and_the_rest_kept(url: str, caplog) -> None:
    metrics = Metrics()
    setup, nc, puller, _ = await _one_puller(url, "pull.odd", metrics)
    try:
        await _pull_all(puller)  # the stream's well-formed messages
        await _publish_raw_headers(url, "pull.odd", b"NATS/1.0\r\nno colon here\r\nX-Kept: 1\r\n\r\n", b"{}")
        got = await puller.fetch(16, 5.0)
        assert [raw.headers for _, raw in got] == [{"X-Kept": ["1"]}]
        assert metrics.registry.get_sample_value("nats_otel_mapping_issues_total", {"kind": "malformed_header"}) == 1
        assert "malformed message headers" in caplog.text
        await got[0][0].ack()
    finally:
        await setup.close()
        await nc.close()


async def test_an_idle_puller_on_a_paced_connection_waits_out_each_request() -> None:
    """On a connection read once a tick (`read_pacing`), the end of an expired pull request
    (408) may come up to a tick late: each round waits for its own end (the request expires
    that much sooner), so an idle puller asks about once per `timeout`, never in a spin of
    rounds ended early by another request's end."""
    with start_topology(single_server(jetstream=True)) as topo:
        url = topo.client_url("n1", "a")
        setup = await nats.connect(url)
        nc = direct.DirectClient(0.2)
        await nc.connect(url)
        try:
            js = setup.jetstream()
            await js.add_stream(StreamConfig(name="IDLE", subjects=["pull.idle"]))
            await js.add_consumer("IDLE", ConsumerConfig(durable_name="idle", ack_policy=AckPolicy.EXPLICIT))
            puller = Puller(nc, "IDLE", "idle", Metrics().issues.labels("malformed_header"))
            await puller.start(pending_limit=1024)
            timeout, seconds, rounds = 1.0, 4.0, 0
            loop = asyncio.get_running_loop()
            started = loop.time()
            while loop.time() - started < seconds:
                assert await puller.fetch(10, timeout) == []
                rounds += 1
            assert puller.consumer_gone is None
            # Each fetch: an answer to `no_wait`, then a request expiring the margin (0.25 s)
            # before `timeout`.
            assert rounds <= seconds / (timeout - 0.25) + 1, f"{rounds} fetches in {seconds} s"
        finally:
            await nc.close()
            await setup.close()
