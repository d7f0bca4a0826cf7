"""nats-server config text for a :class:`~nats_otel.devkit.topology.Topology`, and its ports.

:func:`allocate_ports` picks free 127.0.0.1 ports for every listener of every server;
:func:`render_config` writes one server's config file text (accounts, cluster routes,
gateways, leafnodes, JetStream) from the spec and those ports.
"""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass
from pathlib import Path

from nats_otel.devkit.topology import AccountSpec, ServerSpec, Topology

__all__ = ["Ports", "allocate_ports", "free_ports", "render_config"]


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct ports that were free on ``host`` a moment ago."""
    socks = []
    try:
        # Hold every socket until all are chosen so the kernel cannot hand out one twice.
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(s)
            s.bind((host, 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _q(value: str) -> str:
    return json.dumps(value, ensure_ascii=False)


def _render_account(a: AccountSpec) -> str:
    users = []
    for u in a.users:
        perms = ""
        if u.deny_publish:
            deny = ", ".join(map(_q, u.deny_publish))
            perms = f", permissions: {{ publish: {{ deny: [{deny}] }} }}"
        users.append(f"      {{ user: {_q(u.name)}, password: {_q(u.password)}{perms} }}")
    lines = [f"  {a.name}: {{", "    users: [", *users, "    ]"]
    if a.jetstream:
        lines.append("    jetstream: enabled")
    if a.trace_dest:
        sampling = _q(a.trace_sampling) if isinstance(a.trace_sampling, str) else a.trace_sampling
        lines.append(f"    msg_trace: {{ dest: {_q(a.trace_dest)}, sampling: {sampling} }}")
    if a.mappings:
        body = ", ".join(f"{_q(k)}: {_q(v)}" for k, v in a.mappings)
        lines.append(f"    mappings: {{ {body} }}")
    if a.exports:
        lines.append("    exports: [")
        for e in a.exports:
            trace = ", allow_trace: true" if e.allow_trace else ""
            lines.append(f"      {{ {e.kind}: {_q(e.subject)}{trace} }}")
        lines.append("    ]")
    if a.imports:
        lines.append("    imports: [")
        for i in a.imports:
            extra = "".join(
                [
                    f", to: {_q(i.to)}" if i.to else "",
                    f", prefix: {_q(i.prefix)}" if i.prefix else "",
                    ", allow_trace: true" if i.allow_trace else "",
                ]
            )
            src = f"{{ account: {i.account}, subject: {_q(i.subject)} }}"
            lines.append(f"      {{ {i.kind}: {src}{extra} }}")
        lines.append("    ]")
    lines.append("  }")
    return "\n".join(lines)


@dataclass(slots=True, frozen=True)
class Ports:
    """The ports one server listens on (``None``: that listener is not configured)."""

    client: int
    http: int
    cluster: int | None = None
    gateway: int | None = None
    leaf: int | None = None


def render_config(spec: Topology, s: ServerSpec, ports: dict[str, Ports], workdir: Path) -> str:
    """The config file text of server ``s`` of ``spec`` (JetStream stores under ``workdir``)."""
    h = spec.host
    p = ports[s.name]
    accounts = spec.accounts_of(s.name)
    out = [f"server_name: {_q(s.name)}", f'listen: "{h}:{p.client}"', f'http: "{h}:{p.http}"', ""]
    out += ["accounts {", *(_render_account(a) for a in accounts), "}"]
    if any(a.name == spec.system_account for a in accounts):
        out.append(f"system_account: {spec.system_account}")
    if s.cluster and p.cluster:
        peers = [
            f'"nats://{h}:{ports[m.name].cluster}"'
            for m in spec.clusters()[s.cluster]
            if m.name != s.name
        ]
        out += ["", "cluster {", f"  name: {s.cluster}", f'  listen: "{h}:{p.cluster}"']
        out += [f"  routes: [ {', '.join(peers)} ]", "}"]
    if s.gateway:
        remotes = []
        for cname, members in spec.clusters().items():
            if cname != s.cluster and members[0].gateway and _solicits(spec, s.cluster, cname):
                # One URL, as in the corpus; gossip teaches the rest of that cluster.
                url = f"nats://{h}:{ports[members[0].name].gateway}"
                remotes.append(f"    {{ name: {cname}, urls: [ {_q(url)} ] }}")
        out += ["", "gateway {", f"  name: {s.cluster}", f'  listen: "{h}:{p.gateway}"']
        out += ["  gateways: [", *remotes, "  ]", "}"] if remotes else ["}"]
    if s.leaf_listen or s.leaf_remotes:
        out += ["", "leafnodes {"]
        if s.leaf_listen:
            out.append(f'  listen: "{h}:{p.leaf}"')
        if s.leaf_remotes:
            out.append("  remotes: [")
            for r in s.leaf_remotes:
                url = f"nats://{r.user}:{r.password}@{h}:{ports[r.hub].leaf}"
                out.append(f"    {{ url: {_q(url)}, account: {r.account} }}")
            out.append("  ]")
        out.append("}")
    if s.tags:
        out += ["", f"server_tags: [{', '.join(map(_q, s.tags))}]"]
    if s.jetstream:
        store = workdir / f"js-{s.name}"
        out += ["", "jetstream {", f"  store_dir: {_q(str(store))}"]
        if s.jetstream_domain:
            out.append(f"  domain: {_q(s.jetstream_domain)}")
        out += ["  max_memory_store: 256MB", "  max_file_store: 1GB", "}"]
    if s.extra_config:
        out += ["", s.extra_config]
    return "\n".join(out) + "\n"


def _solicits(spec: Topology, local: str | None, remote: str) -> bool:
    """Whether cluster ``local`` lists gateway ``remote`` in its config.

    Each configured gateway URL counts as one expected JetStream meta peer at first boot
    (raft.go ``bootstrapRaftNode``). Two JetStream servers in east plus west's URL give a
    boot size of 3: no leader until the mixed-mode adjustment a second later and a new
    election timeout after it, ~5 s in all. So a JetStream cluster leaves the gateway
    implicit (created when the other side connects) when the other side can dial it.
    """
    clusters = spec.clusters()
    js_local = any(m.jetstream for m in clusters.get(local or "", []))
    js_remote = any(m.jetstream for m in clusters[remote])
    if js_local and js_remote and local is not None:
        order = list(clusters)
        return order.index(local) > order.index(remote)  # only the later cluster dials
    return not js_local


def allocate_ports(spec: Topology) -> dict[str, Ports]:
    """Server name -> free ports for each listener that server's spec configures."""
    needs = [(s.name, bool(s.cluster), s.gateway, s.leaf_listen) for s in spec.servers]
    pool = iter(free_ports(sum(2 + c + g + lf for _, c, g, lf in needs), spec.host))
    return {
        name: Ports(
            client=next(pool),
            http=next(pool),
            cluster=next(pool) if c else None,
            gateway=next(pool) if g else None,
            leaf=next(pool) if lf else None,
        )
        for name, c, g, lf in needs
    }
