"""Which core the bridge runs (`engine`: the info metric, the worker processes, the
environment switch), what the kernel hands to the reference (counted from 0 per stage),
and how the worker processes get their messages (once each)."""

from __future__ import annotations

import asyncio
import os
import platform
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from nats_otel.bridge.accounting import BatchAccounting
from nats_otel.bridge.processor import BatchOutcome
from nats_otel.bridge.readiness import BackendReadiness
from nats_otel.bridge.settings import TelemetrySettings, load_settings
from nats_otel.bridge.telemetry import Metrics
from nats_otel.bridge.workers import WorkerPool
from nats_otel.core import accel, engine
from nats_otel.core.pipeline import Converted, convert_batch
from nats_otel.devkit.receivers import OTLPGrpcReceiver

_CORE_INFO = "nats_otel_core_info"
_CORE_REFERENCE = "nats_otel_core_reference_total"
_STAGES = ("prepare", "map", "network", "request")


@contextmanager
def worker_pool(workers: int = 2) -> Iterator[WorkerPool]:
    """Started worker processes exporting to a real OTLP/gRPC receiver."""
    with OTLPGrpcReceiver() as rx:
        settings = load_settings(overrides={
            "sources": [{"name": "a", "urls": ["nats://127.0.0.1:4222"], "subjects": ["t"]}],
            "otlp": {"endpoint": rx.endpoint}, "batch": {"workers": workers}}, env={})
        pool = WorkerPool(settings, workers)
        pool.start()
        try:
            yield pool
        finally:
            pool.close()


def test_metrics_expose_the_core_in_use():
    metrics = Metrics()
    running = engine.implementation()
    assert running == ("python" if accel.NO_EXTENSIONS else "compiled"), engine.unavailable()
    assert metrics.value(_CORE_INFO, {"implementation": running}) == 1.0
    other = "python" if running == "compiled" else "compiled"
    assert metrics.registry.get_sample_value(_CORE_INFO, {"implementation": other}) is None


def test_metrics_expose_the_version_from_the_package_metadata():
    from importlib.metadata import version

    import nats_otel

    metrics = Metrics()
    labels = {"version": version("nats-otel"), "python": platform.python_version(), "core": engine.implementation()}
    assert nats_otel.__version__ == labels["version"]
    assert metrics.value("nats_otel_build_info", labels) == 1.0


def test_what_the_kernel_hands_to_the_reference_is_counted_from_zero_by_stage():
    metrics = Metrics()
    accounting = BatchAccounting(metrics, TelemetrySettings(), BackendReadiness([]))
    sample = metrics.registry.get_sample_value
    assert {stage: sample(_CORE_REFERENCE, {"stage": stage}) for stage in _STAGES} == dict.fromkeys(_STAGES, 0.0)
    accounting.account(BatchOutcome([], handed={"prepare": 2, "request": 1}))
    accounting.account(BatchOutcome([], handed={"prepare": 1}))
    assert {stage: sample(_CORE_REFERENCE, {"stage": stage}) for stage in _STAGES} == {
        "prepare": 3.0, "map": 0.0, "network": 0.0, "request": 1.0}


def test_worker_processes_run_the_same_core_as_the_bridge():
    with worker_pool() as pool:
        assert [w.implementation for w in pool._workers] == [engine.implementation()] * 2


def test_observed_batches_are_processed_by_token_and_others_whole(corpus_raws):
    with worker_pool() as pool:
        sent: list[object] = []
        for worker in pool._workers:  # record what goes down each pipe
            original = worker.submit
            worker.submit = (lambda batch_id, items, deadline, holdable, original=original:  # type: ignore[method-assign]
                             sent.append(items) or original(batch_id, items, deadline, holdable))
        observed, unobserved = list(corpus_raws), list(corpus_raws)
        pool.observe(observed)
        first = asyncio.run(pool.process(observed, None))
        second = asyncio.run(pool.process(unobserved, None))  # no longer remembered: sent whole
    assert pool._observed == {}
    assert [type(items) for items in sent] == [int, int, list, list]
    expected = sum(len(r.spans) for r in convert_batch(corpus_raws) if isinstance(r, Converted))
    for outcomes in (first, second):
        assert sum(outcome.span_count for _, outcome in outcomes) == expected
        # The corpus is all the kernel's own work: nothing handed to the reference (and the
        # reference hands nothing on).
        assert [outcome.handed for _, outcome in outcomes] == [{}] * len(outcomes)
        assert sorted(p for positions, _ in outcomes for p in positions) == list(range(len(corpus_raws)))


def test_the_environment_variable_forces_the_python_core():
    code = ("from nats_otel.bridge.telemetry import Metrics; "
            "print(Metrics().value('nats_otel_core_info', {'implementation': 'python'}))")
    env = {**os.environ, "NATS_OTEL_NO_EXTENSIONS": "1"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "1.0"
