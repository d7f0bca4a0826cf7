"""End to end in a real trace backend: the demo exports to Arize Phoenix over OTLP/gRPC, and
Phoenix's own REST API must show producer -> NATS server/egress spans -> consumer as one
trace per message with the right parents.

Phoenix is installed in a venv of its own (see tests/e2e/phoenix.py and the README); the
test skips only when no `phoenix` executable is found.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.phoenix import ENV_VAR, Phoenix, find_phoenix, start_phoenix

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def phoenix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Phoenix]:
    binary = find_phoenix()
    if binary is None:
        hint = "(python3 -m venv .venv-phoenix && .venv-phoenix/bin/pip install arize-phoenix)"
        if os.environ.get("CI"):
            # .ci/run installs Phoenix: in CI a missing backend is a failure, not a skip.
            pytest.fail(f"Arize Phoenix not found in CI: {hint}")
        pytest.skip(f"Arize Phoenix not installed: set {ENV_VAR} to its `phoenix` executable "
                    "(python3 -m venv .venv-phoenix && .venv-phoenix/bin/pip install arize-phoenix)")
    running = start_phoenix(binary, tmp_path_factory.mktemp("phoenix"))
    try:
        yield running
    finally:
        running.stop()


def _trace_ids(path: Path) -> dict[str, int]:
    """trace id -> number of spans in the demo's OTLP/JSON file."""
    counts: dict[str, int] = defaultdict(int)
    for line in path.read_text().splitlines():
        for rs in json.loads(line)["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                for span in ss["spans"]:
                    counts[span["traceId"]] += 1
    return counts


def test_demo_trace_in_phoenix(phoenix: Phoenix, tmp_path: Path) -> None:
    output = tmp_path / "demo.otlp.jsonl"
    proc = subprocess.run(
        [sys.executable, "-m", "nats_otel.cli", "demo", "--messages", "2", "--output", str(output),
         "--otlp-endpoint", phoenix.grpc_endpoint, "--color", "never"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    expected = _trace_ids(output)
    assert len(expected) == 2

    # Phoenix ingests asynchronously: poll its API until every span is there.
    deadline = time.monotonic() + 60
    while True:
        by_trace: dict[str, list[dict]] = defaultdict(list)
        for span in phoenix.spans():
            by_trace[span["context"]["trace_id"]].append(span)
        if all(len(by_trace.get(t, [])) >= n for t, n in expected.items()) or time.monotonic() > deadline:
            break
        time.sleep(0.5)

    for trace_id, count in expected.items():
        spans = by_trace.get(trace_id, [])
        assert len(spans) == count, f"trace {trace_id}: {len(spans)} of {count} spans in Phoenix"
        by_id = {s["context"]["span_id"]: s for s in spans}
        nats_spans = [s for s in spans if "messaging.nats.account" in s["attributes"]]
        app = [s for s in spans if "messaging.nats.account" not in s["attributes"]]

        producer, = [s for s in app if s["name"] == "send demo.orders"]
        assert not producer["parent_id"], "the producer span is the root"
        consumers = [s for s in app if s["name"] == "process demo.orders"]
        assert len(consumers) == 2
        assert all(c["parent_id"] == producer["context"]["span_id"] for c in consumers)

        servers = [s for s in nats_spans if s["name"] == "receive demo.orders"]
        assert len(servers) == 4
        origin = [s for s in servers if "messaging.nats.trace.hop" not in s["attributes"]]
        assert len(origin) == 1 and origin[0]["parent_id"] == producer["context"]["span_id"]
        for server in servers:
            hop = server["attributes"].get("messaging.nats.trace.hop")
            if hop is None:
                continue
            egress = by_id[server["parent_id"]]
            assert egress["name"] == "send demo.orders" and egress["attributes"]["messaging.nats.trace.hop"] == hop
            assert "messaging.nats.account" in egress["attributes"]
            assert by_id[egress["parent_id"]]["name"] == "receive demo.orders"
        # Every NATS span hangs somewhere under the producer span.
        for span in nats_spans:
            node = span
            while node["parent_id"] in by_id:
                node = by_id[node["parent_id"]]
            assert node is producer
