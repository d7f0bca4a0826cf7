"""Issue 46's membership-change check (moved out of bench/scale_out.py, whose topology,
bridges and traffic it shares; `python bench/scale_out.py --churn` still runs it).

8 bridges (`--bridges`' largest) in one core-mode queue group, bridge i on server i mod 3,
the traffic running; about a third of the way in one bridge gets SIGTERM (it says goodbye,
hands on what it receives, drains: it must exit 0 and lose nothing), a bit later another gets
SIGKILL (it takes what it held with it: the traces it owned, for about one link window, and
its intake), then a new bridge starts on one of the servers, in the same queue group, and
joins. It prints the links scored against the truth, near a change (`--near-s`) and
elsewhere, the spans lost (trace messages archived minus distinct server spans written), how
many of them belong to traces the killed bridge owned (the members' ring before the kill,
from the senders heard on the exchange) and the killed bridge's own bound: what it had
received (from NATS and forwarded to it) minus what it forwarded and what it wrote, scraped
just before the SIGKILL.

    python bench/scale_churn.py
    python bench/scale_churn.py --bridges 4 --messages 600 --rate 100 --join-at 0.55
    python bench/scale_churn.py --mode back_to_back --context-size 600 --unnumbered --rate 50
    python bench/scale_churn.py --jetstream

`--jetstream`: the bridges share one durable in JetStream mode, as `scale_out.py --jetstream`
runs them (on east-1 and east-2 alternately): at least once, so nothing may be lost, the
SIGKILLed bridge's fetched messages coming back after `jetstream.ack_wait`; the outputs are
final once they hold every archived trace message or have not grown for `--quiet-s` (45 s
by default here: longer than the ack wait).

Everything started is stopped again.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bridge_process import USER, Bridge, server_spans, wait_members, whole_lines
from hop_links import TRACE_SUBJECT, Archiver, archived, probe_interest, read_raws
from scale_out import (
    ARCHIVER,
    BRIDGE_SERVERS,
    DURABLE,
    JS_BRIDGE_SERVERS,
    PUBLISHER,
    STREAM,
    create_stream,
    output_spans,
    scale_topology,
    traffic_arguments,
)

from nats_otel.bridge.ownership import Ring
from nats_otel.bridge.sharding import shard_key
from nats_otel.core.decode import decode
from nats_otel.core.ids import identity
from nats_otel.devkit.hop_score import (
    AMBIGUOUS,
    MISSING,
    RIGHT,
    UNMATCHED,
    WRONG,
    read_otlp_json_lines,
    score,
)
from nats_otel.devkit.hop_traffic import TrafficOptions, run_traffic
from nats_otel.devkit.hop_truth import compute_truth
from nats_otel.devkit.processes import start_topology

EXCHANGE_SUBJECT = "nats-otel.links.nats-otel"  # `link.exchange` auto for the queue group nats-otel
_SENDER_HEADER = "Nats-Otel-Sender"


@dataclass
class Member:
    """One bridge of a churn run: its process, its member name (heard on the exchange), its fate."""

    bridge: Bridge
    index: int
    fate: str = "survivor"  # survivor, sigterm, sigkill, joined
    name: str = ""
    code: int | None = None
    # at the end (the SIGTERMed and the SIGKILLed: just before their signal)
    metrics: dict[str, float] = field(default_factory=dict)
    written: int = 0  # distinct server spans in its output


@dataclass
class ChurnRun:
    """What a churn run lost and how its links came out (see `churn_run`)."""

    bridges: int
    label: str
    trace_messages: int = 0
    written: int = 0  # distinct server spans over all outputs
    counts: dict[str, int] = field(default_factory=dict)
    # the hops arriving within `near_s` of a change (before its event, after it was done)
    near: dict[str, int] = field(default_factory=dict)
    far: dict[str, int] = field(default_factory=dict)
    hops: int = 0
    members: list[Member] = field(default_factory=list)
    events: dict[str, int] = field(default_factory=dict)  # sigterm, sigkill, joined -> wall-clock ns
    #: When each change was done, wall-clock ns: the SIGTERMed bridge exited, the newcomer was
    #: ready (serving and subscribed). The members' views change between a change's event and
    #: this (a slow start on a loaded machine can take seconds): "near" runs from one to the other.
    settled: dict[str, int] = field(default_factory=dict)
    far_where: str = ""  # where the hops away from the changes were left unlinked (`describe_unlinked`)
    traffic: tuple[int, int] = (0, 0)  # the traffic's start asked for and its report back, wall-clock ns
    lost_ids: set[bytes] = field(default_factory=set)
    lost_killed_owned: int = 0  # of the lost: their trace owned by the killed bridge before the kill
    lost_near_kill: int = 0  # of the lost: reported by a server within `lost_window` of the kill
    killed_held: int = 0  # the killed bridge's received + routed received - forwarded - written, at the kill
    kill_gap_s: float = 0.0  # from the start of its last scrape to its SIGKILL
    notes: list[str] = field(default_factory=list)

    @property
    def lost(self) -> int:
        return len(self.lost_ids)

    def member(self, fate: str) -> Member:
        return next(m for m in self.members if m.fate == fate)


def timeline(run: ChurnRun) -> dict[str, float]:
    """Seconds from the traffic's start to each change's event and end and to the traffic's
    end: what a failure needs to say when a change came too late for the traffic."""
    start = run.traffic[0]
    marks = {**run.events, **{f"{name} done": ns for name, ns in run.settled.items()}, "traffic end": run.traffic[1]}
    return {name: round((ns - start) / 1e9, 2) for name, ns in sorted(marks.items(), key=lambda item: item[1])}


def _metric_sum(metrics: dict[str, float], prefix: str) -> float:
    return sum(v for k, v in metrics.items() if k.startswith(prefix))


def held_of(metrics: dict[str, float], written: int) -> int:
    """What a bridge held, unwritten, when `metrics` were scraped: the trace messages it received
    (from NATS, and forwarded to it by the others) minus those it forwarded on to their owners
    and the server spans it wrote (one per trace message; its file outlives a SIGKILL)."""
    received = _metric_sum(metrics, "nats_otel_messages_received_total")
    routed_in = _metric_sum(metrics, 'nats_otel_routed_total{result="received"')
    forwarded = _metric_sum(metrics, 'nats_otel_routed_total{result="forwarded"')
    return max(0, int(received + routed_in - forwarded) - written)


async def churn_run(args: argparse.Namespace, workdir: Path) -> ChurnRun:
    """N bridges, the traffic; at `term_at`, `kill_at` and `join_at` (fractions of the traffic's
    planned time) SIGTERM bridge 1, SIGKILL bridge 2, start bridge N on server N mod 3."""

    n = max(args.bridges)
    options = TrafficOptions(mode=args.mode, messages=args.messages, batch_size=args.context_size,
                             batch_gap_ms=1000.0 * args.burst / args.rate, burst=args.burst, payload_size=200,
                             seed=args.seed, numbered=not args.unnumbered)
    subjects = [TRACE_SUBJECT] + ([options.adhoc_dest] if args.mode.startswith("adhoc") else [])
    context = f", context {args.context_size}" if args.mode == "back_to_back" else ""
    label = f"{args.mode}{context}, {'unnumbered' if args.unnumbered else 'numbered'}"
    run = ChurnRun(n, label)
    planned_s = args.messages / args.rate
    jetstream = getattr(args, "jetstream", False)
    topo = start_topology(scale_topology(args.deny_exchange, jetstream), workdir / "nats")
    servers, queue, extra = BRIDGE_SERVERS, "nats-otel", ()
    if jetstream:
        servers, queue, extra = JS_BRIDGE_SERVERS, None, ("--mode", "jetstream", "--stream", STREAM,
                                                         "--durable", DURABLE)
    archiver = Archiver(workdir / "archive.jsonl", subjects)
    probes: dict[str, Any] = {}
    senders: set[str] = set()
    killed_metrics: dict[str, float] = {}

    def new_member(i: int, fate: str) -> Member:
        server = servers[i % len(servers)]
        return Member(Bridge(workdir, f"{server}-b{i}", topo.client_url(server, USER), subjects, queue, 1, extra),
                      i, fate)

    try:
        nc = await archiver.start(topo.client_url(ARCHIVER, USER))
        if jetstream:
            await create_stream(topo, subjects)

        async def on_exchange(msg: Any) -> None:
            sender = (msg.headers or {}).get(_SENDER_HEADER)
            if sender:
                senders.add(sender)

        await nc.subscribe(EXCHANGE_SUBJECT, cb=on_exchange, pending_msgs_limit=1_000_000)
        for i in range(n):
            run.members.append(new_member(i, {1: "sigterm", 2: "sigkill"}.get(i, "survivor")))
        for m in run.members:
            m.bridge.wait_ready()
        run.notes += await wait_members([m.bridge for m in run.members])
        probes.update(await probe_interest(topo, {*BRIDGE_SERVERS, ARCHIVER}))
        await asyncio.sleep(args.warm_s)
        urls = {name: topo.client_url(name, USER) for name in topo.names}
        traffic = asyncio.create_task(run_traffic(urls[PUBLISHER], urls, options))
        started = time.monotonic()
        traffic_started = time.time_ns()

        async def at(fraction: float) -> None:
            await asyncio.sleep(max(0.0, started + fraction * planned_s - time.monotonic()))

        await at(args.term_at)
        termed = run.member("sigterm")
        termed.metrics = dict(await asyncio.to_thread(termed.bridge.metrics))  # just before its SIGTERM
        run.events["sigterm"] = time.time_ns()
        async def stop_termed() -> int | None:
            code = await asyncio.to_thread(termed.bridge.stop, 60.0)
            run.settled["sigterm"] = time.time_ns()
            return code

        term_task = asyncio.create_task(stop_termed())
        await at(args.kill_at)
        killed = run.member("sigkill")
        scraped = time.monotonic()
        killed_metrics = dict(await asyncio.to_thread(killed.bridge.metrics))
        killed.bridge.proc.kill()  # SIGKILL, this pid only
        run.events["sigkill"] = time.time_ns()
        run.kill_gap_s = time.monotonic() - scraped
        await asyncio.to_thread(killed.bridge.proc.wait)
        killed.metrics = killed_metrics
        await at(args.join_at)
        joined = new_member(n, "joined")
        run.members.append(joined)
        run.events["joined"] = time.time_ns()
        await asyncio.to_thread(joined.bridge.wait_ready)
        run.settled["joined"] = time.time_ns()
        report = await traffic
        run.traffic = (traffic_started, time.time_ns())  # its start asked for, its report back
        termed.code = await term_task
        if not report.complete:
            run.notes.append(f"subscribers missed messages: {report.received}")
        run.trace_messages = await archived(archiver, report.published * len(topo.names), run.notes)
        bridges = [m.bridge for m in run.members]
        # Written: everything but what was lost, which never comes. Wait until the outputs
        # stop growing (a link window and an export, twice over) or are complete.
        last, still_since = -1, time.monotonic()
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline:
            now_written = server_spans(bridges)
            if now_written >= run.trace_messages:
                break
            if now_written != last:
                last, still_since = now_written, time.monotonic()
            elif time.monotonic() - still_since > (args.quiet_s or (45.0 if jetstream else 4.0)):
                break
            await asyncio.sleep(0.25)
        for m in run.members:
            if m.fate not in ("sigterm", "sigkill"):
                m.metrics = dict(await asyncio.to_thread(m.bridge.metrics))
    finally:
        for m in run.members:
            code = m.bridge.stop()
            if m.fate != "sigterm" or m.code is None:
                m.code = code
        for probe in probes.values():
            with contextlib.suppress(Exception):
                await probe.close()
        await archiver.stop()
        topo.stop()
    for m in run.members:
        pid = str(m.bridge.proc.pid)
        m.name = next((s for s in senders if s.rsplit(":", 2)[-2] == pid), "")
        m.written = len({span_id for span_id, _ in output_spans(m.bridge.output)})
    bad = [(m.bridge.server, m.code) for m in run.members if m.fate != "sigkill" and m.code != 0]
    if bad:
        run.notes.append(f"bridge exit codes {bad}")
    killed = run.member("sigkill")
    run.killed_held = held_of(killed.metrics, killed.written)

    raws = read_raws(archiver.path)
    truth = compute_truth(raws)
    lines = [line for m in run.members if m.bridge.output.exists()
             for line in whole_lines(m.bridge.output.read_bytes())]
    spans = list(read_otlp_json_lines(lines))
    written_ids = {span.span_id for span in spans}
    run.written = len(written_ids)
    result = score(truth, spans)
    run.hops = result.hops
    run.counts = _counts(result)
    # A change spans its event (the signal, the newcomer's start) to its settling (the exit,
    # the newcomer ready); the members agree about a listen and a heartbeat after that.
    changes = [(t, run.settled.get(name, t)) for name, t in run.events.items()]
    near_ns = int(args.near_s * 1e9)
    near = {ident for ident, hop in truth.hops.items()
            if any(start - near_ns <= hop.arrival_ts_ns <= done + near_ns for start, done in changes)}
    # The stream's end (`end_s` before its last hop) counts as near too, when asked: no report
    # follows the last burst, so its peers vouch for it by heartbeats alone, and one that comes
    # after the owner's window closed leaves the burst `ambiguous` (never wrong).
    end_ns = int(args.end_s * 1e9)
    if end_ns and truth.hops:
        last = max(hop.arrival_ts_ns for hop in truth.hops.values())
        near |= {ident for ident, hop in truth.hops.items() if hop.arrival_ts_ns >= last - end_ns}
    run.near = _counts(score(truth, spans, only=near))
    far = score(truth, spans, only=set(truth.hops) - near)
    run.far = _counts(far)
    if far.unlinked:
        first = far.first_arrival_ns
        marks = ", ".join(f"{name} @{(t - first) / 1e6:.0f}" for name, t in
                          sorted([*run.events.items(), *((f"{k} done", v) for k, v in run.settled.items())],
                                 key=lambda item: item[1]))
        run.far_where = f"{far.describe_unlinked()} (changes: {marks})"
    if result.conflicting_duplicates:
        run.notes.append(f"{result.conflicting_duplicates} span ids output twice with different parents")
    # The lost, by the trace they belong to: owned by the killed bridge in the members' view
    # just before the kill (every member that had joined, but the SIGTERMed one and the newcomer)?
    before_kill = Ring(m.name for m in run.members if m.fate in ("survivor", "sigkill") and m.name)
    named = all(m.name for m in run.members)
    if not named:
        run.notes.append(f"members not heard on the exchange: {[m.bridge.server for m in run.members if not m.name]}")
    kill_ns = run.events["sigkill"]
    before_ns, after_ns = (int(s * 1e9) for s in args.lost_window)
    for raw in raws:
        msg = decode(raw)
        span_id = truth.reports.get(identity(msg))
        if span_id is None or span_id in written_ids:
            continue
        run.lost_ids.add(span_id)
        if named and before_kill.owner(shard_key(raw)) == killed.name:
            run.lost_killed_owned += 1
        if kill_ns - before_ns <= msg.ingress.ts_ns <= kill_ns + after_ns:
            run.lost_near_kill += 1
    return run


def _counts(result: Any) -> dict[str, int]:
    return {k: result.counts[k] for k in (RIGHT, WRONG, UNMATCHED, AMBIGUOUS, MISSING)}


def print_churn(runs: list[ChurnRun]) -> None:
    print()
    print("| traffic | trace messages | lost | of the killed's traces | near the kill | killed held "
          "| exit codes (term, kill) | right | wrong | unmatched | ambiguous | missing "
          "| declined near a change | declined elsewhere |")
    print("|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in runs:
        c = r.counts
        codes = f"{r.member('sigterm').code}, {r.member('sigkill').code}"
        declined = (r.near.get(UNMATCHED, 0) + r.near.get(AMBIGUOUS, 0),
                    r.far.get(UNMATCHED, 0) + r.far.get(AMBIGUOUS, 0))
        print(f"| {r.label} | {r.trace_messages:,} | {r.lost} | {r.lost_killed_owned} | {r.lost_near_kill} "
              f"| {r.killed_held} | {codes} | {c[RIGHT]:,} of {r.hops:,} | {c[WRONG]} | {c[UNMATCHED]} "
              f"| {c[AMBIGUOUS]} | {c[MISSING]} | {declined[0]} | {declined[1]} |")
    for r in runs:
        for m in r.members:
            routed = {k.split('"')[1]: int(v) for k, v in m.metrics.items() if k.startswith("nats_otel_routed_total")}
            print(f"  {r.label}: {m.bridge.server} ({m.fate}) exit {m.code}, wrote {m.written}, received "
                  f"{_metric_sum(m.metrics, 'nats_otel_messages_received_total'):.0f}, routed {routed}, views "
                  f"{_metric_sum(m.metrics, 'nats_otel_route_views_total'):.0f}")
        for note in r.notes:
            print(f"  {r.label}: {note}")



def churn_main(args: argparse.Namespace) -> int:
    runs = []
    with tempfile.TemporaryDirectory(prefix="scale-out-churn-") as tmp:
        root = args.workdir or Path(tmp)
        for number in range(args.repeat):
            workdir = root / f"churn{number}"
            workdir.mkdir(parents=True, exist_ok=True)
            started = time.monotonic()
            run = asyncio.run(churn_run(args, workdir))
            print(f"churn run {number + 1}: {run.trace_messages} trace messages, {run.lost} lost "
                  f"({run.lost_killed_owned} of the killed bridge's traces, {run.lost_near_kill} near the kill; "
                  f"it held {run.killed_held}, scraped {run.kill_gap_s * 1000:.0f} ms before the kill), "
                  f"links {run.counts}, {time.monotonic() - started:.0f} s", flush=True)
            runs.append(run)
    print_churn(runs)
    return 0 if all(not r.notes and r.counts.get(WRONG, 0) == 0 for r in runs) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    traffic_arguments(parser)
    parser.add_argument("--term-at", type=float, default=0.33, help="SIGTERM bridge 1 at this fraction "
                        "of the traffic's planned time")
    parser.add_argument("--kill-at", type=float, default=0.5, help="SIGKILL bridge 2 then")
    parser.add_argument("--join-at", type=float, default=0.65, help="start a new bridge then")
    parser.add_argument("--near-s", type=float, default=3.0, help="a hop arriving this close to a change "
                        "(before its event, after it was done) counts as near it")
    parser.add_argument("--end-s", type=float, default=0.0, help="a hop arriving this close to the "
                        "stream's last counts as near a change too (0: not)")
    parser.add_argument("--quiet-s", type=float, default=None, help="the outputs are final once they have "
                        "not grown for this long (4 s; with --jetstream 45 s)")
    parser.add_argument("--lost-window", type=float, nargs=2, default=(2.0, 0.5), metavar=("BEFORE", "AFTER"),
                        help="lost trace messages reported this long before / after the kill count as near it")
    parser.add_argument("--repeat", type=int, default=1, help="runs")
    parser.add_argument("--jetstream", action="store_true", help="the bridges share one durable in JetStream "
                        "mode (see the docstring)")
    return churn_main(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
