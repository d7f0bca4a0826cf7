"""Real Spark servers on loopback for the backfill's tests, from pyspark's own distribution:
a Spark Connect server, a standalone cluster (master and worker JVMs), and the packed
virtualenv (`venv-pack`) that ships the project to a cluster's executors.

Every process is started in its own session and stopped by its id when the block ends.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from importlib.metadata import version
from pathlib import Path

__all__ = ["REPO", "connect_server", "free_port", "packed_venv", "spark_home", "standalone_cluster", "started"]

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 180.0


def spark_home() -> Path:
    """The Spark distribution inside the pyspark package (bin/, jars/, python/lib/)."""
    import pyspark

    return Path(pyspark.__file__).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spark_env(**extra: str) -> dict[str, str]:
    """The environment of a Spark process: this one without anything that would let a
    Python worker import the project from here (PYTHONPATH, PYSPARK_PYTHON)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON",
                                                            "PYSPARK_GATEWAY_PORT", "SPARK_CONF_DIR")}
    env.update(SPARK_HOME=str(spark_home()), SPARK_LOCAL_IP="127.0.0.1", **extra)
    return env


@contextlib.contextmanager
def started(cmd: Sequence[str], log: Path, ready: str, env: Mapping[str, str], cwd: Path) -> Iterator[Path]:
    """A process running until the block ends; waits until `ready` is in its log."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(list(cmd), stdout=out, stderr=subprocess.STDOUT, env=dict(env), cwd=cwd,
                                start_new_session=True)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while ready not in log.read_text(errors="replace"):
            if proc.poll() is not None:
                raise RuntimeError(f"{cmd[0]} exited ({proc.returncode}):\n{log.read_text()[-3000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{cmd[0]} not ready after {START_TIMEOUT_S:.0f}s:\n{log.read_text()[-3000:]}")
            time.sleep(0.3)
        yield log
    finally:
        # The JVM and the Python workers it started share the session we gave it.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


@contextlib.contextmanager
def connect_server(workdir: Path) -> Iterator[str]:
    """pyspark's Spark Connect server (local[2]) on a free loopback port: `sc://127.0.0.1:PORT`.

    Its Python workers run this interpreter with this tree on their path: a Connect server's
    executors need the project installed, like any cluster's.
    """
    port = free_port()
    env = spark_env(PYSPARK_PYTHON=sys.executable, PYTHONPATH=str(REPO))
    cmd = [str(spark_home() / "bin" / "spark-submit"), "--class",
           "org.apache.spark.sql.connect.service.SparkConnectServer", "--master", "local[2]",
           "--conf", f"spark.connect.grpc.binding.port={port}",
           "--conf", "spark.connect.grpc.binding.address=127.0.0.1",
           "--conf", "spark.ui.enabled=false", "--conf", "spark.sql.shuffle.partitions=2"]
    with started(cmd, workdir / "connect-server.log", "Spark Connect server started", env, workdir):
        yield f"sc://127.0.0.1:{port}"


@contextlib.contextmanager
def standalone_cluster(workdir: Path, cores: int = 2, memory: str = "2g") -> Iterator[str]:
    """A Spark standalone master and one worker on loopback: `spark://127.0.0.1:PORT`."""
    spark_class = str(spark_home() / "bin" / "spark-class")
    port = free_port()
    env = spark_env(SPARK_WORKER_DIR=str(workdir / "worker"))
    master = [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
              "--webui-port", str(free_port())]
    url = f"spark://127.0.0.1:{port}"
    worker = [spark_class, "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--cores", str(cores),
              "--memory", memory, "--webui-port", str(free_port()), "--work-dir", str(workdir / "worker"), url]
    with (started(master, workdir / "master.log", "I have been elected leader", env, workdir),
          started(worker, workdir / "worker.log", "Successfully registered with master", env, workdir)):
        yield url


def _run(cmd: Sequence[str]) -> None:
    done = subprocess.run(list(cmd), capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-3000:]}")


def packed_venv(workdir: Path) -> tuple[Path, Path]:
    """(a fresh virtualenv with the project installed from its wheel, that venv packed by
    venv-pack): what the PySpark docs ship to executors with `--archives`.

    The wheel is built from a copy of the tree (a build in place would leave build/ and
    *.egg-info in it); pyarrow and pandas at the versions the tests run with, since the
    cluster's pyspark (the worker's own) talks Arrow to them.
    """
    import venv_pack

    source = workdir / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        (source / name).write_bytes((REPO / name).read_bytes())
    for package in ("nats_otel", "spark_backfill"):
        subprocess.run(["cp", "-r", str(REPO / package), str(source / package)], check=True)
    _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(workdir / "wheels"), str(source)])
    (wheel,) = (workdir / "wheels").glob("nats_otel-*.whl")
    venv = workdir / "venv"
    _run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", str(venv)])
    _run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", str(wheel),
          f"pyarrow=={version('pyarrow')}", f"pandas=={version('pandas')}"])
    archive = workdir / "environment.tar.gz"
    venv_pack.pack(prefix=str(venv), output=str(archive), compress_level=1)
    return venv, archive
