"""Issue 46, item 4: several JetStream bridges on one durable own their traces (`js_routing`).

The demo topology (east-1..3, JetStream on east-2 and east-3, leaf-1 a leafnode of east-1),
account A traced into a stream, three bridges in JetStream mode on one durable, each on its
own server: every message crosses four servers, so its three hops' reports are fetched by
random bridges. Each bridge forwards the reports of the traces it does not own to their
owner and acks them only on the owner's answer; no bridge hears another's evidence live.
The truth comes from the stream's own copy of every trace message (`devkit.hop_truth`).
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
from pathlib import Path

import pytest

from nats_otel.devkit.hop_score import score
from nats_otel.devkit.hop_traffic import TrafficOptions, run_traffic
from nats_otel.devkit.hop_truth import compute_truth
from nats_otel.devkit.processes import start_topology
from nats_otel.devkit.receivers import OTLPGrpcReceiver
from nats_otel.devkit.server_config import free_ports
from nats_otel.devkit.topology import demo_topology
from tests.bridge.bridge_helpers import metric, scrape, terminate, wait_until
from tests.bridge.test_jetstream_links import _bridge, _ready, _server_spans, _setup, _stream_raws

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

MESSAGES = 120
# Short waits, so that a killed bridge's messages come back within the test: an answer is
# awaited half the ack wait, JetStream redelivers after it.
SETTINGS = {
    "jetstream": {"stream": "TRACES", "durable": "owners", "create_stream": True, "ack_wait": 5.0,
                  "nak_delay_initial": 0.2, "nak_delay_max": 1.0, "fetch_batch": 20},
    "otlp": {"timeout": 1.0, "retry_max_elapsed": 0.5, "retry_initial_backoff": 0.05, "retry_max_backoff": 0.2},
}


class _Bridges:
    """JetStream bridges on one durable, bridge i on `servers[i]`; the first `start` started."""

    def __init__(self, tmp_path: Path, topo, servers: tuple[str, ...], endpoint: str, start: int | None = None) -> None:
        self.ports = free_ports(len(servers))  # at once: one at a time may give one port twice
        self.procs: list[subprocess.Popen] = []
        self._made = [(tmp_path / f"bridge{i}", topo.client_url(server, "a")) for i, server in enumerate(servers)]
        self._endpoint = endpoint
        for i in range(len(servers) if start is None else start):
            self.start(i)

    def start(self, i: int) -> None:
        home, url = self._made[i]
        home.mkdir()
        config, _, log = _setup(home, url, SETTINGS)
        self.procs.append(_bridge(config, self.ports[i], log, self._endpoint))

    async def ready(self) -> None:
        for port in self.ports[:len(self.procs)]:
            await wait_until(lambda port=port: _ready(port), 60, "bridge ready")

    def total(self, name: str, **labels: str) -> float:
        """A counter summed over the bridges still running."""
        return sum(metric(scrape(port)[1], name, **labels)
                   for port, proc in zip(self.ports, self.procs, strict=False) if proc.poll() is None)

    def stop(self) -> list[int | None]:
        for proc in self.procs:
            terminate(proc)
        return [proc.returncode for proc in self.procs]


async def _traffic_and_truth(topo, options: TrafficOptions, during=None):
    """Run the traffic (`during`: a coroutine run beside it), then the truth from the stream."""
    urls = {name: topo.client_url(name, "a") for name in topo.names}
    traffic = asyncio.create_task(run_traffic(urls["east-2"], urls, options, settle_s=20))
    if during is not None:
        await during
    report = await traffic
    assert report.complete, report.received
    raws = await _stream_raws(topo.client_url("east-1", "a"), "TRACES")
    assert len(raws) == 4 * options.messages  # a report per server per message
    truth = compute_truth(raws)
    assert not truth.problems
    return truth


async def test_bridges_on_one_durable_own_their_traces(tmp_path: Path) -> None:
    """Every hop linked right, as one bridge links them; the reports of other bridges' traces
    forwarded and answered, and no evidence heard from a peer (what scales: each bridge
    handles its own share, not everyone's evidence)."""
    with start_topology(demo_topology(), tmp_path / "nats") as topo, OTLPGrpcReceiver() as rx:
        bridges = _Bridges(tmp_path, topo, ("east-1", "east-2", "east-3"), rx.endpoint)
        try:
            await bridges.ready()
            truth = await _traffic_and_truth(topo, TrafficOptions(mode="per_message", messages=MESSAGES,
                                                                  gap_ms=5.0, seed=46))
            await wait_until(lambda: score(truth, _server_spans(rx)).counts["missing"] == 0, 60,
                             "every server span exported")
            result = score(truth, _server_spans(rx))
            assert result.hops == 3 * MESSAGES and result.counts["right"] == 3 * MESSAGES, result.counts
            await wait_until(lambda: bridges.total("nats_otel_routed_total", result="answered")
                             == bridges.total("nats_otel_routed_total", result="forwarded"), 30,
                             "every forward answered")
            forwarded = bridges.total("nats_otel_routed_total", result="forwarded")
            # Two of three reports land away from their owner, whichever bridge owns the trace.
            assert forwarded >= 0.4 * 4 * MESSAGES, forwarded
            assert bridges.total("nats_otel_routed_total", result="received") == forwarded
            assert bridges.total("nats_otel_link_evidence_total", result="received") == 0  # none live
            assert bridges.total("nats_otel_routed_total", result="unanswered") == 0
            # Acked once each (at least once: a redelivery may add; nothing else settles).
            acked = bridges.total("nats_otel_jetstream_acks_total", kind="ack")
            assert acked >= 4 * MESSAGES, acked
        finally:
            codes = bridges.stop()
        assert codes == [0, 0, 0]


@pytest.mark.parametrize("victim", [0, 1])
async def test_an_owner_sigkilled_mid_traffic_loses_no_span(tmp_path: Path, victim: int) -> None:
    """One of the three is SIGKILLed while the traffic runs: what it fetched is redelivered by
    JetStream, what the others forwarded to it is naked by them (it fell silent) or rerouted
    (NATS's 503): every server span is exported, no link is wrong."""
    with start_topology(demo_topology(), tmp_path / "nats") as topo, OTLPGrpcReceiver() as rx:
        bridges = _Bridges(tmp_path, topo, ("east-1", "east-2", "east-3"), rx.endpoint)
        try:
            await bridges.ready()

            async def kill() -> None:
                await asyncio.sleep(1.5)
                bridges.procs[victim].send_signal(signal.SIGKILL)
                bridges.procs[victim].wait(10)

            truth = await _traffic_and_truth(topo, TrafficOptions(mode="per_message", messages=MESSAGES,
                                                                  gap_ms=25.0, seed=460 + victim), kill())
            await wait_until(lambda: score(truth, _server_spans(rx)).counts["missing"] == 0, 90,
                             "every server span exported",
                             detail=lambda: score(truth, _server_spans(rx)).counts)
            result = score(truth, _server_spans(rx))
            assert result.hops == 3 * MESSAGES and result.counts["wrong"] == 0, result.counts
            assert result.conflicting_duplicates == 0
            assert bridges.total("nats_otel_routed_total", result="forwarded") > 0
        finally:
            codes = bridges.stop()
        assert codes[victim] == -signal.SIGKILL and [c for i, c in enumerate(codes) if i != victim] == [0, 0]


async def test_membership_changes_mid_traffic_lose_no_span(tmp_path: Path) -> None:
    """Issue 46's membership changes, in JetStream mode: of four bridges, one is SIGTERMed (it
    says goodbye, forwards what it still fetches, drains: exit 0), then another SIGKILLed,
    then a new one starts, all while the traffic runs. Every server span is exported (at
    least once), no link is wrong."""
    with start_topology(demo_topology(), tmp_path / "nats") as topo, OTLPGrpcReceiver() as rx:
        bridges = _Bridges(tmp_path, topo, ("east-1", "east-2", "east-3", "east-1", "east-2"), rx.endpoint,
                           start=4)
        try:
            await bridges.ready()

            async def churn() -> None:
                await asyncio.sleep(1.0)
                bridges.procs[0].send_signal(signal.SIGTERM)
                await asyncio.sleep(1.0)
                bridges.procs[1].send_signal(signal.SIGKILL)
                await asyncio.sleep(0.5)
                bridges.start(4)
                bridges.procs[0].wait(30)
                bridges.procs[1].wait(10)

            truth = await _traffic_and_truth(topo, TrafficOptions(mode="per_message", messages=2 * MESSAGES,
                                                                  gap_ms=20.0, seed=4646), churn())
            await wait_until(lambda: score(truth, _server_spans(rx)).counts["missing"] == 0, 90,
                             "every server span exported", detail=lambda: score(truth, _server_spans(rx)).counts)
            result = score(truth, _server_spans(rx))
            assert result.hops == 3 * 2 * MESSAGES and result.counts["wrong"] == 0, result.counts
            assert result.conflicting_duplicates == 0, _conflicts(truth, rx, bridges)
        finally:
            codes = bridges.stop()
        assert codes[0] == 0 and codes[1] == -signal.SIGKILL and codes[2:] == [0, 0, 0], codes


def _conflicts(truth, rx: OTLPGrpcReceiver, bridges: _Bridges) -> str:
    """What a failure needs to say which way a span came twice (issue: this test failed once
    in CI with two spans exported linked and unmatched, never here): each such hop, its
    copies, when it arrived, and the surviving bridges' counters of late answers, holds and
    evidence."""
    copies: dict[bytes, set[tuple[bytes, str]]] = {}
    for span in _server_spans(rx):
        copies.setdefault(span.span_id, set()).add((span.parent_span_id, span.link))
    by_span_id = {hop.downstream_span_id: hop for hop in truth.hops.values()}
    first = min(hop.arrival_ts_ns for hop in truth.hops.values())
    lines = []
    for span_id, seen in copies.items():
        hop = by_span_id.get(span_id)
        if len(seen) > 1 and hop is not None:
            kinds = sorted("right" if parent == hop.parent_span_id else (link or "other") for parent, link in seen)
            at_ms = (hop.arrival_ts_ns - first) / 1e6
            lines.append(f"hop #{hop.index} on {hop.link.label()} arrived at +{at_ms:.0f} ms: {kinds}")
    counters = {f"{name}{{{value}}}": bridges.total(name, **{label: value})
                for name, label, values in (("nats_otel_routed_total", "result", ("forwarded", "received", "answered",
                                                                                  "unanswered", "rerouted", "refused")),
                                            ("nats_otel_link_evidence_total", "result", ("received", "replayed")))
                for value in values}
    counters["nats_otel_link_held_total"] = bridges.total("nats_otel_link_held_total")
    return "\n".join([*lines, f"the running bridges' counters: {counters}"])
