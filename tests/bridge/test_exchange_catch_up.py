"""JetStream mode with trace ownership: the evidence a former owner keeps after a change's
replay reaches the new owner by the replay as the hold window closes (`replay_at`).

The issue it closes: a bridge that took a trace message before a change maps it after,
and keeps its evidence then; the trace's new owner replayed at the change and heard
nothing since (no bridge hears kept evidence live), so a downstream report it held came
back to no evidence and was exported unlinked, where a copy exported before (a late
answer, a SIGKILL) was linked: one span with two parents (issue 46, the membership test).
Over a real nats-server with JetStream, two exchanges on the kept subject.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import nats
import pytest

from nats_otel.bridge.exchange import LinkExchange
from nats_otel.bridge.telemetry import Metrics
from nats_otel.core.evidence import HopEvidence, encode_batch
from nats_otel.devkit.processes import start_topology
from nats_otel.devkit.topology import single_server
from tests.bridge.bridge_helpers import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

SUBJECT = "nats-otel.links.catchup"
STREAM = "NATS_OTEL_LINKS_catchup"


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with start_topology(single_server(jetstream=True)) as topo:
        yield topo.client_url("n1", "a")


def _report(seq: int) -> HopEvidence:
    return HopEvidence(ident=b"hop-%d" % seq, server_id="NSERVER", server_name="n1", account="A", seq=seq,
                       ts_ns=time.time_ns(), context=b"\x01" * 24, adhoc=False, arrival=None)


class _Heard:
    """An exchange's recorder: the sequence numbers of the reports it recorded."""

    def __init__(self) -> None:
        self.seqs: list[int] = []

    def __call__(self, reports, latencies, peer=None) -> None:
        self.seqs += [report.seq for report in reports]


async def _kept_exchange(nc, record, pool) -> LinkExchange:
    exchange = LinkExchange(SUBJECT, None, Metrics(), record, pool)
    exchange.kept_subject = f"{SUBJECT}.kept"
    await exchange.start(nc)
    await exchange.keep(nc, STREAM, retention_s=60.0)
    return exchange


async def test_a_replay_at_the_window_close_hears_what_was_kept_after_the_change(url: str) -> None:
    pool = ThreadPoolExecutor(1)
    nc_owner, nc_former = await nats.connect(url), await nats.connect(url)
    heard = _Heard()
    owner = await _kept_exchange(nc_owner, heard, pool)  # its replay at the change: nothing yet
    former = await _kept_exchange(nc_former, _Heard(), pool)
    try:
        # The former owner maps what it took before the change, and keeps that evidence now.
        await former.publish(encode_batch(former.sender, [_report(1), _report(2)]))
        await nc_former.flush()
        await asyncio.sleep(1.0)
        assert heard.seqs == []  # kept evidence is heard by no bridge live
        closes = time.monotonic() + 1.0
        owner.replay_at(closes)
        owner.replay_at(closes)  # the same change heard twice (a foreign view): one replay
        assert len(owner._catch_ups) == 1
        await asyncio.sleep(0.5)
        assert heard.seqs == []  # not before its time
        await wait_until(lambda: sorted(heard.seqs) == [1, 2], 10, "the kept evidence replayed at the window's close")
        assert owner._catch_ups == {}
    finally:
        for exchange in (owner, former):
            await exchange.stop()
        for nc in (nc_owner, nc_former):
            await nc.close()
        pool.shutdown(wait=True)


async def test_replays_waiting_for_their_time_are_bounded_and_cancelled_on_stop(url: str, monkeypatch) -> None:
    import nats_otel.bridge.exchange as exchange_module

    monkeypatch.setattr(exchange_module, "_CATCH_UPS", 3)
    pool = ThreadPoolExecutor(1)
    nc = await nats.connect(url)
    heard = _Heard()
    owner = await _kept_exchange(nc, heard, pool)
    try:
        now = time.monotonic()
        for k in range(10):  # a storm of changes, a second apart
            owner.replay_at(now + 30 + k)
        assert len(owner._catch_ups) == 3
    finally:
        await owner.stop()
        await nc.close()
        pool.shutdown(wait=True)
    assert owner._catch_ups == {}
