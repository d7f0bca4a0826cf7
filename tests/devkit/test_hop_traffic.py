"""The hop-link traffic: its plan per mode (pure), and one short run over real servers."""

from __future__ import annotations

import pytest

from nats_otel.core.ids import parse_traceparent
from nats_otel.devkit.hop_traffic import TrafficOptions, plan_messages, run_traffic
from nats_otel.devkit.hop_truth import SEQUENCE_HEADER
from nats_otel.devkit.processes import start_topology
from nats_otel.devkit.topology import LEAF_ACCOUNTS, LeafRemote, ServerSpec, Topology, cluster


def test_plans_are_deterministic_given_the_seed():
    options = TrafficOptions(mode="per_message", messages=50, seed=7)
    assert plan_messages(options) == plan_messages(options)
    assert plan_messages(options) != plan_messages(TrafficOptions(mode="per_message", messages=50, seed=8))


def test_per_message_gives_every_message_its_own_sampled_context():
    plan = plan_messages(TrafficOptions(mode="per_message", messages=200, gap_ms=2))
    parents = [m.headers["traceparent"] for m in plan]
    assert len(set(parents)) == 200
    assert all(parse_traceparent(tp)[2] & 1 for tp in parents)  # sampled
    assert {len(m.payload) for m in plan} == {128}
    assert [m.pause_s for m in plan] == [0.0] + [0.002] * 199


@pytest.mark.parametrize(("mode", "inner_pause"), [("batch", 0.002), ("back_to_back", 0.0)])
def test_batches_share_one_context_and_one_size(mode, inner_pause):
    plan = plan_messages(TrafficOptions(mode=mode, messages=250, batch_size=100, gap_ms=2, batch_gap_ms=20))
    batches = [plan[i:i + 100] for i in range(0, 250, 100)]
    assert [len({m.headers["traceparent"] for m in b}) for b in batches] == [1, 1, 1]
    assert len({b[0].headers["traceparent"] for b in batches}) == 3
    assert {len(m.payload) for m in plan} == {128}
    assert [b[0].pause_s for b in batches] == [0.0, 0.02, 0.02]
    assert {m.pause_s for b in batches for m in b[1:]} == {inner_pause}


def test_adhoc_names_one_destination_and_no_traceparent():
    plan = plan_messages(TrafficOptions(mode="adhoc", messages=10, adhoc_dest="trace.adhoc.x"))
    assert all(m.headers["Nats-Trace-Dest"] == "trace.adhoc.x" and "traceparent" not in m.headers for m in plan)


def test_every_message_is_numbered_in_a_header_of_one_width():
    plan = plan_messages(TrafficOptions(mode="back_to_back", messages=120))
    numbers = [m.headers[SEQUENCE_HEADER] for m in plan]
    assert numbers == [f"{n:08d}" for n in range(120)]


def test_bad_options_are_refused():
    with pytest.raises(ValueError, match="mode"):
        TrafficOptions(mode="bursty")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="positive"):
        TrafficOptions(messages=0)


@pytest.mark.integration
@pytest.mark.timeout(60)
async def test_every_subscriber_gets_every_message(tmp_path):
    leaf = ServerSpec(name="leaf-1", accounts=LEAF_ACCOUNTS, leaf_remotes=(LeafRemote("east-1"),))
    spec = Topology(servers=(*cluster("east", 2, leaf_listen=(1,)), leaf), wait_jetstream=False)
    with start_topology(spec, tmp_path) as topo:
        urls = {name: topo.client_url(name, "a") for name in topo.names}
        report = await run_traffic(urls["east-2"], urls, TrafficOptions(mode="batch", messages=30, batch_size=10))
    assert report.published == 30 and report.contexts == 3
    assert report.complete, report.received
