"""Fixtures shared by the bridge's tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from nats_otel.devkit.processes import start_topology
from nats_otel.devkit.topology import single_server


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    """A client URL (user a) of one real nats-server shared by the tests of a module (a module
    that needs another server, e.g. with JetStream, defines its own `url`)."""
    with start_topology(single_server()) as running:
        yield running.client_url("n1", "a")
