"""A real Prometheus server on loopback, scraping given targets (tests, the dashboard check,
the docs' screenshot), with exemplar storage on (it then scrapes in the OpenMetrics format,
which carries them). Uses the `prometheus` binary on PATH (Debian's `prometheus` package).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from nats_otel.devkit.server_config import free_ports

__all__ = ["PrometheusNotFound", "PrometheusServer", "find_prometheus"]

# Loopback only, and never through a proxy from the environment.
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class PrometheusNotFound(FileNotFoundError):
    """No `prometheus` binary: `apt-get install prometheus` (`.ci/run` does)."""


def find_prometheus() -> str:
    path = shutil.which("prometheus")
    if path is None:
        raise PrometheusNotFound("prometheus not found on PATH: apt-get install -y prometheus")
    return path


class PrometheusServer:
    """`with PrometheusServer(["127.0.0.1:9464"]) as prom: prom.query("up")`."""

    def __init__(self, targets: list[str], scrape_interval: str = "1s", workdir: Path | None = None,
                 rule_files: Sequence[Path] = ()) -> None:
        self.targets = targets
        self.rule_files = [str(Path(f).resolve()) for f in rule_files]
        self.scrape_interval = scrape_interval
        self._own_dir = workdir is None
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="nats-otel-prometheus-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_ports(1)[0]
        self.url = f"http://127.0.0.1:{self.port}"
        self._process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30.0) -> PrometheusServer:
        binary = find_prometheus()
        config = self.workdir / "prometheus.yml"
        config.write_text(json.dumps({  # JSON is YAML
            "global": {"scrape_interval": self.scrape_interval, "evaluation_interval": self.scrape_interval},
            "rule_files": self.rule_files,
            "scrape_configs": [{"job_name": "nats-otel", "static_configs": [{"targets": self.targets}]}],
        }))
        log = (self.workdir / "prometheus.log").open("wb")
        self._process = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={self.workdir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn",
             "--enable-feature=exemplar-storage"],
            stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + timeout
        while self._get("/-/ready")[0] != 200:
            if self._process.poll() is not None or time.monotonic() > deadline:
                tail = (self.workdir / "prometheus.log").read_text(errors="replace")[-2000:]
                self.stop()
                raise RuntimeError(f"prometheus did not become ready on {self.url}:\n{tail}")
            time.sleep(0.1)
        return self

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """The instant vector (or scalar, as one item) of `expr`; raises on a query error."""
        params = {"query": expr, **({"time": f"{at:.3f}"} if at is not None else {})}
        status, body = self._get("/api/v1/query?" + urllib.parse.urlencode(params))
        doc = json.loads(body) if body else {}
        if status != 200 or doc.get("status") != "success":
            raise ValueError(f"prometheus query {expr!r} failed ({status}): {doc.get('error', body[:300])}")
        data = doc["data"]
        return data["result"] if data["resultType"] in ("vector", "matrix") else [{"value": data["result"]}]

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        """The matrix of `expr` from `start` to `end` (Unix seconds) every `step` seconds."""
        params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
        status, body = self._get("/api/v1/query_range?" + urllib.parse.urlencode(params))
        doc = json.loads(body) if body else {}
        if status != 200 or doc.get("status") != "success":
            raise ValueError(f"prometheus query {expr!r} failed ({status}): {doc.get('error', body[:300])}")
        return list(doc["data"]["result"])

    def query_exemplars(self, expr: str, start: float, end: float) -> list[dict[str, Any]]:
        """`/api/v1/query_exemplars`: per series of `expr`, its `seriesLabels` and `exemplars`
        (each `labels`, `value`, `timestamp`) between `start` and `end` (Unix seconds)."""
        params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}"}
        status, body = self._get("/api/v1/query_exemplars?" + urllib.parse.urlencode(params))
        doc = json.loads(body) if body else {}
        if status != 200 or doc.get("status") != "success":
            raise ValueError(f"prometheus exemplar query {expr!r} failed ({status}): {doc.get('error', body[:300])}")
        return list(doc["data"] or [])

    def rules(self) -> list[dict[str, Any]]:
        """`/api/v1/rules`: every rule of the rule files, with its `health` ("ok", "err",
        "unknown" before its first evaluation) and `lastError`."""
        status, body = self._get("/api/v1/rules")
        doc = json.loads(body) if body else {}
        if status != 200 or doc.get("status") != "success":
            raise ValueError(f"prometheus rules failed ({status}): {doc.get('error', body[:300])}")
        return [rule for group in doc["data"]["groups"] for rule in group["rules"]]

    def targets_up(self) -> int:
        """How many targets the last scrapes reached."""
        return sum(int(float(r["value"][1])) for r in self.query('up{job="nats-otel"}'))

    def _get(self, path: str) -> tuple[int, str]:
        try:
            with _NO_PROXY.open(self.url + path, timeout=5) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()
        except OSError:
            return 0, ""

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._own_dir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> PrometheusServer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
