"""Hop links where users deploy them (issue 29's scenario, bench/hop_links.py, made small):
a routed cluster of three servers plus a leafnode, three bridges each on its own server in
one queue group (the sidecar layout), an independent subscriber archiving every trace
message. The truth comes from the archive by order per connection (`devkit.hop_truth`),
never from the linker; every downstream server span must hang under its true upstream
egress or be left unlinked, never under another message's."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from pathlib import Path

import pytest

from tests.bridge.bridge_helpers import load_bench

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]



@pytest.fixture(scope="module")
def hop_links():
    return load_bench("hop_links")


@pytest.fixture(scope="module")
def bridge_process(hop_links):
    """bench/bridge_process.py as hop_links imported it (its `Bridge` reads `free_ports` there)."""
    return sys.modules[hop_links.Bridge.__module__]


def _run(hop_links, tmp_path: Path, **options):
    args = argparse.Namespace(bridges=3, mode="per_message", messages=300, batch_size=50, gap_ms=2.0, seed=29,
                              workers=1, unnumbered=False, batch_gap_ms=20.0, warm_s=1.0)
    vars(args).update(options)
    return asyncio.run(hop_links.live_run(args, tmp_path))


def test_sidecars_link_a_traceparent_per_message_as_one_bridge(hop_links, tmp_path):
    row, truth, _ = _run(hop_links, tmp_path)
    assert not truth.problems and not row.notes, (truth.problems, row.notes)
    counts = row.result.counts
    # 300 messages, 3 hops each; where any went unlinked says why (the run's start, a stretch, its end)
    assert counts["right"] == row.result.hops == 900, (counts, row.result.describe_unlinked())
    # The network view, summed over the bridges, counts each crossing once (as one bridge does):
    # only the bridge that maps a downstream report records its hop.
    crossings = sum(v for k, v in row.metrics.items() if k.startswith("nats_otel_hop_latency_seconds_count"))
    assert crossings == 900, crossings


@pytest.mark.parametrize("mode", ["batch", "adhoc"])
def test_sidecars_never_link_a_span_under_another_message(hop_links, tmp_path, mode):
    """Messages alike but for their time (no header of their own), paced 2 ms apart: order
    decides where the sidecars prove their streams whole, `ambiguous` elsewhere, never
    another message's egress; and `convert` of their archive with a tenth lost, none wrong."""
    row, truth, archive = _run(hop_links, tmp_path, mode=mode, unnumbered=True)
    assert not truth.problems and not row.notes, (truth.problems, row.notes)
    counts = row.result.counts
    assert counts["wrong"] == 0 and counts["missing"] == 0, counts
    converted = hop_links.convert_row(truth, archive, 0.1, 29, tmp_path)
    assert converted.result.counts["wrong"] == 0, converted.result.counts


@pytest.mark.parametrize("bridges", [1, 3])
@pytest.mark.parametrize("mode", ["back_to_back", "adhoc_back_to_back"])
def test_alike_bursts_link_whole_by_order(hop_links, tmp_path, mode, bridges):
    """Issue 36's scenario, made small: bursts of 50 alike messages sent back to back, paced
    100 ms apart, under one traceparent or ad hoc to one fixed destination. One bridge, or
    three sidecars that share what their streams prove whole (`bridge.wholeness`), lost
    nothing: every hop linked by order, none wrong."""
    row, truth, _ = _run(hop_links, tmp_path, bridges=bridges, mode=mode, unnumbered=True, batch_gap_ms=100.0)
    assert not truth.problems and not row.notes, (truth.problems, row.notes)
    counts = row.result.counts
    assert counts["wrong"] == 0 and counts["missing"] == 0, counts
    assert counts["right"] >= 0.99 * row.result.hops, counts


@pytest.mark.parametrize("mode", ["back_to_back", "adhoc_back_to_back"])
def test_a_header_per_message_links_every_hop_exactly(hop_links, tmp_path, mode):
    """Each message with a header of its own (`Hop-Check-Seq`, as an application's id or
    `Nats-Msg-Id`): back to back under one context, or ad hoc to one fixed destination, every
    hop is linked, by the sidecars live and by `convert` of their archive with a tenth lost."""
    row, truth, archive = _run(hop_links, tmp_path, mode=mode)
    assert not truth.problems and not row.notes, (truth.problems, row.notes)
    counts = row.result.counts
    assert counts["right"] == row.result.hops == 900, counts
    converted = hop_links.convert_row(truth, archive, 0.1, 29, tmp_path)
    linkable = converted.result.hops
    assert converted.result.counts["wrong"] == 0 and converted.result.counts["right"] == linkable, \
        converted.result.counts


def test_sidecars_with_worker_processes_link_as_without(hop_links, tmp_path):
    """`--workers 2` in each sidecar: every worker records its traces' evidence from the
    other bridges and its siblings' event numbers (the ledger), and shares its own: never a
    wrong link, and evidence goes out."""
    row, truth, _ = _run(hop_links, tmp_path, mode="batch", workers=2)
    assert not truth.problems and not row.notes, (truth.problems, row.notes)
    counts = row.result.counts
    assert counts["wrong"] == 0 and counts["missing"] == 0, counts
    published = row.metrics["nats_otel_link_evidence_total{result=\"published\"}"]
    assert published > 0, row.metrics


@pytest.mark.parametrize("taker", ["silent", "nats-server"])
def test_a_bridge_whose_metrics_port_was_taken_meanwhile_is_started_again_on_another(bridge_process, url, tmp_path,
                                                                                      monkeypatch, taker):
    """The harness picks a free port, then the bridge binds it a second later: in between,
    another process of the parallel tests may take it (it failed a run of the membership
    test so: "Address already in use"; a run of the release matrix when a nats-server took
    it, whose INFO line answered the harness's /readyz). The harness then starts it again
    on another port."""
    import socket
    import threading

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    busy = taken.getsockname()[1]

    def speak_nats() -> None:  # what a nats-server says to whoever connects
        while True:
            try:
                conn, _ = taken.accept()
            except OSError:  # closed: the test is over
                return
            with conn:
                conn.sendall(b'INFO {"server_id":"X","version":"2.11.11","proto":1}\r\n')

    if taker == "nats-server":
        threading.Thread(target=speak_nats, daemon=True).start()
    real = bridge_process.free_ports
    ports = iter([[busy]])
    monkeypatch.setattr(bridge_process, "free_ports", lambda count: next(ports, None) or real(count))
    bridge = bridge_process.Bridge(tmp_path, "n1", url, ["trace.port"], None)
    try:
        bridge.wait_ready()
        assert bridge.port != busy and bridge.get("/readyz")[0] == 200
        assert "relaunched on" in bridge.log_tail() and "Address already in use" in bridge.log_tail()
    finally:
        assert bridge.stop() == 0
        taken.close()


def _every_hop_linked_after(hop_links, tmp_path, change) -> None:
    """A traceparent-per-message run whose group `change`d (a test's `before_traffic`) and
    came back together: no note, 900 of 900 hops right. `change` returns whether what it
    waited for happened and what to say if not; this adds whether all are members again."""

    async def before_traffic(bridges, topo):
        happened, otherwise = await change(bridges, topo)
        return ([] if happened else [otherwise]) + await hop_links.wait_members(bridges, 30)

    row, truth, _ = _run(hop_links, tmp_path, before_traffic=before_traffic)
    assert not truth.problems and not row.notes, (truth.problems, row.notes)
    counts = row.result.counts
    assert counts["right"] == row.result.hops == 900, (counts, row.result.describe_unlinked())


def test_a_sidecar_stalled_past_the_silence_is_a_member_again(hop_links, tmp_path):
    """One of the three stopped (SIGSTOP: a long GC pause, a throttled container, a frozen
    VM) for longer than the peers' `MEMBER_SILENCE_S`: they take it off the ring; heard again,
    it is a member again (before, they ignored it for ten minutes while it owned by its own
    view: the hops across them unlinked). It, waking, does not count its own stall as its
    peers' silence: its view never changed. Then every hop is linked, as before the stall."""
    from nats_otel.bridge.routing import MEMBER_SILENCE_S

    async def stall(bridges, topo):
        stalled, peers = bridges[1], [bridges[0], bridges[2]]

        def views() -> float:
            return stalled.metrics()["nats_otel_route_views_total"]

        before = views()
        os.kill(stalled.proc.pid, signal.SIGSTOP)
        try:
            dropped = await hop_links.wait_until(lambda: all(p.members() == 2 for p in peers),
                                                 MEMBER_SILENCE_S + 10, 0.2)
        finally:
            os.kill(stalled.proc.pid, signal.SIGCONT)
        await hop_links.wait_members(bridges, 30)
        return dropped and views() == before, f"dropped by its peers {dropped}; its views {before} -> {views()}"

    _every_hop_linked_after(hop_links, tmp_path, stall)


def test_a_sidecar_whose_server_restarted_links_as_before(hop_links, tmp_path):
    """The server of one of the three killed (a crash, or a rolling upgrade's restart), then
    started again: its bridge reconnects to another server of the cluster (nats-py learns
    them from the servers), its peers hear it again if they had dropped it, and every hop of
    the traffic after is linked as before."""

    async def restart(bridges, topo):
        cut = bridges[2]
        assert cut.server == "east-3"

        def reconnects() -> float:
            return cut.metrics().get('nats_otel_nats_reconnects_total{source="default"}', 0.0)

        await asyncio.to_thread(topo.kill, "east-3")
        try:
            reconnected = await hop_links.wait_until(lambda: reconnects() >= 1, 30, 0.2)
        finally:
            await asyncio.to_thread(topo.restart, "east-3")
        return reconnected, "the cut-off bridge never reconnected"

    _every_hop_linked_after(hop_links, tmp_path, restart)
