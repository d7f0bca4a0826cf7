"""Issue 46's scaling check: what N sidecar bridges in one queue group cost, summed, for the
same traffic, and whether their hop links stay right.

The topology of the issue: the routed cluster east-1 + east-2, leaf-1 a leafnode of east-1,
account A traced to `trace.a`, a subscriber on every server; one publisher on east-2 sends
`--messages` messages of 200 bytes at `--rate` msgs/s in bursts of `--burst` back to back
(by default each with its own traceparent: three trace messages and two hops a message).
Bridge i connects to server i mod 3 (east-1, east-2, leaf-1), all in one queue group
(`--queue nats-otel`, the evidence exchange on by default), and writes OTLP/JSON lines
(`--otlp`: exports OTLP/gRPC to one real receiver in this process instead, as users run it;
the file exporter maps into span records in Python and renders JSON, several times the
per-message work of the compiled path straight to protobuf, so the efficiency reads higher
with files than with OTLP).

Per N it prints: the trace messages archived by an independent subscriber, each bridge's
CPU seconds (user + system, children included, from /proc) from just before the traffic to
the last span, summed and per trace message, the efficiency (N = 1's summed CPU per trace
message over N's, N = 1 measured in the same run), the idle cost (CPU seconds per 20 s of
the whole group before any traffic), and the hop links scored against the archive's truth
(`nats_otel.devkit.hop_truth`, never the linker under test).

    python bench/scale_out.py --bridges 1 4 8
    python bench/scale_out.py --bridges 1 8 --mode back_to_back --context-size 6000 --unnumbered
    python bench/scale_out.py --bridges 1 8 --mode adhoc_back_to_back

`--jetstream`: the same topology and traffic, but account A has JetStream on east-1 and east-2
(leaf-1 without), the bench creates the stream `TRACE_A` on the trace subjects (file storage,
one replica, placed on east-1 by its `node:east-1` tag, so every run of one invocation stores
the same way) before the bridges start, and the N bridges run in JetStream mode on one durable
(`--mode jetstream --stream TRACE_A --durable nats-otel`, no queue group). Bridge i connects
to east-1 or east-2 alternately (i mod 2), not to leaf-1: a client of leaf-1 gets no
responders on `$JS.API.INFO` (nats-server 2.15.1; the hub's JetStream, without a domain, is not
served across the leafnode), and the bridge has no JetStream domain or API prefix setting to
reach it as `$JS.<domain>.API`. leaf-1's trace messages still reach the stream through the
leafnode (the stream's interest crosses it). At least once: a span may be written twice, so completion counts distinct
server span ids, and the table's `duplicates` column is the server spans written minus the
distinct ones (counted over the final outputs, after the bridges stopped).

    python bench/scale_out.py --jetstream --bridges 1 4 8

`BRIDGE_CHECKOUT=DIR` (bench/hop_links.py) runs the bridges from another checkout, the
harness from this one, in either mode: paired A/B runs.

The membership-change scenario (SIGTERM, SIGKILL and a newcomer mid-traffic) is
`bench/scale_churn.py`; `--churn` here runs it, passing the other flags on.

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

import nats
import orjson
from bridge_process import USER, Bridge, server_spans, wait_members, wait_until, whole_lines
from hop_links import TRACE_SUBJECT, Archiver, archived, probe_interest, read_raws, stop_all

from nats_otel.devkit.hop_score import (
    AMBIGUOUS,
    MISSING,
    RIGHT,
    UNMATCHED,
    WRONG,
    read_otlp_json_lines,
    read_otlp_spans,
    score,
)
from nats_otel.devkit.hop_traffic import MODES, TrafficOptions, run_traffic
from nats_otel.devkit.hop_truth import compute_truth
from nats_otel.devkit.processes import RunningTopology, start_topology
from nats_otel.devkit.receivers import OTLPGrpcReceiver
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
JS_BRIDGE_SERVERS = ("east-1", "east-2")  # --jetstream: leaf-1's clients reach no JetStream API (docstring)
_TICKS = os.sysconf("SC_CLK_TCK")
STREAM, DURABLE, STREAM_SERVER = "TRACE_A", "nats-otel", "east-1"  # --jetstream


def scale_topology(deny_exchange: bool = False, jetstream: bool = False) -> Topology:
    """east-1 + east-2 (routes; east-1 takes leafnodes) and leaf-1, without JetStream.
    `deny_exchange`: account A's users may not publish on the link exchange (`nats-otel.links.>`),
    as docs/security.md's least-privilege user of a bridge alone, given a queue group.
    `jetstream`: JetStream on east-1 and east-2 for account A alone (leaf-1 without)."""
    accounts = tuple(replace(a, jetstream=jetstream and a.name == "A") for a in DEFAULT_ACCOUNTS)
    leaf_accounts = LEAF_ACCOUNTS
    if deny_exchange:
        def denied(account):
            users = tuple(replace(u, deny_publish=("nats-otel.links.>",)) for u in account.users)
            return replace(account, users=users) if account.name == "A" else account
        accounts, leaf_accounts = tuple(map(denied, accounts)), tuple(map(denied, LEAF_ACCOUNTS))
    leaf = ServerSpec(name="leaf-1", accounts=leaf_accounts, leaf_remotes=(LeafRemote("east-1"),))
    east = cluster("east", 2, jetstream=(1, 2) if jetstream else (), leaf_listen=(1,))
    return Topology(servers=(*east, leaf), accounts=accounts, wait_jetstream=jetstream)


async def create_stream(topo: RunningTopology, subjects: list[str]) -> None:
    """The stream of `--jetstream` (see the module's docstring), retried while the cluster's
    JetStream is not answering yet (a meta leader just elected)."""
    from nats.js.api import Placement, StorageType, StreamConfig

    config = StreamConfig(name=STREAM, subjects=subjects, storage=StorageType.FILE, num_replicas=1,
                          placement=Placement(tags=[f"node:{STREAM_SERVER}"]))
    nc = await nats.connect(topo.client_url(STREAM_SERVER, USER), name="scale-out-stream", allow_reconnect=False)
    try:
        for attempt in range(40):
            try:
                await nc.jetstream().add_stream(config)
                return
            except Exception:  # not answering yet: retried; the last attempt's error raised
                if attempt == 39:
                    raise
                await asyncio.sleep(0.25)
    finally:
        await nc.close()


def _signal_wrapped(bridges: list[Bridge], signum: int) -> None:
    """Signal bridges run under bench/loop_callbacks.py (`BRIDGE_WRAP`); no others."""
    if "loop_callbacks" in os.environ.get("BRIDGE_WRAP", ""):
        for bridge in bridges:
            bridge.proc.send_signal(signum)


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
    notes: list[str] = field(default_factory=list)  # what went wrong (the exit code is 1)
    facts: list[str] = field(default_factory=list)  # what is worth printing beside the table
    spans_written: int = 0  # server spans in the outputs, a span written twice counted twice
    distinct_spans: int = 0  # their distinct span ids
    forwarded: float = 0.0
    forged: float = 0.0  # forwards refused for a missing or wrong signature
    heartbeats: float = 0.0  # exchange messages the bridges published (heartbeats, with ownership)

    @property
    def cpu_sum(self) -> float:
        return sum(self.cpu)

    @property
    def duplicates(self) -> int:
        return self.spans_written - self.distinct_spans

    @property
    def per_message_us(self) -> float:
        return self.cpu_sum / max(1, self.trace_messages) * 1e6


async def one_run(n: int, args: argparse.Namespace, workdir: Path) -> Run:

    options = TrafficOptions(mode=args.mode, messages=args.messages, batch_size=args.context_size,
                             batch_gap_ms=1000.0 * args.burst / args.rate, burst=args.burst, payload_size=200,
                             seed=args.seed, numbered=not args.unnumbered)
    subjects = [TRACE_SUBJECT] + ([options.adhoc_dest] if args.mode.startswith("adhoc") else [])
    # `--otlp`: every bridge exports OTLP/gRPC to one real receiver in this process (its CPU
    # is not theirs), the exporter users run; else OTLP/JSON lines, one file each.
    receiver = OTLPGrpcReceiver(max_workers=8).start() if getattr(args, "otlp", False) else None
    run = Run(n)
    jetstream = getattr(args, "jetstream", False)
    topo = start_topology(scale_topology(args.deny_exchange, jetstream), workdir / "nats")
    bridges: list[Bridge] = []
    archiver = Archiver(workdir / "archive.jsonl", subjects)
    probes: dict[str, Any] = {}
    try:
        await archiver.start(topo.client_url(ARCHIVER, USER))
        if jetstream:
            await create_stream(topo, subjects)
        queue, extra = ("nats-otel", ()) if not jetstream else (
            None, ("--mode", "jetstream", "--stream", STREAM, "--durable", DURABLE))
        servers = JS_BRIDGE_SERVERS if jetstream else BRIDGE_SERVERS
        for i in range(n):
            server = servers[i % len(servers)]
            bridges.append(Bridge(workdir, f"{server}-b{i}", topo.client_url(server, USER), subjects,
                                  queue, 1, extra, receiver.endpoint if receiver else None))
        for bridge in bridges:
            bridge.wait_ready()
        run.notes += await wait_members(bridges)
        probes.update(await probe_interest(topo, {*servers, ARCHIVER}))
        await asyncio.sleep(args.warm_s)
        idle_before = [cpu_seconds(b.proc.pid) for b in bridges]
        await asyncio.sleep(args.idle_s)
        idle_after = [cpu_seconds(b.proc.pid) for b in bridges]
        run.idle_cpu_per_20s = (sum(idle_after) - sum(idle_before)) * 20.0 / args.idle_s
        _signal_wrapped(bridges, signal.SIGUSR1)  # bench/loop_callbacks.py: the counts start anew
        before = [cpu_seconds(b.proc.pid) for b in bridges]
        window_started = time.monotonic()
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
        def written() -> int:  # distinct server spans, as `server_spans` counts the files'
            return server_spans(bridges) if receiver is None else len(set(received_span_ids(receiver)))

        if not await wait_until(lambda: written() >= run.trace_messages, 60, 0.2):
            run.notes.append(f"the bridges wrote {written()} server spans for {run.trace_messages} trace messages")
        after = [cpu_seconds(b.proc.pid) for b in bridges]
        run.facts.append(f"the measured window: {time.monotonic() - window_started:.1f} s")
        threads_after = thread_cpu(bridges[0].proc.pid)
        _signal_wrapped(bridges, signal.SIGUSR2)  # ... and are written: the traffic's alone
        run.facts.append("bridge 0's CPU by thread: " + ", ".join(
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
        if receiver is not None:
            receiver.stop()
    if any(code != 0 for code in codes):
        run.notes.append(f"bridge exit codes {codes}")
    truth = compute_truth(read_raws(archiver.path))
    if receiver is None:
        outputs = [line for b in bridges if b.output.exists() for line in b.output.read_bytes().splitlines()]
        result = score(truth, read_otlp_json_lines(outputs))
        span_ids = [span_id for b in bridges for span_id, _ in output_spans(b.output)]
    else:
        received = list(read_otlp_spans(receiver.spans()))
        result = score(truth, received)
        span_ids = [span.span_id for span in received]
    run.spans_written, run.distinct_spans = len(span_ids), len(set(span_ids))
    run.hops = result.hops
    run.counts = {k: result.counts[k] for k in (RIGHT, WRONG, UNMATCHED, AMBIGUOUS, MISSING)}
    if result.conflicting_duplicates:
        run.notes.append(f"{result.conflicting_duplicates} span ids output twice with different parents")
    return run


def received_span_ids(receiver: OTLPGrpcReceiver) -> list[bytes]:
    """The ids of the server (CONSUMER) spans `receiver` got so far, a span sent twice twice."""
    return [span.span_id for span in read_otlp_spans(receiver.spans())]


def output_spans(path: Path) -> list[tuple[bytes, bytes]]:
    """(span id, trace id) of each server (CONSUMER) span a bridge wrote."""
    out: list[tuple[bytes, bytes]] = []
    if not path.exists():
        return out
    for line in whole_lines(path.read_bytes()):
        for resource_spans in orjson.loads(line).get("resourceSpans", ()):
            for scope_spans in resource_spans.get("scopeSpans", ()):
                for span in scope_spans.get("spans", ()):
                    if span.get("kind") == 5:  # SpanKind.CONSUMER: one per trace message
                        out.append((bytes.fromhex(span["spanId"]), bytes.fromhex(span["traceId"])))
    return out


def print_table(runs: list[Run], jetstream: bool = False) -> None:
    """The table; `jetstream`: with the duplicates column (server spans written minus distinct)."""
    base = next((r for r in runs if r.bridges == 1), None)
    print()
    print(f"| bridges | trace messages{' | duplicates' if jetstream else ''} | CPU summed | per trace message "
          "| efficiency | per bridge (s) "
          "| idle, CPU-s per 20 s | forwarded | hop links right | wrong | unmatched | ambiguous | missing |")
    print(f"|---:|---:{'|---:' if jetstream else ''}|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in runs:
        eff = f"{base.per_message_us / r.per_message_us:.2f}" if base and r.per_message_us else "-"
        c = r.counts
        dup = f" | {r.duplicates:,}" if jetstream else ""
        print(f"| {r.bridges} | {r.trace_messages:,}{dup} | {r.cpu_sum:.2f} s | {r.per_message_us:.0f} µs | {eff} "
              f"| {' '.join(f'{x:.2f}' for x in r.cpu)} | {r.idle_cpu_per_20s:.2f} | {r.forwarded:,.0f} "
              f"| {c.get(RIGHT, 0):,} of {r.hops:,} | {c.get(WRONG, 0)} | {c.get(UNMATCHED, 0)} "
              f"| {c.get(AMBIGUOUS, 0)} | {c.get(MISSING, 0)} |")
    for r in runs:
        for note in [*r.notes, *r.facts]:
            print(f"  N = {r.bridges}: {note}")


def traffic_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The flags of the topology, the bridges and the traffic (bench/scale_churn.py's too)."""
    parser.add_argument("--bridges", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--messages", type=int, default=6000)
    parser.add_argument("--rate", type=float, default=600.0, help="messages per second, in bursts")
    parser.add_argument("--burst", type=int, default=50, help="messages per burst, back to back")
    parser.add_argument("--mode", choices=MODES, default="per_message")
    parser.add_argument("--context-size", type=int, default=50,
                        help="messages per traceparent (batch, back_to_back; all of them: --messages)")
    parser.add_argument("--unnumbered", action="store_true", help="messages of a context alike but for time")
    parser.add_argument("--warm-s", type=float, default=1.5)
    parser.add_argument("--seed", type=int, default=46)
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--deny-exchange", action="store_true", help="the bridges' user may not publish on the "
                        "link exchange: they cannot hear each other (a misconfiguration: links must never be wrong)")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--churn" in argv:  # moved: its own script (run, not imported: it imports this one)
        churn = Path(__file__).resolve().parent / "scale_churn.py"
        return subprocess.call([sys.executable, str(churn), *(arg for arg in argv if arg != "--churn")])
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    traffic_arguments(parser)
    parser.add_argument("--otlp", action="store_true", help="the bridges export OTLP/gRPC to one real receiver "
                        "in this process (the exporter users run) instead of writing OTLP/JSON lines")
    parser.add_argument("--idle-s", type=float, default=10.0, help="idle measured this long before the traffic")
    parser.add_argument("--profile", action="store_true", help="py-spy (on PATH) records bridge 0 over the traffic")
    parser.add_argument("--jetstream", action="store_true", help=f"JetStream mode: the bridges share the durable "
                        f"{DURABLE} on the stream {STREAM}, created on {STREAM_SERVER} (no queue group); bridge i on "
                        "east-1 or east-2 alternately")
    parser.add_argument("--churn", action="store_true", help="the membership-change scenario: moved to "
                        "bench/scale_churn.py, which this runs with the other flags (its own flags too)")
    args = parser.parse_args(argv)
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
                  f"({run.per_message_us:.0f} µs each), links {run.counts}"
                  f"{f', {run.duplicates} duplicate spans' if args.jetstream else ''}, "
                  f"{time.monotonic() - started:.0f} s",
                  flush=True)
            runs.append(run)
    print_table(runs, args.jetstream)
    return 0 if all(not r.notes and r.counts.get(WRONG, 0) == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
