"""Real nats-server topologies (nats_otel.devkit.topology, started by devkit.processes),
checked from the outside.

The monitoring endpoints are read here with plain urllib (not the module's own
readiness code), and trace events are received the way the bridge will receive them.
"""

from __future__ import annotations

import json
import os
import secrets
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import nats
import pytest

from nats_otel.devkit.processes import (
    RunningTopology,
    TopologyError,
    find_nats_server,
    start_topology,
    wait_for_interest,
)
from nats_otel.devkit.topology import (
    ServerSpec,
    Topology,
    cluster,
    demo_topology,
    full_topology,
    single_server,
)

pytestmark = pytest.mark.integration

_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def get(topo: RunningTopology, server: str, endpoint: str) -> dict:
    with _NO_PROXY.open(f"{topo.monitor_url(server)}/{endpoint}", timeout=5) as resp:
        return json.load(resp)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def traceparent() -> tuple[str, str]:
    trace_id = secrets.token_hex(16)
    return trace_id, f"00-{trace_id}-{secrets.token_hex(8)}-01"


async def collect_traces(sub, trace_id: str, expected: set[str], timeout: float = 5.0,
                         grace: float = 0.3) -> dict[str, dict]:
    """Trace messages for ``trace_id`` by server name: until ``expected`` is covered,
    then ``grace`` seconds more so an unexpected extra server would be caught too."""
    found: dict[str, dict] = {}
    deadline = time.monotonic() + timeout
    settle: float | None = None
    while True:
        now = time.monotonic()
        if settle is None and expected <= set(found):
            settle = now + grace
        end = settle if settle is not None else deadline
        if now >= end:
            return found
        try:
            msg = await sub.next_msg(timeout=end - now)
        except TimeoutError:
            return found
        event = json.loads(msg.data)
        header = {k.lower(): v for k, v in event["request"]["header"].items()}
        if trace_id in header.get("traceparent", [""])[0]:
            name = event["server"]["name"]
            assert name not in found, f"two trace messages from {name}"
            found[name] = event


# --------------------------------------------------------------------------- basics


def test_find_nats_server() -> None:
    path = find_nats_server()
    assert os.access(path, os.X_OK) and Path(path).name == "nats-server"


def test_validate_rejects_single_jetstream_server_in_cluster(tmp_path: Path) -> None:
    spec = Topology(servers=cluster("east", 3, jetstream=(3,)))
    with pytest.raises(ValueError, match="at least 2 servers"):
        start_topology(spec, tmp_path)
    assert not list(tmp_path.glob("*.log"))  # refused before anything started


def test_failed_start_stops_every_started_process(tmp_path: Path) -> None:
    good, broken = cluster("east", 2)
    broken = ServerSpec(name=broken.name, cluster=broken.cluster,
                        extra_config="this is { not a valid config")
    with pytest.raises(TopologyError) as err:
        start_topology(Topology(servers=(good, broken)), tmp_path, timeout=10)
    assert err.value.server == "east-2"
    assert err.value.log_tail  # the server's own complaint is part of the message
    assert len(err.value.pids) == 2
    assert not any(alive(pid) for pid in err.value.pids)


async def test_single_server_local_trace(tmp_path: Path) -> None:
    with start_topology(single_server(), tmp_path) as topo:
        assert get(topo, "n1", "healthz") == {"status": "ok"}
        nc = await nats.connect(topo.client_url("n1", user="a"), name="app")
        traces = await nc.subscribe("trace.a")
        app = await nc.subscribe("orders.local")
        trace_id, tp = traceparent()
        await nc.publish("orders.local", b"hello", headers={"traceparent": tp})
        assert (await app.next_msg(timeout=2)).data == b"hello"
        found = await collect_traces(traces, trace_id, {"n1"})
        await nc.close()
        pids = list(topo.pids.values())

    assert set(found) == {"n1"}
    types = [e["type"] for e in found["n1"]["events"]]
    assert types == ["in", "eg"]
    assert found["n1"]["events"][1]["kind"] == 0  # CLIENT egress: the local subscriber
    assert pids and not any(alive(pid) for pid in pids)
    assert topo.pids == {}


async def test_single_server_default_accounts_and_jetstream(tmp_path: Path) -> None:
    """The corpus accounts work as configured: mapping, stream import, JetStream."""
    with start_topology(single_server(jetstream=True), tmp_path) as topo:
        assert get(topo, "n1", "jsz")["config"]["store_dir"].startswith(str(tmp_path))
        a = await nats.connect(topo.client_url("n1", user="a"), name="app-a")
        b = await nats.connect(topo.client_url("n1", user="b"), name="app-b")
        traces = await a.subscribe("trace.a")
        mapped = await a.subscribe("s07.mapped.x")
        imported = await b.subscribe("froma.events.x")
        js = a.jetstream()
        await js.add_stream(name="ORDERS", subjects=["orders.>"])
        await a.flush()
        await b.flush()

        checks = {  # subject published in A -> event types on n1
            "s07.orig.x": ["in", "sm", "eg"],
            "events.x": ["in", "se", "eg"],
            "orders.1": ["in", "js"],
        }
        found = {}
        for subject in checks:
            trace_id, tp = traceparent()
            await a.publish(subject, b"x", headers={"traceparent": tp})
            found[subject] = (await collect_traces(traces, trace_id, {"n1"}, grace=0.05))["n1"]
        assert (await mapped.next_msg(timeout=2)).subject == "s07.mapped.x"
        assert (await imported.next_msg(timeout=2)).subject == "froma.events.x"
        assert (await js.stream_info("ORDERS")).state.messages == 1
        await a.close()
        await b.close()

    for subject, types in checks.items():
        assert [e["type"] for e in found[subject]["events"]] == types, subject
    assert found["orders.1"]["events"][1]["stream"] == "ORDERS"


# --------------------------------------------------------------------------- full topology


@pytest.fixture(scope="module")
def full(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningTopology]:
    topo = start_topology(full_topology(), tmp_path_factory.mktemp("full"))
    pids = list(topo.pids.values())
    try:
        yield topo
    finally:
        topo.stop()
        assert not any(alive(pid) for pid in pids), "a nats-server outlived stop()"


def test_full_topology_formed(full: RunningTopology) -> None:
    assert full.names == ["east-1", "east-2", "east-3", "west-1", "west-2", "leaf-1"]
    # Hubs first: the leafnode's first attempt found its hub listening (a refused first
    # attempt costs a reconnect delay; seconds are no measure of that, attempts are).
    leaf_log = full.servers["leaf-1"].log_path.read_text(errors="replace")
    assert "Leafnode connection created" in leaf_log
    assert "Error trying to connect as leafnode" not in leaf_log, leaf_log
    for name in full.names:
        assert get(full, name, "varz")["server_name"] == name
        assert get(full, name, "healthz") == {"status": "ok"}
    for name, peers in {"east-1": {"east-2", "east-3"}, "east-3": {"east-1", "east-2"},
                        "west-1": {"west-2"}, "west-2": {"west-1"}}.items():
        assert {r["remote_name"] for r in get(full, name, "routez")["routes"]} == peers
    for name in ("east-1", "east-2", "east-3"):
        assert set(get(full, name, "gatewayz")["outbound_gateways"]) == {"west"}
    for name in ("west-1", "west-2"):
        assert set(get(full, name, "gatewayz")["outbound_gateways"]) == {"east"}
    (leaf,) = get(full, "leaf-1", "leafz")["leafs"]
    assert (leaf["name"], leaf["account"]) == ("east-1", "A")
    assert [lf["name"] for lf in get(full, "east-1", "leafz")["leafs"]] == ["leaf-1"]
    assert get(full, "east-2", "jsz")["meta_cluster"]["leader"] in {"east-2", "east-3"}


@pytest.fixture
async def clients(full: RunningTopology) -> AsyncIterator[dict]:
    """User ``a`` connected to every server; ``bridge`` subscribed to trace.a on east-1."""
    urls = full.client_urls("a")
    conns = {n: await nats.connect(url, name=f"app-{n}") for n, url in urls.items()}
    bridge = await nats.connect(full.client_url("east-1", "a"), name="bridge")
    traces = await bridge.subscribe("trace.a")
    # Every server must know of the bridge's interest before it emits trace events.
    for nc in conns.values():
        await wait_for_interest(nc, bridge)
    yield {"conns": conns, "traces": traces}
    for nc in (*conns.values(), bridge):
        await nc.close()


def gateway_path(full: RunningTopology, origin: str) -> set[str]:
    """Servers a message from east ``origin`` crosses to reach west-2 (runs differ)."""
    target = full.gateway_target(origin, "west")
    assert target in {"west-1", "west-2"}
    return {target, "west-2"}


@pytest.mark.parametrize(
    ("origin", "dest", "path"),
    [
        ("east-1", "west-2", lambda full: {"east-1"} | gateway_path(full, "east-1")),
        ("east-2", "leaf-1", lambda full: {"east-2", "east-1", "leaf-1"}),
        ("leaf-1", "west-2", lambda full: {"leaf-1", "east-1"} | gateway_path(full, "east-1")),
    ],
    ids=["gateway", "route+leaf", "leaf+gateway"],
)
async def test_trace_events_from_every_server_on_the_path(
    full: RunningTopology, clients: dict, origin: str, dest: str, path
) -> None:
    conns, traces = clients["conns"], clients["traces"]
    subject = f"orders.{origin}.{dest}"
    app = await conns[dest].subscribe(subject)
    await wait_for_interest(conns[origin], conns[dest])
    expected = path(full)

    trace_id, tp = traceparent()
    await conns[origin].publish(subject, b"payload", headers={"traceparent": tp})
    assert (await app.next_msg(timeout=3)).data == b"payload"
    found = await collect_traces(traces, trace_id, expected)

    assert set(found) == expected
    hops = {n: e["request"]["header"].get("Nats-Trace-Hop") for n, e in found.items()}
    assert hops[origin] is None
    assert all(hops[n] for n in expected - {origin})
    # The server holding the subscriber delivered to a client.
    assert any(ev["type"] == "eg" and ev["kind"] == 0 for ev in found[dest]["events"])
    await app.unsubscribe()


# --------------------------------------------------------------------------- faults


def test_kill_and_restart_rejoin(tmp_path: Path) -> None:
    with start_topology(demo_topology(), tmp_path) as topo:
        old = topo.pids["east-1"]
        topo.kill("east-1")
        assert not alive(old) and "east-1" not in topo.pids
        topo.wait_ready(timeout=5)  # the rest still counts as formed without east-1
        topo.restart("east-1")
        assert topo.pids["east-1"] != old
        routes = get(topo, "east-1", "routez")["routes"]
        assert {r["remote_name"] for r in routes} == {"east-2", "east-3"}
        assert [lf["name"] for lf in get(topo, "leaf-1", "leafz")["leafs"]] == ["east-1"]
        pids = list(topo.pids.values())
    assert len(pids) == 4 and not any(alive(pid) for pid in pids)
