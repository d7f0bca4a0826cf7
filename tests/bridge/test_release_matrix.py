"""The compatibility matrix (issue 45): the live hop-link scenarios of `test_hop_links.py` against
the real servers of every supported release (`devkit.server_releases.RELEASES`): a traceparent
per message, bursts under one traceparent, ad hoc bursts to one fixed destination, and the
sidecar layout (three bridges in one queue group). The truth comes from an independent
archive by order per connection (`devkit.hop_truth`), never from the linker.

Marked `releases` and left out of the README's `pytest -q` (pyproject's addopts); `.ci/run`
installs the releases and runs `pytest -m releases`. A release not installed skips, with the
command that installs it."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

import pytest

from nats_otel.devkit.server_releases import RELEASES, install_hint, release_binary
from tests.bridge.bridge_helpers import load_bench

pytestmark = [pytest.mark.integration, pytest.mark.releases, pytest.mark.timeout(300)]

MESSAGES = 200  # 3 hops each: small, the matrix runs 4 cases on each release


@pytest.fixture(scope="module")
def hop_links():
    return load_bench("hop_links")


@pytest.fixture(params=RELEASES)
def release(request, monkeypatch):
    binary = release_binary(request.param)
    if binary is None:
        pytest.skip(install_hint(request.param))
    monkeypatch.setenv("NATS_SERVER_BIN", str(binary))  # find_nats_server: every server of the run
    return request.param


def _run(hop_links, tmp_path: Path, **options):
    args = argparse.Namespace(bridges=1, mode="per_message", messages=MESSAGES, batch_size=50, gap_ms=2.0, seed=45,
                              workers=1, unnumbered=False, batch_gap_ms=100.0, warm_s=1.0)
    vars(args).update(options)
    row, truth, archive = asyncio.run(hop_links.live_run(args, tmp_path))
    assert not truth.problems and not row.notes, (truth.problems, row.notes)
    return row, truth, archive


def _servers_ran(release: str, tmp_path: Path) -> None:
    """The servers of the run were that release (their logs say which version started)."""
    logs = " ".join(p.read_text(errors="replace") for p in (tmp_path / "nats").glob("*.log"))
    assert f"Version:  {release}" in logs, logs[:500]


def test_a_traceparent_per_message_links_every_hop(hop_links, release, tmp_path):
    row, _, _ = _run(hop_links, tmp_path)
    _servers_ran(release, tmp_path)
    assert row.result.counts["right"] == row.result.hops == 3 * MESSAGES, row.result.counts


@pytest.mark.parametrize("mode", ["back_to_back", "adhoc_back_to_back"])
def test_alike_bursts_link_whole_by_order(hop_links, release, tmp_path, mode):
    """Bursts of 50 alike messages back to back, 100 ms apart, under one traceparent or ad hoc
    to one fixed destination: every hop linked by order, none wrong."""
    row, _, _ = _run(hop_links, tmp_path, mode=mode, unnumbered=True)
    _servers_ran(release, tmp_path)
    counts = row.result.counts
    assert counts["wrong"] == 0 and counts["missing"] == 0, counts
    assert counts["right"] >= 0.99 * row.result.hops, counts


def test_sidecars_link_numbered_bursts_exactly(hop_links, release, tmp_path):
    """Three bridges in one queue group (the sidecar layout), bursts under one traceparent
    with a header per message: every hop linked live, and by `convert` of the archive with a
    tenth of its trace messages lost, none wrong."""
    row, truth, archive = _run(hop_links, tmp_path, bridges=3, mode="back_to_back")
    _servers_ran(release, tmp_path)
    assert row.result.counts["right"] == row.result.hops == 3 * MESSAGES, row.result.counts
    converted = hop_links.convert_row(truth, archive, 0.1, 45, tmp_path)
    counts = converted.result.counts
    assert counts["wrong"] == 0 and counts["right"] == converted.result.hops > 0, counts
