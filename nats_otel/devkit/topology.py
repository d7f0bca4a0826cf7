"""What an embedded nats-server topology is: servers, how they connect, and their accounts.

A :class:`Topology` says which servers exist and how they connect (routes inside a
cluster, gateways between clusters, leafnode remotes to a hub, JetStream). The
default accounts follow the captured corpus (``configs/east-1.conf``): accounts A, B
and C with ``msg_trace``, a service and a stream export from A imported by B with
tracing allowed, a subject mapping, and the system account SYS.

Only data and validation here: :mod:`nats_otel.devkit.server_config` renders a spec as
config files, :mod:`nats_otel.devkit.processes` starts it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "DEFAULT_ACCOUNTS",
    "DEFAULT_PASSWORD",
    "LEAF_ACCOUNTS",
    "AccountSpec",
    "ExportSpec",
    "ImportSpec",
    "LeafRemote",
    "ServerSpec",
    "Topology",
    "UserSpec",
    "cluster",
    "demo_topology",
    "full_topology",
    "single_server",
]

DEFAULT_PASSWORD = "pwd"


@dataclass(slots=True, frozen=True)
class UserSpec:
    """A user of an account (plain password, like the corpus configs)."""

    name: str
    password: str = DEFAULT_PASSWORD
    deny_publish: tuple[str, ...] = ()


@dataclass(slots=True, frozen=True)
class ExportSpec:
    """A service or stream export. For services, tracing across the import is allowed here."""

    kind: Literal["service", "stream"]
    subject: str
    allow_trace: bool = False


@dataclass(slots=True, frozen=True)
class ImportSpec:
    """A service import (``to`` renames it) or stream import (``prefix``).

    For streams, tracing across the import is allowed on the importing side (ADR-41).
    """

    kind: Literal["service", "stream"]
    account: str
    subject: str
    to: str | None = None
    prefix: str | None = None
    allow_trace: bool = False


@dataclass(slots=True, frozen=True)
class AccountSpec:
    """An account: users, JetStream, ``msg_trace { dest, sampling }``, mappings, import/export."""

    name: str
    users: tuple[UserSpec, ...] = ()
    jetstream: bool = False
    trace_dest: str | None = None
    trace_sampling: int | str = 100
    mappings: tuple[tuple[str, str], ...] = ()
    exports: tuple[ExportSpec, ...] = ()
    imports: tuple[ImportSpec, ...] = ()


@dataclass(slots=True, frozen=True)
class LeafRemote:
    """A leafnode connection from this server to ``hub``, binding local ``account``.

    The hub side account is the account of ``user`` on the hub.
    """

    hub: str
    account: str = "A"
    user: str = "a"
    password: str = DEFAULT_PASSWORD


@dataclass(slots=True, frozen=True)
class ServerSpec:
    """One nats-server.

    Servers with the same ``cluster`` get routes to each other; ``gateway`` connects the
    cluster to every other gateway cluster; ``leaf_listen`` opens a leafnode port for
    other servers' ``leaf_remotes``. ``accounts=None`` uses the topology's accounts.
    ``jetstream_domain`` keeps a JetStream leaf apart from its hub's JetStream (without
    one, both would answer the bridged account's ``$JS.API``). ``extra_config`` is
    appended verbatim to the config file.
    """

    name: str
    cluster: str | None = None
    gateway: bool = False
    leaf_listen: bool = False
    leaf_remotes: tuple[LeafRemote, ...] = ()
    jetstream: bool = False
    jetstream_domain: str | None = None
    tags: tuple[str, ...] = ()
    accounts: tuple[AccountSpec, ...] | None = None
    extra_config: str = ""


_A = AccountSpec(
    name="A",
    users=(UserSpec("a"), UserSpec("a_deny", deny_publish=("secret.>",))),
    jetstream=True,
    trace_dest="trace.a",
    trace_sampling=100,
    mappings=(("s07.orig.*", "s07.mapped.$1"),),
    exports=(ExportSpec("service", "svc.>", allow_trace=True), ExportSpec("stream", "events.>")),
)
DEFAULT_ACCOUNTS: tuple[AccountSpec, ...] = (
    AccountSpec(name="SYS", users=(UserSpec("sys"),)),
    _A,
    AccountSpec(
        name="B",
        users=(UserSpec("b"),),
        trace_dest="trace.b",
        imports=(
            ImportSpec("service", "A", "svc.>", to="asvc.>"),
            ImportSpec("stream", "A", "events.>", prefix="froma", allow_trace=True),
        ),
    ),
    AccountSpec(name="C", users=(UserSpec("c"),), trace_dest="trace.c", trace_sampling="50%"),
)
"""The corpus accounts: SYS; A (users a, a_deny); B importing from A; C sampling 50%."""

LEAF_ACCOUNTS: tuple[AccountSpec, ...] = (
    AccountSpec(name="A", users=(UserSpec("a"),), trace_dest="trace.a", trace_sampling=100),
)
"""A leaf server's accounts in the corpus: only A (bound to the hub's A), no system account."""


@dataclass(slots=True, frozen=True)
class Topology:
    """A set of servers and the accounts they share, started by :func:`start_topology`."""

    servers: tuple[ServerSpec, ...]
    accounts: tuple[AccountSpec, ...] = DEFAULT_ACCOUNTS
    system_account: str = "SYS"
    host: str = "127.0.0.1"
    ready_timeout: float = 30.0
    wait_jetstream: bool = True

    def server(self, name: str) -> ServerSpec:
        """The spec of server ``name``."""
        for s in self.servers:
            if s.name == name:
                return s
        raise KeyError(name)

    def accounts_of(self, name: str) -> tuple[AccountSpec, ...]:
        """The accounts configured on server ``name``."""
        s = self.server(name)
        return self.accounts if s.accounts is None else s.accounts

    def clusters(self) -> dict[str, list[ServerSpec]]:
        """Cluster name -> its servers, in spec order."""
        out: dict[str, list[ServerSpec]] = {}
        for s in self.servers:
            if s.cluster:
                out.setdefault(s.cluster, []).append(s)
        return out

    def validate(self) -> None:
        """Raise ``ValueError`` naming the problem if the spec cannot form."""
        names = [s.name for s in self.servers]
        if not names or len(set(names)) != len(names):
            raise ValueError(f"server names must be unique and non-empty: {names}")
        for cname, members in self.clusters().items():
            if len({s.gateway for s in members}) > 1:
                raise ValueError(f"cluster {cname!r}: either all or no servers have gateway=True")
            js = [s.name for s in members if s.jetstream]
            # Seen with 2.15.1 (corpus NOTES): the meta group's boot size has a floor of 2,
            # so one JetStream server in a multi-server cluster never elects a leader.
            if len(members) > 1 and len(js) == 1:
                raise ValueError(
                    f"cluster {cname!r}: JetStream on only {js[0]!r} never elects a meta "
                    "leader; enable it on at least 2 servers of the cluster"
                )
        gw = {s.cluster for s in self.servers if s.gateway}
        if any(s.gateway and not s.cluster for s in self.servers) or len(gw) == 1:
            raise ValueError("gateways need a cluster name and at least two gateway clusters")
        for s in self.servers:
            local = {a.name for a in self.accounts_of(s.name)}
            for r in s.leaf_remotes:
                hub = self.server(r.hub) if r.hub in names else None
                if hub is None or not hub.leaf_listen:
                    raise ValueError(f"{s.name}: leaf remote hub {r.hub!r} needs leaf_listen=True")
                if r.account not in local:
                    raise ValueError(f"{s.name}: leaf remote binds unknown account {r.account!r}")
                if not any(u.name == r.user for a in self.accounts_of(r.hub) for u in a.users):
                    raise ValueError(f"{s.name}: leaf remote user {r.user!r} unknown on {r.hub}")


def cluster(
    name: str,
    size: int,
    *,
    gateway: bool = False,
    jetstream: Iterable[int] = (),
    leaf_listen: Iterable[int] = (),
) -> tuple[ServerSpec, ...]:
    """Servers ``<name>-1`` .. ``<name>-<size>`` of one cluster.

    ``jetstream`` and ``leaf_listen`` are 1-based member numbers; JetStream servers get
    the tag ``node:<server name>`` so streams can be pinned to them.
    """
    js, leaf = set(jetstream), set(leaf_listen)
    return tuple(
        ServerSpec(
            name=f"{name}-{i}",
            cluster=name if size > 1 or gateway else None,
            gateway=gateway,
            leaf_listen=i in leaf,
            jetstream=i in js,
            tags=(f"node:{name}-{i}",) if i in js else (),
        )
        for i in range(1, size + 1)
    )


def single_server(jetstream: bool = False) -> Topology:
    """One standalone server ``n1`` with the default accounts (JetStream optional)."""
    tags = ("node:n1",) if jetstream else ()
    return Topology(servers=(ServerSpec(name="n1", jetstream=jetstream, tags=tags),))


_LEAF_1 = ServerSpec(name="leaf-1", accounts=LEAF_ACCOUNTS, leaf_remotes=(LeafRemote("east-1"),))


def demo_topology() -> Topology:
    """Cluster ``east`` of 3 (JetStream on east-2 and east-3) plus leaf-1 bound to east-1."""
    return Topology(servers=(*cluster("east", 3, jetstream=(2, 3), leaf_listen=(1,)), _LEAF_1))


def full_topology() -> Topology:
    """The corpus topology: east x3 and west x2 joined by a gateway, plus leaf-1 to east-1.

    JetStream runs on east-2 and east-3 (see :meth:`Topology.validate` for why two).
    """
    east = cluster("east", 3, gateway=True, jetstream=(2, 3), leaf_listen=(1,))
    return Topology(servers=(*east, *cluster("west", 2, gateway=True), _LEAF_1))
