"""Issue 46's scaling check: what N sidecar bridges in one queue group cost, summed, for the
same traffic, and whether their hop links stay right.

The topology of the issue: the routed cluster east-1 + east-2, leaf-1 a leafnode of east-1,
account A traced to `trace.a`, a subscriber on every server; one publisher on east-2 sends
`--messages` messages of 200 bytes at `--rate` msgs/s in bursts of `--burst` back to back
(by default each with its own traceparent: three trace messages and two hops a message).
Bridge i connects to server i mod 3 (east-1, east-2, leaf-1), all in one queue group
(`--queue nats-otel`, the evidence exchange on by default), and writes OTLP/JSON lines.

Per N it prints: the trace messages archived by an independent subscriber, each bridge's
CPU seconds (user + system, children included, from /proc) from just before the traffic to
the last span, summed and per trace message, the efficiency (N = 1's summed CPU per trace
message over N's, N = 1 measured in the same run), the idle cost (CPU seconds per 20 s of
the whole group before any traffic), and the hop links scored against the archive's truth
(`nats_otel.devkit.hop_truth`, never the linker under test).

    python bench/scale_out.py --bridges 1 4 8
    python bench/scale_out.py --bridges 1 8 --mode back_to_back --context-size 6000 --unnumbered
    python bench/scale_out.py --bridges 1 8 --mode adhoc_back_to_back
    python bench/scale_out.py --churn                      # membership changes mid-traffic

`--churn` (`churn_run`): 8 bridges (`--bridges`' largest), the traffic running; about a third
of the way in one bridge gets SIGTERM (it says goodbye, hands on what it receives, drains:
it must exit 0 and lose nothing), a bit later another gets SIGKILL (it takes what it held
with it: the traces it owned, for about one link window, and its intake), then a new bridge
starts on one of the servers, in the same queue group, and joins. It prints the links
scored against the truth, near a change (`--near-s`) and elsewhere, the spans lost (trace
messages archived minus distinct server spans written), how many of them belong to traces the
killed bridge owned (the members' ring before the kill, from the senders heard on the
exchange) and the killed bridge's own bound: what it had received (from NATS and forwarded
to it) minus what it forwarded and what it wrote, scraped just before the SIGKILL.

A rate counts only what arrived: a run whose bridges did not write a server span for every
archived trace message says so in its notes. Everything started is stopped again.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import orjson
from hop_links import (
    TRACE_SUBJECT,
    USER,
    Archiver,
    Bridge,
    _wait_until,
    _whole_lines,
    archived,
    probe_interest,
    read_raws,
    server_spans,
    stop_all,
)

from nats_otel.bridge.ownership import Ring
from nats_otel.bridge.sharding import shard_key
from nats_otel.core.decode import decode
from nats_otel.core.ids import identity
from nats_otel.devkit.hop_traffic import MODES, TrafficOptions, run_traffic
from nats_otel.devkit.hop_truth import (
    AMBIGUOUS,
    MISSING,
    RIGHT,
    UNMATCHED,
    WRONG,
    compute_truth,
    read_otlp_json_lines,
    score,
)
from nats_otel.devkit.processes import start_topology
from nats_otel.devkit.topology import (
    DEFAULT_ACCOUNTS,
    LEAF_ACCOUNTS,
    LeafRemote,
    ServerSpec,
    Topology,
    cluster,
)

PUBLISHER, ARCHIVER = "east-2", "east-1"
BRIDGE_SERVERS = ("east-1", "east-2", "leaf-1")
_TICKS = os.sysconf("SC_CLK_TCK")


def scale_topology(deny_exchange: bool = False) -> Topology:
    """east-1 + east-2 (routes; east-1 takes leafnodes) and leaf-1, without JetStream.
    `deny_exchange`: account A's users may not publish on the link exchange (`nats-otel.links.>`),
    as docs/security.md's least-privilege user of a bridge alone, given a queue group."""
    accounts = tuple(replace(a, jetstream=False) for a in DEFAULT_ACCOUNTS)
    leaf_accounts = LEAF_ACCOUNTS
    if deny_exchange:
        def denied(account):
            users = tuple(replace(u, deny_publish=("nats-otel.links.>",)) for u in account.users)
            return replace(account, users=users) if account.name == "A" else account
        accounts, leaf_accounts = tuple(map(denied, accounts)), tuple(map(denied, LEAF_ACCOUNTS))
    leaf = ServerSpec(name="leaf-1", accounts=leaf_accounts, leaf_remotes=(LeafRemote("east-1"),))
    return Topology(servers=(*cluster("east", 2, leaf_listen=(1,)), leaf), accounts=accounts, wait_jetstream=False)


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds by thread name (threads of one name summed): where a bridge's CPU goes."""
    out: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            name = "main" if task.name == str(pid) else "other threads"
            fields = (task / "stat").read_text().rpartition(")")[2].split()
            for kind, value in (("user", fields[11]), ("system", fields[12])):
                out[f"{name} {kind}"] = out.get(f"{name} {kind}", 0.0) + int(value) / _TICKS
    return out


def cpu_seconds(pid: int) -> float:
    """A process's user + system CPU seconds, its waited-for children's included."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return sum(int(v) for v in fields[11:15]) / _TICKS


@dataclass
class Run:
    bridges: int
    trace_messages: int = 0
    cpu: list[float] = field(default_factory=list)
    idle_cpu_per_20s: float = 0.0
    counts: dict[str, int] = field(default_factory=dict)
    hops: int = 0
    notes: list[str] = field(default_factory=list)
    forwarded: float = 0.0
    forged: float = 0.0  # forwards refused for a missing or wrong signature
    heartbeats: float = 0.0  # exchange messages the bridges published (heartbeats, with ownership)

    @property
    def cpu_sum(self) -> float:
        return sum(self.cpu)

    @property
    def per_message_us(self) -> float:
        return self.cpu_sum / max(1, self.trace_messages) * 1e6


async def one_run(n: int, args: argparse.Namespace, workdir: Path) -> Run:

    options = TrafficOptions(mode=args.mode, messages=args.messages, batch_size=args.context_size,
                             batch_gap_ms=1000.0 * args.burst / args.rate, burst=args.burst, payload_size=200,
                             seed=args.seed, numbered=not args.unnumbered)
    subjects = [TRACE_SUBJECT] + ([options.adhoc_dest] if args.mode.startswith("adhoc") else [])
    run = Run(n)
    topo = start_topology(scale_topology(args.deny_exchange), workdir / "nats")
    bridges: list[Bridge] = []
    archiver = Archiver(workdir / "archive.jsonl", subjects)
    probes: dict[str, Any] = {}
    try:
        await archiver.start(topo.client_url(ARCHIVER, USER))
        for i in range(n):
            server = BRIDGE_SERVERS[i % 3]
            bridges.append(Bridge(workdir, f"{server}-b{i}", topo.client_url(server, USER), subjects,
                                  "nats-otel", 1))
        for bridge in bridges:
            bridge.wait_ready()
        probes.update(await probe_interest(topo, {*BRIDGE_SERVERS, ARCHIVER}))
        await asyncio.sleep(args.warm_s)
        idle_before = [cpu_seconds(b.proc.pid) for b in bridges]
        await asyncio.sleep(args.idle_s)
        idle_after = [cpu_seconds(b.proc.pid) for b in bridges]
        run.idle_cpu_per_20s = (sum(idle_after) - sum(idle_before)) * 20.0 / args.idle_s
        before = [cpu_seconds(b.proc.pid) for b in bridges]
        threads_before = thread_cpu(bridges[0].proc.pid)
        spy = None
        if args.profile:  # py-spy on bridge 0 over the traffic (it slows that bridge: never for figures)
            rate = os.environ.get("PYSPY_RATE", "1000")  # samples a second (GIL-held only)
            spy = subprocess.Popen(["py-spy", "record", "--gil", "--pid", str(bridges[0].proc.pid), "--format", "raw",
                                    "--rate", rate, "--output", str(workdir / "bridge0.pyspy.txt")],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        urls = {name: topo.client_url(name, USER) for name in topo.names}
        report = await run_traffic(urls[PUBLISHER], urls, options)
        if not report.complete:
            run.notes.append(f"subscribers missed messages: {report.received}")
        run.trace_messages = await archived(archiver, report.published * len(topo.names), run.notes)
        # The last span: poll the outputs (the CPU of the polling is this process's, not theirs).
        if not await _wait_until(lambda: server_spans(bridges) >= run.trace_messages, 60, 0.2):
            run.notes.append(f"the bridges wrote {server_spans(bridges)} server spans "
                             f"for {run.trace_messages} trace messages")
        after = [cpu_seconds(b.proc.pid) for b in bridges]
        threads_after = thread_cpu(bridges[0].proc.pid)
        run.notes.append("bridge 0's CPU by thread: " + ", ".join(
            f"{name} {threads_after[name] - threads_before.get(name, 0.0):.2f} s" for name in sorted(threads_after)))
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            spy.wait(30)
        run.cpu = [a - b for a, b in zip(after, before, strict=True)]
        metrics = [b.metrics() for b in bridges]
        run.forwarded = sum(v for m in metrics for k, v in m.items()
                            if k.startswith('nats_otel_routed_total{result="forwarded"'))
        run.forged = sum(v for m in metrics for k, v in m.items()
                         if k.startswith('nats_otel_routed_total{result="forged"'))
        run.heartbeats = sum(v for m in metrics for k, v in m.items()
                             if k.startswith('nats_otel_link_evidence_total{result="published"'))
    finally:
        codes = await stop_all(bridges, probes, archiver, topo)
    if any(code != 0 for code in codes):
        run.notes.append(f"bridge exit codes {codes}")
    truth = compute_truth(read_raws(archiver.path))
    outputs = [line for b in bridges if b.output.exists() for line in b.output.read_bytes().splitlines()]
    result = score(truth, read_otlp_json_lines(outputs))
    run.hops = result.hops
    run.counts = {k: result.counts[k] for k in (RIGHT, WRONG, UNMATCHED, AMBIGUOUS, MISSING)}
    if result.conflicting_duplicates:
        run.notes.append(f"{result.conflicting_duplicates} span ids output twice with different parents")
    return run


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
    near: dict[str, int] = field(default_factory=dict)  # the hops arriving within `near_s` of a change
    far: dict[str, int] = field(default_factory=dict)
    hops: int = 0
    members: list[Member] = field(default_factory=list)
    events: dict[str, int] = field(default_factory=dict)  # sigterm, sigkill, joined -> wall-clock ns
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


def output_spans(path: Path) -> list[tuple[bytes, bytes]]:
    """(span id, trace id) of each server (CONSUMER) span a bridge wrote."""
    out = []
    if not path.exists():
        return out
    for line in _whole_lines(path.read_bytes()):
        for resource_spans in orjson.loads(line).get("resourceSpans", ()):
            for scope_spans in resource_spans.get("scopeSpans", ()):
                for span in scope_spans.get("spans", ()):
                    if span.get("kind") == 5:  # SpanKind.CONSUMER: one per trace message
                        out.append((bytes.fromhex(span["spanId"]), bytes.fromhex(span["traceId"])))
    return out


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
    topo = start_topology(scale_topology(args.deny_exchange), workdir / "nats")
    archiver = Archiver(workdir / "archive.jsonl", subjects)
    probes: dict[str, Any] = {}
    senders: set[str] = set()
    killed_metrics: dict[str, float] = {}

    def new_member(i: int, fate: str) -> Member:
        server = BRIDGE_SERVERS[i % 3]
        return Member(Bridge(workdir, f"{server}-b{i}", topo.client_url(server, USER), subjects, "nats-otel", 1),
                      i, fate)

    try:
        nc = await archiver.start(topo.client_url(ARCHIVER, USER))

        async def on_exchange(msg: Any) -> None:
            sender = (msg.headers or {}).get(_SENDER_HEADER)
            if sender:
                senders.add(sender)

        await nc.subscribe(EXCHANGE_SUBJECT, cb=on_exchange, pending_msgs_limit=1_000_000)
        for i in range(n):
            run.members.append(new_member(i, {1: "sigterm", 2: "sigkill"}.get(i, "survivor")))
        for m in run.members:
            m.bridge.wait_ready()
        probes.update(await probe_interest(topo, {*BRIDGE_SERVERS, ARCHIVER}))
        await asyncio.sleep(args.warm_s)
        urls = {name: topo.client_url(name, USER) for name in topo.names}
        traffic = asyncio.create_task(run_traffic(urls[PUBLISHER], urls, options))
        started = time.monotonic()

        async def at(fraction: float) -> None:
            await asyncio.sleep(max(0.0, started + fraction * planned_s - time.monotonic()))

        await at(args.term_at)
        termed = run.member("sigterm")
        termed.metrics = dict(await asyncio.to_thread(termed.bridge.metrics))  # just before its SIGTERM
        run.events["sigterm"] = time.time_ns()
        term_task = asyncio.create_task(asyncio.to_thread(termed.bridge.stop, 60.0))
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
        report = await traffic
        termed.code = await term_task
        if not report.complete:
            run.notes.append(f"subscribers missed messages: {report.received}")
        run.trace_messages = await archived(archiver, report.published * len(topo.names), run.notes)
        bridges = [m.bridge for m in run.members]
        # Written: everything but what was lost, which never comes. Wait until the outputs
        # stop growing (a link window and an export, twice over) or are complete.
        last, still_since = -1, time.monotonic()
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            now_written = server_spans(bridges)
            if now_written >= run.trace_messages:
                break
            if now_written != last:
                last, still_since = now_written, time.monotonic()
            elif time.monotonic() - still_since > args.quiet_s:
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
             for line in _whole_lines(m.bridge.output.read_bytes())]
    spans = list(read_otlp_json_lines(lines))
    written_ids = {span.span_id for span in spans}
    run.written = len(written_ids)
    result = score(truth, spans)
    run.hops = result.hops
    run.counts = _counts(result)
    changes = list(run.events.values())
    near_ns = int(args.near_s * 1e9)
    near = {ident for ident, hop in truth.hops.items()
            if any(abs(hop.arrival_ts_ns - t) <= near_ns for t in changes)}
    run.near = _counts(score(truth, spans, only=near))
    run.far = _counts(score(truth, spans, only=set(truth.hops) - near))
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


def print_table(runs: list[Run]) -> None:
    base = next((r for r in runs if r.bridges == 1), None)
    print()
    print("| bridges | trace messages | CPU summed | per trace message | efficiency | per bridge (s) "
          "| idle, CPU-s per 20 s | forwarded | hop links right | wrong | unmatched | ambiguous | missing |")
    print("|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in runs:
        eff = f"{base.per_message_us / r.per_message_us:.2f}" if base and r.per_message_us else "-"
        c = r.counts
        print(f"| {r.bridges} | {r.trace_messages:,} | {r.cpu_sum:.2f} s | {r.per_message_us:.0f} µs | {eff} "
              f"| {' '.join(f'{x:.2f}' for x in r.cpu)} | {r.idle_cpu_per_20s:.2f} | {r.forwarded:,.0f} "
              f"| {c.get(RIGHT, 0):,} of {r.hops:,} | {c.get(WRONG, 0)} | {c.get(UNMATCHED, 0)} "
              f"| {c.get(AMBIGUOUS, 0)} | {c.get(MISSING, 0)} |")
    for r in runs:
        for note in r.notes:
            print(f"  N = {r.bridges}: {note}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bridges", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--messages", type=int, default=6000)
    parser.add_argument("--rate", type=float, default=600.0, help="messages per second, in bursts")
    parser.add_argument("--burst", type=int, default=50, help="messages per burst, back to back")
    parser.add_argument("--mode", choices=MODES, default="per_message")
    parser.add_argument("--context-size", type=int, default=50,
                        help="messages per traceparent (batch, back_to_back; all of them: --messages)")
    parser.add_argument("--unnumbered", action="store_true", help="messages of a context alike but for time")
    parser.add_argument("--warm-s", type=float, default=1.5)
    parser.add_argument("--idle-s", type=float, default=10.0, help="idle measured this long before the traffic")
    parser.add_argument("--seed", type=int, default=46)
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--deny-exchange", action="store_true", help="the bridges' user may not publish on the "
                        "link exchange: they cannot hear each other (a misconfiguration: links must never be wrong)")
    parser.add_argument("--profile", action="store_true", help="py-spy (on PATH) records bridge 0 over the traffic")
    parser.add_argument("--churn", action="store_true", help="the membership-change scenario (`churn_run`) "
                        "with the largest --bridges")
    parser.add_argument("--term-at", type=float, default=0.33, help="churn: SIGTERM bridge 1 at this fraction "
                        "of the traffic's planned time")
    parser.add_argument("--kill-at", type=float, default=0.5, help="churn: SIGKILL bridge 2 then")
    parser.add_argument("--join-at", type=float, default=0.65, help="churn: start a new bridge then")
    parser.add_argument("--near-s", type=float, default=3.0, help="churn: a hop arriving this close to a change "
                        "counts as near it")
    parser.add_argument("--quiet-s", type=float, default=4.0, help="churn: the outputs are final once they have "
                        "not grown for this long")
    parser.add_argument("--lost-window", type=float, nargs=2, default=(2.0, 0.5), metavar=("BEFORE", "AFTER"),
                        help="churn: lost trace messages reported this long before / after the kill count as near it")
    parser.add_argument("--repeat", type=int, default=1, help="churn: runs")
    args = parser.parse_args(argv)
    if args.churn:
        return churn_main(args)
    runs = []
    with tempfile.TemporaryDirectory(prefix="scale-out-") as tmp:
        root = args.workdir or Path(tmp)
        for n in args.bridges:
            workdir = root / f"n{n}"
            workdir.mkdir(parents=True, exist_ok=True)
            started = time.monotonic()
            run = asyncio.run(one_run(n, args, workdir))
            print(f"N = {n}: {run.heartbeats:.0f} exchange messages published; "
                  f"{run.trace_messages} trace messages, CPU {run.cpu_sum:.2f} s "
                  f"({run.per_message_us:.0f} µs each), links {run.counts}, {time.monotonic() - started:.0f} s",
                  flush=True)
            runs.append(run)
    print_table(runs)
    return 0 if all(not r.notes and r.counts.get(WRONG, 0) == 0 for r in runs) else 1


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


if __name__ == "__main__":
    sys.exit(main())
