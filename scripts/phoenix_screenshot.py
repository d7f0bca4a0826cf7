#!/usr/bin/env python3
"""How docs/images/phoenix-trace.png is made: one demo message, exported to Arize Phoenix,
photographed in Phoenix's trace view by headless Chromium.

    # once: Phoenix in its own venv, Chromium from Debian
    python3 -m venv .venv-phoenix && .venv-phoenix/bin/pip install arize-phoenix
    apt-get install -y chromium
    # then, from the repository root, with the project's venv:
    python scripts/phoenix_screenshot.py            # starts and stops its own Phoenix
    python scripts/phoenix_screenshot.py --phoenix-url http://127.0.0.1:6006 \
        --grpc-endpoint http://127.0.0.1:4317      # or uses a running one

Phoenix's UI lists the last 7 days by default, so the trace is made now, not replayed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from chromium_shot import find_chromium, screenshot  # noqa: E402 (the script's own folder)

from tests.e2e.phoenix import Phoenix, find_phoenix, get_json, start_phoenix  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--phoenix-url", help="a running Phoenix (default: start one)")
    parser.add_argument("--grpc-endpoint", help="its OTLP/gRPC endpoint (with --phoenix-url)")
    parser.add_argument("--output", type=Path, default=ROOT / "docs" / "images" / "phoenix-trace.png")
    parser.add_argument("--window-size", default="1600,1000")
    args = parser.parse_args()
    chromium = find_chromium()
    with tempfile.TemporaryDirectory(prefix="phoenix-shot-") as tmp:
        work = Path(tmp)
        started: Phoenix | None = None
        if args.phoenix_url:
            url, grpc = args.phoenix_url.rstrip("/"), args.grpc_endpoint
        else:
            binary = find_phoenix()
            if binary is None:
                sys.exit("phoenix not found: set NATS_OTEL_PHOENIX_BIN")
            started = start_phoenix(binary, work / "phoenix")
            url, grpc = started.url, started.grpc_endpoint
        try:
            out = work / "demo.otlp.jsonl"
            subprocess.run([sys.executable, "-m", "nats_otel.cli", "demo", "--messages", "1", "--output",
                            str(out), "--otlp-endpoint", grpc, "--color", "never"], check=True, cwd=work)
            line = json.loads(out.read_text().splitlines()[0])
            trace_id = line["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["traceId"]
            project = next(p["id"] for p in get_json(f"{url}/v1/projects")["data"] if p["name"] == "default")
            deadline = time.monotonic() + 30
            while True:
                spans = [s for s in get_json(f"{url}/v1/projects/default/spans?limit=1000")["data"]
                         if s["context"]["trace_id"] == trace_id]
                servers = [s for s in spans
                           if s["attributes"].get("messaging.nats.trace.hop") and s["name"].startswith("receive")]
                if len(servers) >= 3:
                    break
                if time.monotonic() > deadline:
                    sys.exit(f"trace {trace_id} did not show up in Phoenix")
                time.sleep(0.5)
            # Select the deepest NATS hop (the leafnode's server span): its attributes show
            # where the message went, next to the tree.
            deepest = max(servers, key=lambda s: len(s["attributes"]["messaging.nats.trace.hop"]))
            page = f"{url}/projects/{project}/traces/{trace_id}?selectedSpanNodeId={deepest['id']}"
            screenshot(chromium, page, args.output, args.window_size, work)
        finally:
            if started is not None:
                started.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
