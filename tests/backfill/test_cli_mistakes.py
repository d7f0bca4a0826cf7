"""A user's mistakes answered before Spark starts: one line, exit 2, nothing left behind.

Each mistake runs `python -m spark_backfill` as a user would, in a subprocess whose
SPARK_HOME is a stand-in: its `bin/spark-submit` (what pyspark runs to start the JVM) only
records that it was called. So "Spark never started" is seen, not inferred from timing;
the control case shows the stand-in is called when the command line is right. Each mistake
is made twice: on this machine, and on one without Graphviz's `dot` or Java (an empty PATH,
a JAVA_HOME without a JDK), where it must still be the first thing said. A JetStream source's
mistakes (no such stream, nothing listening, no creds file, a refused password, no JetStream)
are made against real nats-server processes.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from nats_otel.devkit.processes import start_topology
from nats_otel.devkit.topology import single_server
from tests.backfill.conftest import CORPUS

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture()
def fake_spark_home(tmp_path: Path) -> Path:
    home = tmp_path / "spark-home"
    (home / "bin").mkdir(parents=True)
    submit = home / "bin" / "spark-submit"
    submit.write_text(f"#!/bin/sh\ntouch {tmp_path / 'spark-started'}\nexit 1\n")
    submit.chmod(0o755)
    return home


def _backfill(args: list[str], cwd: Path, spark_home: Path, env: dict[str, str] | None = None):
    environ = {**os.environ, "SPARK_HOME": str(spark_home), "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run([sys.executable, "-m", "spark_backfill", *args], cwd=cwd, env=environ,
                          capture_output=True, text=True, timeout=120)


def _folder_with(tmp_path: Path, name: str, files: dict[str, bytes]) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    for file, content in files.items():
        (folder / file).write_bytes(content)
    return folder


CORPUS_FILE = str(CORPUS / "02_route_hop.jsonl")

# (name, argv with {tmp}, what the one line must say)
MISTAKES = [
    ("missing input", ["convert", "--input", "{tmp}/nope.jsonl", "--otlp-json-out", "{tmp}/out"],
     "input {tmp}/nope.jsonl does not exist"),
    ("glob matching nothing", ["convert", "--input", "{tmp}/*.jsonl", "--otlp-json-out", "{tmp}/out"],
     "no input matches {tmp}/*.jsonl"),
    ("folder without archives", ["convert", "--input", "{tmp}/notes", "--otlp-json-out", "{tmp}/out"],
     "input {tmp}/notes holds no archive files"),
    ("output exists", ["convert", "--input", CORPUS_FILE, "--otlp-json-out", "{tmp}/old"],
     "output {tmp}/old exists; pass --overwrite to replace it"),
    ("no output at all", ["convert", "--input", CORPUS_FILE], "nothing to write"),
    ("output is a file", ["convert", "--input", CORPUS_FILE, "--parquet-out", "{tmp}/notes/readme.txt"],
     "is a file"),
    ("two outputs, one folder", ["convert", "--input", CORPUS_FILE, "--otlp-json-out", "{tmp}/o",
                                 "--parquet-out", "{tmp}/o/spans"], "overlap"),
    ("output inside the input", ["convert", "--input", "{tmp}/archive", "--otlp-json-out", "{tmp}/archive/otlp"],
     "the job would read its own output"),
    ("placeholders alone", ["convert", "--input", CORPUS_FILE, "--parquet-out", "{tmp}/o", "--placeholders"],
     "--placeholders needs --mark-incomplete"),
    ("service name template", ["convert", "--input", CORPUS_FILE, "--parquet-out", "{tmp}/o", "--service-name",
                               "nats/{{zone}}"], "a template may use only {{server}}, {{cluster}}, {{domain}}"),
    ("url without stream", ["convert", "--jetstream-url", "nats://127.0.0.1:4222", "--parquet-out", "{tmp}/o"],
     "--jetstream-url and --stream go together"),
    ("conf without value", ["convert", "--input", CORPUS_FILE, "--parquet-out", "{tmp}/o", "--conf", "spark.x"],
     "--conf 'spark.x' is not KEY=VALUE"),
    ("endpoint not http", ["convert", "--input", CORPUS_FILE, "--otlp-endpoint", "collector:4318"],
     "--otlp-endpoint collector:4318: expected http(s)://"),
    ("remote and master", ["convert", "--input", CORPUS_FILE, "--parquet-out", "{tmp}/o", "--remote",
                           "sc://127.0.0.1:15002", "--master", "local[2]"], "--remote and --master"),
    ("size without number", ["convert", "--input", CORPUS_FILE, "--otlp-json-out", "{tmp}/o",
                             "--target-file-bytes", "big"], "expected a size such as 64M"),
    ("unknown flag", ["convert", "--input", CORPUS_FILE, "--otlp-json-out", "{tmp}/o", "--output", "x"],
     "unrecognized arguments: --output x"),
    ("report on a missing table", ["report", "--spans", "{tmp}/nope", "--out", "{tmp}/report"],
     "span table {tmp}/nope does not exist"),
    ("report on a folder of text", ["report", "--spans", "{tmp}/notes", "--out", "{tmp}/report"],
     "holds no Parquet files"),
    ("report over an old one", ["report", "--spans", "{tmp}/table", "--out", "{tmp}/old"],
     "output {tmp}/old exists; pass --overwrite"),
]


def _bare_machine(tmp_path: Path) -> dict[str, str]:
    """The environment of a machine without `dot` or Java (neither path is created)."""
    return {"PATH": str(tmp_path / "empty-path"), "JAVA_HOME": str(tmp_path / "no-jdk")}


# What the user typed is checked before what the machine lacks.
MACHINES = {"this machine": lambda tmp_path: {}, "no dot, no java": _bare_machine}


@pytest.mark.parametrize("machine", list(MACHINES))
@pytest.mark.parametrize(("argv", "says"), [m[1:] for m in MISTAKES], ids=[m[0] for m in MISTAKES])
def test_mistake_is_one_line_before_spark_starts(tmp_path, fake_spark_home, argv, says, machine):
    _folder_with(tmp_path, "notes", {"readme.txt": b"not an archive\n"})
    _folder_with(tmp_path, "archive", {"a.jsonl": Path(CORPUS_FILE).read_bytes()})
    _folder_with(tmp_path, "table", {"part-0.parquet": b"PAR1"})
    old = _folder_with(tmp_path, "old", {"part-00000.jsonl": b"earlier output\n"})
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))

    done = _backfill([a.format(tmp=tmp_path) for a in argv], tmp_path, fake_spark_home,
                              env=MACHINES[machine](tmp_path))

    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert "error: " in lines[0] and says.format(tmp=tmp_path) in lines[0]
    assert "Traceback" not in done.stderr and done.stdout == ""
    assert not (tmp_path / "spark-started").exists(), "Spark was started"
    # Nothing created, nothing replaced.
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
    assert (old / "part-00000.jsonl").read_bytes() == b"earlier output\n"


def test_no_java_is_one_line_before_spark_starts(tmp_path, fake_spark_home):
    done = _backfill(["convert", "--input", CORPUS_FILE, "--otlp-json-out", str(tmp_path / "o")], tmp_path,
                        fake_spark_home, env={"JAVA_HOME": str(tmp_path / "no-jdk")})
    assert done.returncode == 2
    wanted = (f"python -m spark_backfill convert: error: JAVA_HOME={tmp_path / 'no-jdk'} has no bin/java; "
              "Spark needs Java 17 or newer")
    assert done.stderr.splitlines() == [wanted]
    assert not (tmp_path / "spark-started").exists()


def test_report_without_graphviz_says_so(tmp_path, fake_spark_home):
    table = _folder_with(tmp_path, "table", {"part-0.parquet": b"PAR1"})
    done = _backfill(["report", "--spans", str(table), "--out", str(tmp_path / "r")], tmp_path, fake_spark_home,
                        env=_bare_machine(tmp_path))
    assert done.returncode == 2
    assert len(done.stderr.splitlines()) == 1
    # Graphviz before Java: the picture is what this command line asked the machine for.
    assert "needs Graphviz's `dot` on PATH (apt-get install graphviz)" in done.stderr
    assert "--no-picture" in done.stderr
    assert not (tmp_path / "spark-started").exists()


def test_report_without_picture_needs_no_graphviz(tmp_path, fake_spark_home):
    """With --no-picture the same bare machine is asked only for Java."""
    table = _folder_with(tmp_path, "table", {"part-0.parquet": b"PAR1"})
    done = _backfill(["report", "--spans", str(table), "--out", str(tmp_path / "r"), "--no-picture"], tmp_path,
                        fake_spark_home, env=_bare_machine(tmp_path))
    assert done.returncode == 2
    wanted = (f"python -m spark_backfill report: error: JAVA_HOME={tmp_path / 'no-jdk'} has no bin/java; "
              "Spark needs Java 17 or newer")
    assert done.stderr.splitlines() == [wanted]
    assert not (tmp_path / "spark-started").exists()


def test_a_right_command_line_does_start_spark(tmp_path, fake_spark_home):
    """The control: past the checks, pyspark calls spark-submit (here the stand-in, which
    fails); that failure too is one line, exit 1, and leaves no output folder."""
    done = _backfill(["convert", "--input", CORPUS_FILE, "--otlp-json-out", str(tmp_path / "new" / "otlp")],
                        tmp_path, fake_spark_home)
    assert (tmp_path / "spark-started").exists()
    assert done.returncode == 1
    errors = [line for line in done.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "the job failed:" in errors[0], done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "new").exists()


# --- a JetStream source: asked of its real server before Spark starts (issue 47) ----------

@pytest.fixture(scope="module")
def jetstream_url() -> Iterator[str]:
    with start_topology(single_server(jetstream=True)) as running:
        yield running.client_url("n1")


@pytest.fixture(scope="module")
def no_jetstream_url() -> Iterator[str]:
    with start_topology(single_server(jetstream=False)) as running:
        yield running.client_url("n1")


# (name, --jetstream-url, more flags, what the one line must say); {js} is a server with
# JetStream, {off} one without, {free} a port nothing listens on; each without its password
# as `{..._shown}`.
SOURCE_MISTAKES = [
    ("missing stream", "{js}", [], "JetStream stream 'NO_SUCH' not found on {js_shown}"),
    ("nothing listens", "{free}", [], "--jetstream-url {free}: cannot connect (connection refused)"),
    ("missing creds file", "{js}", ["--jetstream-creds", "{tmp}/nope.creds"],
     "--jetstream-creds {tmp}/nope.creds does not exist"),
    ("refused password", "{js_wrong}", [],
     "--jetstream-url {js_shown}: the server refused the credentials (Authorization Violation)"),
    ("no JetStream", "{off}", [], "--jetstream-url {off_shown}: JetStream does not answer"),
]


@pytest.mark.integration
@pytest.mark.parametrize(("url", "extra", "says"), [m[1:] for m in SOURCE_MISTAKES],
                         ids=[m[0] for m in SOURCE_MISTAKES])
def test_a_jetstream_source_mistake_is_one_line_before_spark_starts(tmp_path, fake_spark_home, jetstream_url,
                                                                     no_jetstream_url, url, extra, says):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = f"nats://127.0.0.1:{s.getsockname()[1]}"
    names = {"js": jetstream_url, "off": no_jetstream_url, "free": free, "tmp": tmp_path,
             "js_wrong": jetstream_url.replace(":pwd@", ":wrong@"),
             "js_shown": "nats://" + jetstream_url.rsplit("@", 1)[1],
             "off_shown": "nats://" + no_jetstream_url.rsplit("@", 1)[1]}
    done = _backfill(["convert", "--jetstream-url", url.format(**names), "--stream", "NO_SUCH", "--otlp-json-out",
                      str(tmp_path / "out"), *[a.format(**names) for a in extra]], tmp_path, fake_spark_home)
    lines = done.stderr.splitlines()
    assert done.returncode == 2, done.stderr
    assert 1 <= len(lines) <= 3, done.stderr  # the bound; it is the one line
    assert lines[-1].startswith("python -m spark_backfill convert: error: "), done.stderr
    assert says.format(**names) in lines[-1], done.stderr
    assert ":pwd@" not in done.stderr and ":wrong@" not in done.stderr, "a password was shown"
    assert "Traceback" not in done.stderr and done.stdout == ""
    assert not (tmp_path / "spark-started").exists(), "Spark was started"
    assert not (tmp_path / "out").exists()


@pytest.mark.integration
def test_a_jetstream_source_that_is_there_does_start_spark(tmp_path, fake_spark_home, jetstream_url):
    """The control: the stream exists, so the checks pass and pyspark calls spark-submit."""
    stream = "TRACES_THERE"
    asyncio.run(_add_stream(jetstream_url, stream))
    done = _backfill(["convert", "--jetstream-url", jetstream_url, "--stream", stream, "--otlp-json-out",
                      str(tmp_path / "out")], tmp_path, fake_spark_home)
    assert (tmp_path / "spark-started").exists(), done.stderr
    assert done.returncode == 1


async def _add_stream(url: str, name: str) -> None:
    import nats

    nc = await nats.connect(url)
    try:
        await nc.jetstream().add_stream(name=name, subjects=[f"{name.lower()}.>"])
    finally:
        await nc.close()
