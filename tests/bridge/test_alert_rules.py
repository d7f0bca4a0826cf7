"""The alerts of config/prometheus/alerts.yml: valid rules, and each one's unit test
(alerts_test.yml: it fires on the series it is about, stays silent on the others), run by
Debian's promtool. That they name only metrics a real bridge exports, and evaluate without
error on a real Prometheus scraping real bridges, is checked in test_network_view.py."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

PROMETHEUS_CONFIG = Path(__file__).resolve().parents[2] / "config" / "prometheus"


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool not found: apt-get install prometheus (it ships promtool; .ci/run installs it)")
    return path


def test_the_rules_are_valid() -> None:
    done = subprocess.run([promtool(), "check", "rules", "alerts.yml"], cwd=PROMETHEUS_CONFIG,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 15 rules found" in done.stdout


def test_every_alert_fires_and_stays_silent_as_its_unit_test_says() -> None:
    done = subprocess.run([promtool(), "test", "rules", "alerts_test.yml"], cwd=PROMETHEUS_CONFIG,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    # Every alert is tested firing at least once (an alert left out could not fail here).
    rules = yaml.safe_load((PROMETHEUS_CONFIG / "alerts.yml").read_text())
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
    tests = yaml.safe_load((PROMETHEUS_CONFIG / "alerts_test.yml").read_text())["tests"]
    fired = {case["alertname"] for t in tests for case in t["alert_rule_test"] if case["exp_alerts"]}
    assert fired == alerts and len(alerts) == 9


def test_every_threshold_is_a_setting_the_alerts_read() -> None:
    rules = yaml.safe_load((PROMETHEUS_CONFIG / "alerts.yml").read_text())
    groups = {g["name"]: g["rules"] for g in rules["groups"]}
    settings = {r["record"] for r in groups["nats-otel-settings"]}
    used = {s for r in groups["nats-otel"] for s in settings if f"scalar({s})" in r["expr"]}
    assert used == settings and len(settings) == 6
    prometheus_yml = yaml.safe_load((PROMETHEUS_CONFIG / "prometheus.yml").read_text())
    assert prometheus_yml["rule_files"] == ["alerts.yml"]
