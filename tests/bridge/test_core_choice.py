"""Which core the bridge runs: the info metric, the worker processes, the environment switch."""

from __future__ import annotations

import os
import subprocess
import sys

from nats_otel.bridge.settings import load_settings
from nats_otel.bridge.telemetry import Metrics
from nats_otel.bridge.workers import WorkerPool
from nats_otel.core import accel
from nats_otel.devkit.receivers import OTLPGrpcReceiver

_CORE_INFO = "nats_otel_core_info"


def test_metrics_expose_the_core_in_use():
    metrics = Metrics()
    running = accel.implementation()
    assert metrics.value(_CORE_INFO, {"implementation": running}) == 1.0
    other = "python" if running == "compiled" else "compiled"
    assert metrics.registry.get_sample_value(_CORE_INFO, {"implementation": other}) is None


def test_worker_processes_run_the_same_core_as_the_bridge():
    with OTLPGrpcReceiver() as rx:
        settings = load_settings(overrides={
            "sources": [{"name": "a", "urls": ["nats://127.0.0.1:4222"], "subjects": ["t"]}],
            "otlp": {"endpoint": rx.endpoint}, "batch": {"workers": 2}}, env={})
        pool = WorkerPool(settings, 2)
        pool.start()
        try:
            assert [w.implementation for w in pool._workers] == [accel.implementation()] * 2
        finally:
            pool.close()


def test_the_environment_variable_forces_the_python_core():
    code = ("from nats_otel.bridge.telemetry import Metrics; "
            "print(Metrics().value('nats_otel_core_info', {'implementation': 'python'}))")
    env = {**os.environ, "NATS_OTEL_NO_EXTENSIONS": "1"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "1.0"
