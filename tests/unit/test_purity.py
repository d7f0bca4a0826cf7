"""The pure core imports no NATS client, no Spark and no OpenTelemetry SDK."""

from __future__ import annotations

import subprocess
import sys

CORE = ["nats_otel.decode", "nats_otel.ids", "nats_otel.mapping", "nats_otel.encode", "nats_otel.pipeline", "nats_otel.reuse"]
FORBIDDEN = ("nats", "pyspark", "opentelemetry.sdk", "grpc", "asyncio")


def test_core_imports_nothing_with_io():
    code = (
        f"import sys\nfor m in {CORE!r}: __import__(m)\n"
        f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r} or m.startswith('opentelemetry.sdk'))\n"
        "print(','.join(bad))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == ""
