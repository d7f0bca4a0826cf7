"""A load emulator for bridge deployments (after the Choria network emulator).

It either starts a real topology of K nats-servers (`emulation_topology`: a cluster with
routes, a second cluster behind a gateway, a leafnode) or drives an existing network
(`urls`), opens N client connections spread over the servers, gives each one a
subscription, and makes each connection publish to the *next* connection's subject with
a sampled W3C `traceparent`, so messages cross servers and every server reports trace
messages. The total rate is shared by the publishers, paced in small ticks.

It reports what it published (and what its own subscribers received), and can write every
traceparent it used to a file, one per line, so a bridge's output can be checked for loss.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nats_otel.bridge.sources.direct import flush_in_order
from nats_otel.devkit.processes import wait_for_interest
from nats_otel.devkit.topology import DEFAULT_PASSWORD, LEAF_ACCOUNTS, LeafRemote, ServerSpec, Topology, cluster

__all__ = ["EmulationOptions", "EmulationReport", "emulate", "emulation_topology"]

_TICK_S = 0.01


def emulation_topology(servers: int) -> Topology:
    """K servers: 1 standalone; 2 = a hub and a leafnode; 3 = two gateway clusters and a
    leafnode; K >= 4 = cluster `east` of K-2 (routes), `west-1` behind a gateway, `leaf-1`."""
    if servers < 1:
        raise ValueError("servers: at least 1")
    if servers == 1:
        return Topology(servers=(ServerSpec(name="n1"),))
    leaf = ServerSpec(name="leaf-1", accounts=LEAF_ACCOUNTS, leaf_remotes=(LeafRemote("east-1"),))
    if servers == 2:
        return Topology(servers=(ServerSpec(name="east-1", leaf_listen=True), leaf))
    east = cluster("east", servers - 2, gateway=True, leaf_listen=(1,))
    return Topology(servers=(*east, *cluster("west", 1, gateway=True), leaf))


@dataclass(slots=True)
class EmulationOptions:
    """What to emulate. `urls`: one per server to spread connections over (round robin)."""

    urls: list[str]
    connections: int = 10
    rate: float = 100.0
    duration: float = 10.0
    subject_prefix: str = "emulate"
    trace_dest: str | None = None  # ad-hoc Nats-Trace-Dest header, for accounts without msg_trace
    payload_size: int = 64
    published_out: Path | None = None
    server_names: list[str] | None = None  # label of each url in the report


@dataclass(slots=True)
class EmulationReport:
    """What was published: counts, per origin server, and the traceparents (if kept)."""

    published: int = 0
    received: int = 0
    duration: float = 0.0
    by_server: dict[str, int] = field(default_factory=dict)
    traceparents: list[str] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.published / self.duration if self.duration else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"published": self.published, "received": self.received, "duration_s": round(self.duration, 3),
                "rate": round(self.rate, 1), "by_server": self.by_server}


async def emulate(options: EmulationOptions, user: str | None = None, password: str | None = None,
                  keep_traceparents: bool = True) -> EmulationReport:
    """Connect, subscribe, publish at `rate` for `duration`, report. Closes what it opened."""
    import nats

    if options.connections < 1 or options.rate <= 0 or options.duration <= 0:
        raise ValueError("connections, rate and duration must be positive")
    labels = options.server_names or options.urls
    auth = {"user": user, "password": password} if user is not None else {}
    clients = []
    received = [0]
    try:
        for i in range(options.connections):
            url = options.urls[i % len(options.urls)]
            clients.append(await nats.connect(url, name=f"nats-otel-emulate-{i}", allow_reconnect=False, **auth))

        async def on_msg(_msg: Any) -> None:
            received[0] += 1

        for i, nc in enumerate(clients):
            await nc.subscribe(f"{options.subject_prefix}.{i}", cb=on_msg)
            await nc.flush()
        # Interest crosses routes, gateways and leafnodes asynchronously: wait for each pair.
        n = len(clients)
        for i, nc in enumerate(clients):
            await wait_for_interest(nc, clients[(i + 1) % n])
        report = await _publish(clients, options, labels, keep_traceparents or options.published_out is not None)
        for nc in clients:
            await flush_in_order(nc)  # nats-py's own flush may not wait for them (direct.py)
        deadline = time.monotonic() + 5
        while received[0] < report.published and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        report.received = received[0]
    finally:
        for nc in clients:
            if not nc.is_closed:
                await nc.close()
    if options.published_out is not None:
        options.published_out.write_text("".join(f"{tp}\n" for tp in report.traceparents))
    if not keep_traceparents:
        report.traceparents = []
    return report


async def _publish(clients: list[Any], options: EmulationOptions, labels: list[str], keep: bool) -> EmulationReport:
    """Every connection publishes to the next one's subject; the total rate is paced per tick."""
    n = len(clients)
    payload = os.urandom(options.payload_size // 2).hex().encode()[: options.payload_size]
    report = EmulationReport()
    by_server: Counter[str] = Counter()
    target = max(1, round(options.rate * options.duration))
    started = time.monotonic()
    sent = 0
    turn = 0
    while sent < target:
        elapsed = time.monotonic() - started
        due = min(int(elapsed * options.rate) + 1, target) - sent
        for _ in range(max(0, due)):
            i = turn % n
            turn += 1
            traceparent = f"00-{os.urandom(16).hex()}-{os.urandom(8).hex()}-01"
            headers = {"traceparent": traceparent}
            if options.trace_dest:
                headers["Nats-Trace-Dest"] = options.trace_dest
            await clients[i].publish(f"{options.subject_prefix}.{(i + 1) % n}", payload, headers=headers)
            by_server[labels[i % len(labels)]] += 1
            if keep:
                report.traceparents.append(traceparent)
            sent += 1
        if sent < target:
            await asyncio.sleep(_TICK_S)
    report.published = sent
    report.duration = time.monotonic() - started
    report.by_server = dict(by_server)
    return report


def default_user() -> tuple[str, str]:
    """The embedded topology's account A user (it has `msg_trace` on every server)."""
    return "a", DEFAULT_PASSWORD
