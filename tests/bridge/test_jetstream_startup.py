"""A JetStream-mode bridge started with its servers (a pod, `docker compose up`), with real
processes: it waits for NATS to listen and then for JetStream to answer, for a bounded time.

* started before its cluster: nothing listens, then one of two JetStream servers (no meta
  leader: JetStream does not answer), then the second: the bridge waits through all of it,
  logging each retry with its reason and saying why in `/readyz`, and exports;
* JetStream never answers (a server without it): `nats-otel bridge` exits with code 2 and
  the fatal message, after `--jetstream-startup-wait` seconds (at once with 0).
"""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from nats_otel.bridge.loop import Bridge
from nats_otel.bridge.settings import load_settings
from nats_otel.devkit.processes import prepare_topology, start_topology
from nats_otel.devkit.receivers import OTLPGrpcReceiver
from nats_otel.devkit.topology import Topology, cluster, single_server
from tests.bridge.bridge_helpers import bridge_counts, publish_traced, stop_bridge, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

WAITING = "JetStream does not answer yet; waiting"
DOES_NOT_ANSWER = "JetStream does not answer in this account (not enabled for it?)"


async def test_bridge_started_before_its_cluster_waits_and_exports(tmp_path: Path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="nats_otel")
    # Two JetStream servers: one alone elects no meta leader, so its JetStream does not answer.
    spec = Topology(servers=cluster("east", 2, jetstream=(1, 2)))
    with prepare_topology(spec, tmp_path / "nats") as topo, OTLPGrpcReceiver() as rx:
        url = topo.client_url("east-1")
        settings = load_settings(env={}, overrides={
            "mode": "jetstream", "sources": [{"urls": [url], "subjects": ["trace.a"]}],
            "jetstream": {"create_stream": True}, "otlp": {"endpoint": rx.endpoint},
        })
        bridge = Bridge(settings)
        task = asyncio.create_task(bridge.run())
        try:
            await wait_until(lambda: "connection refused" in bridge.ready()[1], 15, "connect attempts refused",
                             detail=lambda: bridge.ready()[1])
            topo.launch("east-1")
            await wait_until(lambda: "waiting for JetStream" in bridge.ready()[1] or task.done(), 30,
                             "the bridge connected and waiting for JetStream", detail=lambda: bridge.ready()[1])
            assert not task.done(), task.result()
            topo.launch("east-2")
            # Ready within its startup wait, or exited (code 2) past it: waiting longer than
            # the setting would prove nothing, so the test waits for one or the other.
            await wait_until(lambda: bridge.ready()[0] or task.done(), settings.jetstream.startup_wait + 30,
                             "bridge ready", detail=lambda: bridge.ready()[1])
            assert not task.done(), task.result()
            ids = await publish_traced(url, 20)
            await wait_until(lambda: {s.trace_id.hex() for _, s in rx.spans()} >= set(ids), 20,
                             "spans of every traced message", detail=lambda: bridge_counts(bridge))
        finally:
            assert await stop_bridge(bridge, task) == 0
    retries = [r.fields for r in caplog.records if r.getMessage() == WAITING]  # type: ignore[attr-defined]
    assert retries, "no retry was logged"
    for fields in retries:
        assert fields["reason"].startswith(("no answer in time", "no responders", "unavailable")), fields
        assert fields["source"] == "default" and fields["url"] == url.replace("a:pwd@", "")
        assert 0 < fields["retry_in"] <= 2.0 and fields["waited"] < fields["startup_wait"] == 30
    assert any(r.getMessage() == "JetStream answers" for r in caplog.records)


@pytest.fixture(scope="module")
def server_without_jetstream() -> Iterator[str]:
    with start_topology(single_server(jetstream=False)) as running:
        yield running.client_url("n1")


async def run_bridge_process(tmp_path: Path, url: str, *args: str, timeout: float) -> tuple[int, list[dict], str]:
    """`nats-otel bridge --mode jetstream` until it exits: (exit code, JSON log lines, log text)."""
    log = tmp_path / "bridge.log"
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "nats_otel.cli", "bridge", "--mode", "jetstream", "--nats-url", url,
             "--subject", "trace.a", "--output", str(tmp_path / "o.jsonl"), *args],
            stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
        try:
            code = await asyncio.to_thread(proc.wait, timeout)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(5)
    text = log.read_text()
    return code, [json.loads(line) for line in text.splitlines() if line.startswith("{")], text


@pytest.mark.parametrize("wait", [0.0, 2.0])
async def test_no_jetstream_exits_2_after_the_wait(server_without_jetstream: str, tmp_path: Path,
                                                   wait: float) -> None:
    code, lines, text = await run_bridge_process(tmp_path, server_without_jetstream, "--create-stream",
                                                 "--jetstream-startup-wait", str(wait), timeout=wait + 30)
    assert code == 2, text
    fatal = [x["msg"] for x in lines if x["level"] == "error"]
    assert len(fatal) == 1 and DOES_NOT_ANSWER in fatal[0], fatal
    waited = float(fatal[0].split("; waited ")[1].split("s")[0])
    assert waited >= wait, fatal[0]  # a slower machine only waits longer
    assert f"(jetstream.startup_wait {wait:g}s)" in fatal[0]
    retries = [x for x in lines if x["msg"] == WAITING]
    if wait == 0:
        assert retries == []
        return
    # One line per retry, each with its reason; the pace doubles from 0.25 s (jittered),
    # so 2 s hold at most 5 retries, not one per 100 ms. The last attempt is made at the end
    # of the wait, not after it: the last retry is due at the wait's end (its own fields,
    # rounded), and none is logged once the wait is over. Counted in attempts and the
    # bridge's own figures: a slower machine makes fewer attempts, never a later last one.
    assert 1 <= len(retries) <= 5, retries
    assert all(r["waited"] < wait for r in retries), retries
    assert retries[-1]["waited"] + retries[-1]["retry_in"] <= wait + 0.06, retries[-1]
    assert all(r["reason"].startswith("no responders") and r["error"] for r in retries), retries
    assert [r["attempts"] for r in retries] == list(range(1, len(retries) + 1))
    assert "Traceback" not in text


async def test_missing_stream_is_fatal_at_once_whatever_the_wait(tmp_path: Path) -> None:
    """JetStream answers that the stream does not exist (and the bridge may not create it):
    waiting would not change that, so the bridge exits at once, as before."""
    with start_topology(single_server(jetstream=True), tmp_path / "nats") as topo:
        code, lines, text = await run_bridge_process(tmp_path, topo.client_url("n1"),
                                                     "--jetstream-startup-wait", "60", timeout=90)
    # At once: not one retry logged, no "waited" in the message (one that waited 60 s for
    # nothing would have logged its retries); counted, not timed.
    assert code == 2, text
    fatal = [x["msg"] for x in lines if x["level"] == "error"]
    missing = "fatal: stream 'NATS_TRACES' not found in source 'default''s account; create it or pass --create-stream"
    assert fatal == [missing], fatal
    assert not [x for x in lines if x["msg"] == WAITING]
