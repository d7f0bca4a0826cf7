"""Whether started servers have formed their topology, as their monitoring ports tell it.

Each check returns the unmet conditions as ``(server, why)`` pairs; an empty list means
ready. :class:`~nats_otel.devkit.processes.RunningTopology` polls them until they are
met or its deadline passes.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from nats_otel.devkit.topology import ServerSpec, Topology

__all__ = ["MonitoredServer", "get_json", "unmet_formation", "unmet_listening"]

_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def get_json(url: str, timeout: float = 1.0) -> tuple[int, Any]:
    """GET ``url`` -> (HTTP status, parsed JSON or None); (0, None) if unreachable, or if
    what answers is not HTTP: a free port is only free when chosen, and another process's
    NATS port may hold a monitoring port's number (the server that wanted it then exits,
    and the start is tried again on fresh ports: `processes._PortConflict`)."""
    try:
        # A proxy from the environment must never see requests to 127.0.0.1.
        with _NO_PROXY.open(url, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as e:
        with contextlib.suppress(ValueError):
            return e.code, json.loads(e.read() or b"null")
        return e.code, None
    except (OSError, ValueError, http.client.HTTPException):
        return 0, None


class MonitoredServer(Protocol):
    """What the checks need of a started server (a ``RunningServer``)."""

    spec: ServerSpec
    wanted: bool

    @property
    def monitor_url(self) -> str: ...

    def monitor(self, endpoint: str, timeout: float = 2.0) -> Any: ...


def unmet_listening(servers: Mapping[str, MonitoredServer], names: Iterable[str]) -> list[tuple[str, str]]:
    """Servers among ``names`` whose monitoring port does not answer yet."""
    unmet = []
    for n in names:
        status, _ = get_json(f"{servers[n].monitor_url}/varz", 0.5)
        if status != 200:
            unmet.append((n, "monitoring port not answering yet"))
    return unmet


def unmet_formation(spec: Topology, servers: Mapping[str, MonitoredServer]) -> list[tuple[str, str]]:
    """Unmet readiness conditions (server, why) among the wanted servers; empty: formed."""
    unmet: list[tuple[str, str]] = []
    up = [n for n, s in servers.items() if s.wanted]
    clusters = {c: [m.name for m in ms if m.name in up] for c, ms in spec.clusters().items()}
    # (Topology.validate: every gateway server has a cluster.)
    gw_clusters = {s.cluster for s in spec.servers if s.gateway and s.cluster and s.name in up}
    for n in up:
        s, sp = servers[n], servers[n].spec
        if sp.jetstream and spec.wait_jetstream:
            # /healthz answers 503 until the meta group has a leader, and logs a
            # warning per call; /jsz says the same silently, keeping log tails useful.
            _, jsz = get_json(f"{s.monitor_url}/jsz", 1.0)
            if not ((jsz or {}).get("meta_cluster") or {}).get("leader") and sp.cluster:
                unmet.append((n, "no JetStream meta leader yet"))
                continue
        status, body = get_json(f"{s.monitor_url}/healthz", 1.0)
        if status != 200 and (spec.wait_jetstream or not sp.jetstream):
            unmet.append((n, f"/healthz -> {status} {body}"))
            continue
        try:
            unmet += _links(spec, s, n, clusters, gw_clusters, up)
        except ConnectionError as e:
            unmet.append((n, str(e)))
    return unmet


def _links(spec: Topology, s: MonitoredServer, n: str, clusters: dict[str, list[str]],
           gw_clusters: set[str], up: list[str]) -> list[tuple[str, str]]:
    sp, unmet = s.spec, []
    if sp.cluster:
        # Route pooling gives several routes per peer (4 by default); count peers.
        routed = {r.get("remote_name") for r in (s.monitor("routez") or {}).get("routes") or []}
        no_route = set(clusters[sp.cluster]) - {n} - routed
        if no_route:
            unmet.append((n, f"no route to {sorted(no_route)}"))
    if sp.gateway:
        out = (s.monitor("gatewayz") or {}).get("outbound_gateways") or {}
        no_gateway = gw_clusters - {sp.cluster} - set(out)
        if no_gateway:
            unmet.append((n, f"no outbound gateway to {sorted(no_gateway)}"))
    if sp.leaf_remotes or sp.leaf_listen:
        leafed = {lf.get("name") for lf in (s.monitor("leafz") or {}).get("leafs") or []}
        want = {r.hub for r in sp.leaf_remotes} | {
            o.name for o in spec.servers if any(r.hub == n for r in o.leaf_remotes)
        }
        no_leaf = (want & set(up)) - leafed
        if no_leaf:
            unmet.append((n, f"no leafnode connection with {sorted(no_leaf)}"))
    return unmet
