"""Trace ownership on real processes (issue 46, bench/scale_out.py and bench/scale_churn.py
made small): the routed cluster east-1 + east-2 and leaf-1, four sidecar bridges in one
queue group (bridge i on server i mod 3), a publisher on east-2 sending bursts of 50 back to
back, an independent archiver whose truth scores every hop (`devkit.hop_truth`, never the
linker under test).

Each trace has one owner: every trace message of it is exported by that bridge alone,
wherever the queue group delivered it; and when the members change mid-traffic (a SIGTERM,
a SIGKILL, a newcomer), no link is ever wrong and only the killed bridge's holdings are lost."""

from __future__ import annotations

import argparse
import asyncio
from collections import defaultdict
from pathlib import Path

import pytest

from tests.bridge.bridge_helpers import load_bench

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

BURST = 50


@pytest.fixture(scope="module")
def scale_out():
    return load_bench("scale_out")


@pytest.fixture(scope="module")
def scale_churn():
    return load_bench("scale_churn")


def _args(**options) -> argparse.Namespace:
    args = argparse.Namespace(bridges=[4], mode="per_message", messages=600, rate=600.0, burst=BURST,
                              context_size=50, unnumbered=False, seed=46, warm_s=1.5, idle_s=0.2, profile=False,
                              term_at=0.33, kill_at=0.5, join_at=0.65, near_s=3.0, end_s=0.0, quiet_s=4.0,
                              lost_window=(3.0, 1.0), deny_exchange=False)
    vars(args).update(options)
    return args


def _sidecars(scale_out, tmp_path: Path, **options):
    """One run of 4 sidecars (`scale_out.one_run`); its notes (what went wrong); every output's
    (span id, trace id) of each server span, by output file."""
    run = asyncio.run(scale_out.one_run(4, _args(**options), tmp_path))
    notes = run.notes
    outputs = {path.name: scale_out.output_spans(path) for path in sorted(tmp_path.glob("spans-*.otlp.jsonl"))}
    return run, notes, outputs


def _exported_once_by_one_owner(outputs: dict[str, list[tuple[bytes, bytes]]], trace_messages: int) -> dict:
    """Every trace message's server span written once, all of one trace's in one output."""
    written = [span_id for spans in outputs.values() for span_id, _ in spans]
    assert len(written) == len(set(written)) == trace_messages, (len(written), len(set(written)), trace_messages)
    files_of: dict[bytes, set[str]] = defaultdict(set)
    for name, spans in outputs.items():
        for _, trace_id in spans:
            files_of[trace_id].add(name)
    shared = {trace_id.hex(): sorted(names) for trace_id, names in files_of.items() if len(names) > 1}
    assert not shared, (len(shared), list(shared.items())[:5])
    return files_of


def test_a_traceparent_per_message_is_linked_and_exported_by_its_owner_alone(scale_out, tmp_path):
    run, notes, outputs = _sidecars(scale_out, tmp_path)
    assert not notes, notes
    assert run.trace_messages == 600 * 3
    assert run.counts["right"] == run.hops == 1200, run.counts  # two hops a message
    files_of = _exported_once_by_one_owner(outputs, run.trace_messages)
    assert len(files_of) == 600  # one trace a message
    # The queue group spread each burst over the four; the owners got the rest forwarded,
    # and all four owned traces (a 64-point ring: each member about a quarter).
    assert run.forwarded > 0, run.forwarded
    assert sum(1 for spans in outputs.values() if spans) == 4, {name: len(s) for name, s in outputs.items()}


def test_signed_forwards_with_the_exchange_key(scale_out, tmp_path, monkeypatch):
    """Every bridge with the same `link.exchange_key_file`: the forwards are signed and
    taken (all linked, none refused); a bridge with another key would refuse them."""
    key = tmp_path / "exchange.key"
    key.write_bytes(b"k" * 32)
    monkeypatch.setenv("NATS_OTEL_LINK__EXCHANGE_KEY_FILE", str(key))
    run, notes, outputs = _sidecars(scale_out, tmp_path, messages=300)
    assert not notes, notes
    assert run.counts["right"] == run.hops == 600, run.counts
    _exported_once_by_one_owner(outputs, run.trace_messages)
    assert run.forwarded > 0 and run.forged == 0, (run.forwarded, run.forged)


def test_one_traceparent_for_a_stream_of_alike_bursts(scale_out, tmp_path):
    """600 alike messages (no header of their own) under one traceparent: one owner links
    them all by order, as one bridge would; never a wrong link."""
    run, notes, outputs = _sidecars(scale_out, tmp_path, mode="back_to_back", context_size=600, unnumbered=True)
    assert not notes, notes
    counts = run.counts
    assert counts["wrong"] == 0 and counts["missing"] == 0, counts
    assert counts["right"] >= 0.99 * run.hops, counts
    files_of = _exported_once_by_one_owner(outputs, run.trace_messages)
    assert len(files_of) == 1  # one trace, one owner's output
    assert run.forwarded > 0, run.forwarded


def test_ad_hoc_bursts_to_one_destination(scale_out, tmp_path):
    """Ad hoc, one `Nats-Trace-Dest` for all (owned by the arrival subject's owner), bursts
    of alike messages back to back: never a wrong link."""
    run, notes, outputs = _sidecars(scale_out, tmp_path, mode="adhoc_back_to_back", context_size=BURST,
                                    unnumbered=True)
    assert not notes, notes
    counts = run.counts
    assert counts["wrong"] == 0 and counts["missing"] == 0, counts
    written = [span_id for spans in outputs.values() for span_id, _ in spans]
    assert len(written) == len(set(written)) == run.trace_messages
    # Every report arrives on the one ad-hoc subject: one owner writes them all.
    assert sum(1 for spans in outputs.values() if spans) == 1, {name: len(s) for name, s in outputs.items()}


@pytest.mark.parametrize("exchange", ["denied", "off"])
def test_bridges_that_cannot_hear_each_other_never_link_wrong(scale_out, tmp_path, monkeypatch, exchange):
    """A queue group whose bridges cannot hear each other on the link exchange (their user
    may not publish there, or `--link-exchange off`) does not know its members: none vouches
    (`wholeness.members_known`), so alike messages link by their numbers alone. Before that
    guard this scenario read 548 of 1,200 hops wrong (denied) and 392 (off)."""
    if exchange == "off":
        monkeypatch.setenv("NATS_OTEL_LINK__EXCHANGE", '"off"')
    run, notes, _ = _sidecars(scale_out, tmp_path, mode="adhoc_back_to_back", context_size=BURST,
                              unnumbered=True, deny_exchange=exchange == "denied")
    assert run.trace_messages == 600 * 3, notes
    assert run.counts["wrong"] == 0 and run.counts["missing"] == 0, (run.counts, notes)


def test_membership_changes_mid_traffic_lose_only_what_the_killed_bridge_held(scale_churn, tmp_path):
    """Four sidecars, 800 messages over 8 s (bursts of 50 every 0.5 s). At 2 s bridge 1 gets
    SIGTERM (goodbye, drain), at 3 s bridge 2 gets SIGKILL, at 3.3 s a fifth bridge starts and
    joins. No link is wrong; the SIGTERMed bridge exits 0 having lost nothing; what is lost,
    the killed bridge held; the newcomer, once ready, is delivered its share and owns traces.
    (The traffic runs 4.7 s past the newcomer's start: ready in ~0.9 s with two CPU hogs here,
    it once took past the end of a 6 s traffic in a loaded CI run, and got nothing.)

    The bound, from the killed bridge's own counters scraped just before its SIGKILL: it held
    what it had received (`messages_received`, from NATS, plus `routed{received}`, forwarded to
    it) minus what it forwarded on to the owners (`routed{forwarded}`) and minus the server
    spans it had written (its output file outlives it: one span a trace message). Between the
    scrape and the SIGKILL (under one burst interval, asserted) at most one burst can have
    reached it or been on its way to it: 3 trace messages a message (east-2, east-1, leaf-1).
    So lost <= held + 3 * 50. A survivor that lost a trace message would show as lost beyond
    that, and as lost away from the kill: every lost trace message must have been reported
    by its server within [kill - 3 s, kill + 1 s] (a link window and an export before it)."""
    args = _args(messages=800, rate=100.0, term_at=2 / 8, kill_at=3 / 8, join_at=3.3 / 8)
    run = asyncio.run(scale_churn.churn_run(args, tmp_path))
    termed, killed = run.member("sigterm"), run.member("sigkill")
    detail = (run.counts, run.near, run.far, run.notes,
              [(m.bridge.server, m.fate, m.code, m.written, scale_churn.held_of(m.metrics, 0),
                {k.split('"')[1]: v for k, v in m.metrics.items() if k.startswith("nats_otel_routed_total")})
               for m in run.members],
              {"lost": run.lost, "killed_owned": run.lost_killed_owned, "near_kill": run.lost_near_kill,
               "held": run.killed_held, "gap_s": run.kill_gap_s},
              scale_churn.timeline(run))
    assert run.trace_messages == args.messages * 3, detail
    assert not run.notes, detail  # every bridge but the killed exited 0; all heard on the exchange
    assert termed.code == 0 and killed.code == -9, detail
    assert run.counts["wrong"] == 0, detail
    assert run.kill_gap_s < BURST / args.rate, detail
    assert run.lost <= run.killed_held + 3 * BURST, detail
    assert run.lost_near_kill == run.lost, detail
    # The newcomer joined mid-traffic: the queue group delivered to it, and it owned traces.
    joined = run.member("joined")
    assert scale_churn.held_of(joined.metrics, 0) > 0 and joined.written > 0, detail


def test_an_alike_stream_under_one_traceparent_through_membership_changes(scale_churn, tmp_path):
    """One traceparent for 600 alike messages over 12 s (bursts of 50 every second) while bridge
    1 gets SIGTERM at 2.5 s, bridge 2 SIGKILL at 3.5 s and a fifth starts at 4 s: never a wrong
    link (a SIGTERMed owner decides its held batches a link window after they arrived, as at
    any time), and once the members agree again (3 s after the last change was done: the
    SIGTERMed bridge gone, the newcomer ready; it routes after listening 1.2 s, and its view
    spreads with the next heartbeats) the owner links each burst by order again, but the
    stream's last. (Counted from the newcomer's start instead, the burst 2 s after it fell
    either side of the bound and was ambiguous in 1 of ~4 fresh-clone CI runs.) The last burst
    is counted apart (`end_s`): no report follows it, so the members vouch for the stretch
    after it by heartbeats alone (every 0.1 s for 2 s after their last evidence), most likely
    one of them late on a loaded machine: 100 hops `ambiguous` (a burst's), never wrong, in 2
    of 5 fresh-clone CI runs (2026-11-30; in the run that located them the last was message
    599, the stream's last, at 11.0 s, the changes done at 4.8 s). (A stream that never
    pauses for a hop window has no proven start after a change, as for a bridge that starts
    mid-stream: it stays `ambiguous`, never wrong; docs/scale-out.md.)"""
    args = _args(rate=50.0, messages=600, mode="back_to_back", context_size=600, unnumbered=True,
                 term_at=2.5 / 12, kill_at=3.5 / 12, join_at=4.0 / 12, near_s=3.0, end_s=0.5)
    run = asyncio.run(scale_churn.churn_run(args, tmp_path))
    detail = (run.counts, run.near, run.far, run.far_where, run.notes, run.lost, run.killed_held,
              [(m.bridge.server, m.fate, m.code, m.written) for m in run.members])
    assert run.trace_messages == 600 * 3 and not run.notes, detail
    assert run.counts["wrong"] == 0, detail
    far = sum(run.far.values())
    assert far > 0 and run.far["right"] >= 0.99 * far, detail
