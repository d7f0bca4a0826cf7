"""`nats-otel emulate`: it publishes what it says, and a bridge on the emulated topology
receives trace messages from every server of it (routes, gateway, leafnode)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from nats_otel.bridge.settings import load_settings
from nats_otel.devkit.emulate import EmulationOptions, default_user, emulate, emulation_topology
from nats_otel.devkit.processes import start_topology
from nats_otel.devkit.receivers import OTLPGrpcReceiver
from tests.bridge.bridge_helpers import archived, spans_by_trace, start_bridge, stop_bridge, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def test_topology_shapes() -> None:
    assert [s.name for s in emulation_topology(1).servers] == ["n1"]
    four = emulation_topology(4)
    assert [s.name for s in four.servers] == ["east-1", "east-2", "west-1", "leaf-1"]
    assert four.server("east-1").cluster == four.server("east-2").cluster == "east"
    assert four.server("west-1").gateway and four.server("leaf-1").leaf_remotes
    with pytest.raises(ValueError):
        emulation_topology(0)


async def test_bridge_receives_from_every_emulated_server(tmp_path: Path) -> None:
    user, password = default_user()
    with start_topology(emulation_topology(4), tmp_path / "nats") as topo, \
            OTLPGrpcReceiver() as rx:
        names = list(topo.servers)
        settings = load_settings(overrides={
            "sources": [{"name": "a", "urls": [topo.client_url("east-1", user)], "subjects": ["trace.a"]}],
            "otlp": {"endpoint": rx.endpoint}, "archive": str(tmp_path / "archive.jsonl"),
            "batch": {"max_delay": 0.05},
        }, env={})
        bridge, task = await start_bridge(settings)
        try:
            options = EmulationOptions(
                urls=[topo.client_url(n, user, password) for n in names], server_names=names,
                connections=8, rate=200, duration=1.5, published_out=tmp_path / "published.txt")
            report = await emulate(options)
            # It publishes what it says: the count asked for, each traceparent once, all delivered.
            assert report.published == 300
            assert report.received == report.published
            lines = (tmp_path / "published.txt").read_text().splitlines()
            assert len(lines) == len(set(lines)) == report.published
            assert sum(report.by_server.values()) == report.published and set(report.by_server) == set(names)
            published = {line.split("-")[1] for line in lines}
            # Every publish crosses to the next connection's server: each trace has >= 2 messages.
            await wait_until(lambda: published <= {t for t, _ in archived(tmp_path / "archive.jsonl")},
                             30, "a trace message for every published traceparent")
        finally:
            assert await stop_bridge(bridge, task) == 0
        seen = archived(tmp_path / "archive.jsonl")
        assert {server for trace, server in seen if trace in published} == set(names)
        by_trace = spans_by_trace(rx.requests)
        assert published <= set(by_trace)


def test_cli_reports_and_writes_traceparents(tmp_path: Path) -> None:
    out = tmp_path / "tp.txt"
    proc = subprocess.run(
        [sys.executable, "-m", "nats_otel.cli", "emulate", "--servers", "2", "--connections", "3",
         "--rate", "100", "--duration", "1", "--published-out", str(out), "--workdir", str(tmp_path / "w")],
        capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0, proc.stderr
    first, last = (json.loads(line) for line in proc.stdout.strip().splitlines())
    assert set(first["servers"]) == {"east-1", "leaf-1"}
    assert last["published"] == 100 == len(out.read_text().splitlines())
    assert last["received"] == 100
