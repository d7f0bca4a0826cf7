"""Which nats-server binary the devkit starts: `NATS_SERVER_BIN`, and the releases' cache
(`devkit.server_releases`), checked against the binaries' own `--version`."""

from __future__ import annotations

import pytest

from nats_otel.devkit.processes import NatsServerNotFound, find_nats_server, start_topology
from nats_otel.devkit.server_releases import RELEASES, cache_dir, install_hint, release_binary, server_version
from nats_otel.devkit.topology import single_server


def test_nats_server_bin_picks_the_binary(monkeypatch, tmp_path):
    fake = tmp_path / "nats-server"
    fake.write_text("#!/bin/sh\necho 'nats-server: v9.9.9'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("NATS_SERVER_BIN", str(fake))
    assert find_nats_server() == str(fake)
    assert server_version(fake) == "9.9.9"
    monkeypatch.setenv("NATS_SERVER_BIN", str(tmp_path / "absent"))
    with pytest.raises(NatsServerNotFound, match="NATS_SERVER_BIN"):
        find_nats_server()


def test_the_cache_layout_and_the_hint(monkeypatch, tmp_path):
    monkeypatch.setenv("NATS_OTEL_SERVER_CACHE", str(tmp_path))
    assert cache_dir() == tmp_path and release_binary("2.12.8") is None
    assert "server_releases install 2.12.8" in install_hint("2.12.8")
    binary = tmp_path / "2.12.8" / "bin" / "nats-server"
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    assert release_binary("2.12.8") == binary
    assert RELEASES[0] == "2.11.0" and list(RELEASES) == sorted(RELEASES, key=lambda v: tuple(map(int, v.split("."))))


@pytest.mark.integration
def test_a_topology_runs_on_the_release_it_is_given(monkeypatch, tmp_path):
    binary = release_binary("2.11.0")
    if binary is None:
        pytest.skip(install_hint("2.11.0"))
    monkeypatch.setenv("NATS_SERVER_BIN", str(binary))
    with start_topology(single_server(), tmp_path) as topo:
        assert topo.binary == str(binary)
        assert topo.monitor("n1", "varz")["version"] == "2.11.0"
    assert topo.pids == {}  # stopped by its pid
