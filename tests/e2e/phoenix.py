"""Arize Phoenix on loopback for the e2e tests and the screenshot script: start, wait, query, stop.

Phoenix lives in a venv of its own (its pins clash with ours); its `phoenix` executable is
found through ``NATS_OTEL_PHOENIX_BIN``, else ``<repo>/.venv-phoenix/bin/phoenix``, else PATH.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
ENV_VAR = "NATS_OTEL_PHOENIX_BIN"
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def find_phoenix() -> str | None:
    """The `phoenix` executable, or None."""
    if os.environ.get(ENV_VAR):  # when set, it is the only candidate
        candidates = [os.environ[ENV_VAR]]
    else:
        candidates = [str(ROOT / ".venv-phoenix" / "bin" / "phoenix"), shutil.which("phoenix")]
    for c in candidates:
        if c and Path(c).is_file() and os.access(c, os.X_OK):
            return c
    return None


def get_json(url: str, timeout: float = 5.0) -> Any:
    with _NO_PROXY.open(url, timeout=timeout) as resp:
        return json.loads(resp.read())


@dataclass
class Phoenix:
    """A running `phoenix serve`."""

    process: subprocess.Popen[bytes]
    http_port: int
    grpc_port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def grpc_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.grpc_port}"

    def project_id(self, name: str = "default") -> str:
        for project in get_json(f"{self.url}/v1/projects")["data"]:
            if project["name"] == name:
                return str(project["id"])
        raise KeyError(name)

    def spans(self, project: str = "default") -> list[dict[str, Any]]:
        """Every span of the project, all pages."""
        out: list[dict[str, Any]] = []
        cursor = None
        while True:
            query = {"limit": "1000", **({"cursor": cursor} if cursor else {})}
            page = get_json(f"{self.url}/v1/projects/{project}/spans?{urllib.parse.urlencode(query)}")
            out += page["data"]
            cursor = page.get("next_cursor")
            if not cursor:
                return out

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 20 s; the whole process group (uvicorn workers)."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


def start_phoenix(binary: str, workdir: Path, timeout: float = 120.0) -> Phoenix:
    """`phoenix serve` on free loopback ports with its database in ``workdir``; waits until it answers."""
    from nats_otel.devkit.server_config import free_ports

    http_port, grpc_port = free_ports(2)
    workdir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PHOENIX_HOST": "127.0.0.1", "PHOENIX_PORT": str(http_port),
           "PHOENIX_GRPC_PORT": str(grpc_port), "PHOENIX_WORKING_DIR": str(workdir),
           "PHOENIX_TELEMETRY_ENABLED": "false"}
    log_path = workdir / "phoenix.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen([binary, "serve"], env=env, stdout=log, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
    phoenix = Phoenix(process, http_port, grpc_port, log_path)
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"phoenix exited with {process.returncode}:\n{log_path.read_text()[-3000:]}")
        try:
            get_json(f"{phoenix.url}/v1/projects", timeout=2)
            return phoenix
        except (OSError, ValueError):
            if time.monotonic() > deadline:
                phoenix.stop()
                tail = log_path.read_text()[-3000:]
                raise RuntimeError(f"phoenix did not answer within {timeout}s:\n{tail}") from None
            time.sleep(0.5)
