"""`batch.cpu_affinity`: the plan (pure), the setting's checks, and `nats-otel bridge` as a
process with it on: every thread of the bridge, and of each worker process, on the CPU the
plan gives, its spans exported as without it; a CPU the bridge may not use is a clear error.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from nats_otel.bridge.cpu_affinity import AffinityPlan, check_setting, parse_cpus, plan
from nats_otel.bridge.settings import SettingsError, load_settings
from nats_otel.devkit.processes import start_topology
from nats_otel.devkit.receivers import OTLPGrpcReceiver
from nats_otel.devkit.server_config import free_ports
from nats_otel.devkit.topology import single_server
from tests.bridge.bridge_helpers import publish_traced, wait_until
from tests.bridge.test_bursts import _children, bridge_process, ready, stop_process

ROOT = Path(__file__).resolve().parents[2]
ALLOWED = frozenset(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else frozenset()
needs_affinity = pytest.mark.skipif(not ALLOWED, reason="needs Linux's sched_setaffinity")


@pytest.mark.parametrize(("text", "cpus"), [("3", (3,)), ("0-3", (0, 1, 2, 3)), ("0, 2-3", (0, 2, 3)),
                                            ("2,0,2", (2, 0)), ("1-1", (1,))])
def test_cpu_lists_parse_in_the_order_written(text, cpus):
    assert parse_cpus(text) == cpus


@pytest.mark.parametrize("text", ["", "x", "-1", "1-", "3-1", "1,,2", "1.5", "0-99999", "auto,1"])
def test_what_is_not_a_cpu_list_is_refused_with_the_form(text):
    with pytest.raises(ValueError, match="not a CPU list"):
        parse_cpus(text)


def test_the_plan_places_the_bridge_first_then_each_worker_in_turn():
    allowed = frozenset({0, 1, 2, 5})
    assert plan("off", allowed) == AffinityPlan(None, ())
    assert plan("off", allowed, workers=3) == AffinityPlan(None, (None, None, None))
    # auto: the highest CPU first (the lowest are where interrupts and other work tend to be)
    assert plan("auto", allowed) == AffinityPlan(frozenset({5}), ())
    assert plan("auto", allowed, workers=4) == AffinityPlan(
        frozenset({5}), (frozenset({2}), frozenset({1}), frozenset({0}), frozenset({5})))
    assert plan("1,5", allowed, workers=2) == AffinityPlan(frozenset({1}), (frozenset({5}), frozenset({1})))
    assert plan(" AUTO ", allowed).bridge == frozenset({5})


def test_a_cpu_the_process_may_not_use_is_named_in_the_error():
    with pytest.raises(ValueError, match=r"CPU 3, 7 not among the CPUs this process may use \(0,1\)"):
        plan("1,3,7", frozenset({0, 1}))
    with pytest.raises(ValueError, match="no CPU at all"):
        plan("auto", frozenset())


SOURCE = {"sources": [{"urls": ["nats://127.0.0.1:4222"], "subjects": ["trace.a"]}]}


def test_the_setting_is_checked_where_settings_are_loaded():
    assert check_setting(" Off ") == "off"
    assert load_settings(overrides=SOURCE, env={}).batch.cpu_affinity == "off"  # the default
    assert load_settings(overrides={**SOURCE, "batch": {"cpu_affinity": "0-1"}}, env={}).batch.cpu_affinity == "0-1"
    assert load_settings(overrides=SOURCE, env={"NATS_OTEL_BATCH__CPU_AFFINITY": "Auto"}).batch.cpu_affinity == "auto"
    with pytest.raises(SettingsError, match=r"batch\.cpu_affinity.*not a CPU list: 'every'"):
        load_settings(overrides=SOURCE, env={"NATS_OTEL_BATCH__CPU_AFFINITY": "every"})


@pytest.mark.parametrize(("text", "setting"), [("off", "off"), ("'off'", "off"), ("auto", "auto"), ("3", "3"),
                                               ("0-1", "0-1")])
def test_the_yaml_forms_a_user_writes(tmp_path: Path, text: str, setting: str):
    # YAML reads a bare `off` as false and `3` as a number: both mean what they say
    config = tmp_path / "bridge.yaml"
    config.write_text(f"sources: [{{subjects: [trace.a]}}]\nbatch: {{cpu_affinity: {text}}}\n")
    assert load_settings(config, env={}).batch.cpu_affinity == setting


@pytest.mark.parametrize(("text", "problem"), [("on", "on/true is not a placement"), ("-1", "not a CPU list")])
def test_the_yaml_forms_that_say_too_little(tmp_path: Path, text: str, problem: str):
    config = tmp_path / "bridge.yaml"
    config.write_text(f"sources: [{{subjects: [trace.a]}}]\nbatch: {{cpu_affinity: {text}}}\n")
    with pytest.raises(SettingsError, match=rf"field 'batch.cpu_affinity': .*{problem}"):
        load_settings(config, env={})


def _threads_cpus(pid: int) -> dict[int, str]:
    """Each thread of `pid` -> its Cpus_allowed_list."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            status = (task / "status").read_text()
        except OSError:  # a thread that just ended
            continue
        out[int(task.name)] = next(line.split(":", 1)[1].strip() for line in status.splitlines()
                                   if line.startswith("Cpus_allowed_list:"))
    return out


@needs_affinity
@pytest.mark.integration
@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers", [1, 2])
async def test_every_thread_runs_on_the_planned_cpu_and_the_spans_arrive(tmp_path: Path, workers: int) -> None:
    expected = plan("auto", ALLOWED, workers)
    (port,) = free_ports(1)
    with start_topology(single_server(), tmp_path / "nats") as topo, OTLPGrpcReceiver() as rx:
        url = topo.client_url("n1", "a")
        log = open(tmp_path / "bridge.log", "wb")  # noqa: SIM115 - closed below
        bridge = bridge_process(url, rx.endpoint, port, log, "--cpu-affinity", "auto", "--workers", str(workers))
        try:
            await wait_until(lambda: ready(port), 60, "bridge ready")
            await publish_traced(url, 20, subject="app.work")
            await wait_until(lambda: rx.span_count >= 40, 30, "the spans of 20 traced messages")
            placed = {"bridge": set(_threads_cpus(bridge.pid).values())}
            # the worker processes (multiprocessing's spawned children; not its resource tracker)
            kids = [kid for kid in _children(bridge.pid) if b"--multiprocessing-fork" in _cmdline(kid)]
            assert len(kids) == (workers if workers > 1 else 0), kids
            placed["workers"] = sorted(tuple(sorted(set(_threads_cpus(kid).values()))) for kid in kids)
        finally:
            code = stop_process(bridge)
            log.close()
    assert code == 0, (tmp_path / "bridge.log").read_text()
    assert placed["bridge"] == {str(min(expected.bridge or ()))}, placed  # every thread, the one CPU
    if workers > 1:
        assert placed["workers"] == sorted((str(min(cpus or ())),) for cpus in expected.workers), placed
    assert rx.span_count >= 40


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


@needs_affinity
def test_a_cpu_outside_the_allowed_set_stops_the_bridge_with_exit_code_2(tmp_path: Path) -> None:
    outside = max(ALLOWED) + 1
    done = subprocess.run(
        [sys.executable, "-m", "nats_otel.cli", "bridge", "--nats-url", "nats://127.0.0.1:1", "--subject", "t",
         "--cpu-affinity", str(outside)],
        capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.returncode == 2
    assert f"CPU {outside} not among the CPUs this process may use" in done.stderr


@needs_affinity
def test_off_pins_nothing():
    # The CLI's step with the default: this process's placement unchanged.
    from nats_otel.commands.bridge import pin_processes

    before = frozenset(os.sched_getaffinity(0))
    pin_processes(load_settings(overrides=SOURCE, env={}))
    assert frozenset(os.sched_getaffinity(0)) == before
