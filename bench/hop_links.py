"""Issue 29's scenario check: how many hop links come out right, on real processes.

A real cluster of 3 routed servers (east-1..3, no JetStream) plus leaf-1, a leafnode of
east-1; traced messages published on east-2 with a subscriber on every server, so each
message crosses east-2 -> east-1, east-2 -> east-3 (routes) and east-1 -> leaf-1 (leafnode).
An independent subscriber (this process, on east-1) archives every trace message; the truth
of every hop comes from that archive by order per connection (`nats_otel.devkit.hop_truth`),
never from the linker under test. Then N `nats-otel bridge` processes, each connected to its
own server (with N > 1 in one queue group: the sidecar layout of examples/kubernetes), write
OTLP/JSON lines, and every downstream server span in them is scored against the truth.

    python bench/hop_links.py --bridges 1 --mode per_message
    python bench/hop_links.py --bridges 3 --mode batch --drop 0.1   # + the `convert` row
    python bench/hop_links.py --convert-archive archive.jsonl --drop 0.1  # the convert row alone
    python bench/hop_links.py --bridges 3 --mode batch --batch-size 2   # wrong links on main 4f0672d

Results and what the per-connection numbers mean: docs/hop-links.md.

`--drop F` also runs `nats-otel convert` on the archive with a fraction F of its trace
messages removed at random (seeded), scoring only the hops whose two reports remain.
Everything started is stopped again, also on errors and Ctrl-C. Exit code 1 when the
archive is not complete (a lost trace message would make the truth incomplete).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bridge_process import USER, Bridge, server_spans, wait_members, wait_until

from nats_otel.archive import archive_record, read_archive
from nats_otel.bridge.sources.connection import raw_from_msg
from nats_otel.core.decode import RawTraceMessage, decode
from nats_otel.core.ids import identity
from nats_otel.devkit.hop_score import (
    AMBIGUOUS,
    MISSING,
    RIGHT,
    UNMATCHED,
    WRONG,
    Score,
    read_otlp_json_lines,
    score,
)
from nats_otel.devkit.hop_statistics import link_statistics
from nats_otel.devkit.hop_traffic import MODES, TrafficOptions, run_traffic
from nats_otel.devkit.hop_truth import Truth, compute_truth
from nats_otel.devkit.processes import RunningTopology, start_topology, wait_for_interest
from nats_otel.devkit.topology import DEFAULT_ACCOUNTS, LEAF_ACCOUNTS, LeafRemote, ServerSpec, Topology, cluster

PUBLISHER = "east-2"
ARCHIVER = "east-1"
TRACE_SUBJECT = "trace.a"


def hop_topology() -> Topology:
    """east-1..3 (routes; east-1 takes leafnodes) and leaf-1: like the demo, without JetStream
    (no meta group to wait for, no JetStream traffic on the routes)."""
    accounts = tuple(replace(a, jetstream=False) for a in DEFAULT_ACCOUNTS)
    leaf = ServerSpec(name="leaf-1", accounts=LEAF_ACCOUNTS, leaf_remotes=(LeafRemote("east-1"),))
    return Topology(servers=(*cluster("east", 3, leaf_listen=(1,)), leaf), accounts=accounts, wait_jetstream=False)


@dataclass
class Row:
    """One line of the table."""

    label: str
    result: Score
    seconds: float
    notes: list[str] = field(default_factory=list)
    #: The bridges' `nats_otel_*` samples, summed over them (live rows).
    metrics: Counter[str] = field(default_factory=Counter)


class Archiver:
    """Keeps every trace message: one plain subscriber (no queue group), limits far above the run."""

    def __init__(self, path: Path, subjects: list[str]) -> None:
        self.path = path
        self.subjects = subjects
        self.count = 0
        self.errors: list[str] = []
        self._out = open(path, "wb")  # noqa: SIM115 - closed in stop()
        self._nc: Any = None

    async def start(self, url: str) -> Any:
        import nats

        async def on_error(exc: Exception) -> None:
            self.errors.append(repr(exc))  # a slow consumer would be reported here

        async def on_msg(msg: Any) -> None:
            self._out.write(archive_record(raw_from_msg(msg)))
            self.count += 1

        self._nc = await nats.connect(url, name="hop-links-archiver", error_cb=on_error, allow_reconnect=False)
        for subject in self.subjects:
            await self._nc.subscribe(subject, cb=on_msg, pending_msgs_limit=10_000_000, pending_bytes_limit=8 << 30)
        await self._nc.flush()
        return self._nc

    async def stop(self) -> None:
        if self._nc is not None and not self._nc.is_closed:
            await self._nc.drain()
        self._out.close()


def _sum(metrics: list[Counter[str]], prefix: str) -> float:
    return sum(v for m in metrics for k, v in m.items() if k.startswith(prefix))


async def probe_interest(topo: RunningTopology, targets: set[str]) -> dict[str, Any]:
    """Every server knows of the interest of the subscribers on `targets` (the bridges', the
    archiver's) before the first report: interest travels in order on each connection, so a
    probe from each server to each target proves it. The probes' connections, to close."""
    import nats

    probes = {name: await nats.connect(topo.client_url(name, USER), name=f"probe@{name}", allow_reconnect=False)
              for name in topo.names}
    for name in topo.names:
        for target in targets:
            if target != name:
                await wait_for_interest(probes[name], probes[target])
    return probes


async def stop_all(bridges: list[Bridge], probes: dict[str, Any], archiver: Archiver,
                   topo: RunningTopology) -> list[int | None]:
    """Stop what a run started (bridges by SIGTERM, then the probes, archiver and servers);
    the bridges' exit codes."""
    codes = [b.stop() for b in bridges]
    for probe in probes.values():
        with contextlib.suppress(Exception):
            await probe.close()
    await archiver.stop()
    topo.stop()
    return codes


async def archived(archiver: Archiver, expected: int, notes: list[str]) -> int:
    """Wait (up to 60 s) for the archive to hold `expected` trace messages, and a little
    more for any beyond them (there should be none); what it holds."""
    if not await wait_until(lambda: archiver.count >= expected, 60):
        notes.append(f"archive has {archiver.count} of {expected} expected trace messages")
    await asyncio.sleep(0.2)
    return archiver.count


async def live_run(args: argparse.Namespace, workdir: Path) -> tuple[Row, Truth, Path]:
    """Servers, archiver, bridges, traffic; the bridges' row, the truth and the archive."""

    options = TrafficOptions(mode=args.mode, messages=args.messages, batch_size=args.batch_size, gap_ms=args.gap_ms,
                             batch_gap_ms=getattr(args, "batch_gap_ms", 20.0), seed=args.seed,
                             numbered=not args.unnumbered)
    subjects = [TRACE_SUBJECT] + ([options.adhoc_dest] if args.mode.startswith("adhoc") else [])
    started = time.monotonic()
    topo: RunningTopology = start_topology(hop_topology(), workdir / "nats")
    bridges: list[Bridge] = []
    archiver = Archiver(workdir / "archive.jsonl", subjects)
    probes: dict[str, Any] = {}
    notes: list[str] = []
    try:
        print(f"topology up in {topo.startup_seconds:.1f} s", flush=True)
        await archiver.start(topo.client_url(ARCHIVER, USER))
        bridge_servers = [f"east-{i}" for i in range(1, args.bridges + 1)]
        queue = "nats-otel" if args.bridges > 1 else None
        for server in bridge_servers:
            bridges.append(Bridge(workdir, server, topo.client_url(server, USER), subjects, queue,
                                  getattr(args, "workers", 1)))
        for bridge in bridges:
            bridge.wait_ready()
        notes += await wait_members(bridges)
        if getattr(args, "before_traffic", None) is not None:  # a test's change to the group (a stall)
            notes += await args.before_traffic(bridges, topo)
        probes.update(await probe_interest(topo, {*bridge_servers, ARCHIVER}))
        # Bridges run before the traffic they trace, as deployed: a bridge vouches for its
        # stream from `_INTEREST_MARGIN_NS` after it subscribed, and a stretch of alike
        # messages from its first one needs a hop window (`link.max_hop_latency`) before it
        # (`sequences`); a run started at once has its first cluster left ambiguous.
        await asyncio.sleep(getattr(args, "warm_s", 1.0))
        traffic_started = time.monotonic()
        urls = {name: topo.client_url(name, USER) for name in topo.names}
        report = await run_traffic(urls[PUBLISHER], urls, options)
        print(f"published {report.published} ({args.mode}, {report.contexts} contexts) in {report.duration_s:.2f} s; "
              f"received per server {report.received}", flush=True)
        if not report.complete:
            notes.append(f"subscribers missed messages: {report.received}")
        # Four reports per message (east-2, east-1, east-3, leaf-1): wait for all of them.
        expected = report.published * len(topo.names)
        if not await wait_until(lambda: archiver.count >= expected, 30):
            notes.append(f"archive has {archiver.count} of {expected} expected trace messages")
        await asyncio.sleep(0.5)  # anything beyond the expected count (there should be none)
        archived = archiver.count
        # Each report is mapped `link.wait` after it arrived: wait until every server span is
        # written (one per report), so that the bridges' own counters are final too.
        if not await wait_until(lambda: server_spans(bridges) >= archived, 30, 0.5):
            notes.append(f"the bridges wrote {server_spans(bridges)} server spans for {archived} trace messages")
        metrics = [b.metrics() for b in bridges]
        traffic_s = time.monotonic() - traffic_started
    finally:
        codes = await stop_all(bridges, probes, archiver, topo)
    if any(code != 0 for code in codes):
        notes.append(f"bridge exit codes {codes}")
    if archiver.errors:
        notes.append(f"archiver errors: {archiver.errors[:3]}")
    received = _sum(metrics, "nats_otel_messages_received_total")
    dropped = _sum(metrics, "nats_otel_messages_dropped_total")
    links = {result: _sum(metrics, f'nats_otel_hop_links_total{{result="{result}"}}')
             for result in ("matched", UNMATCHED, AMBIGUOUS)}
    per_bridge = [int(_sum([m], "nats_otel_messages_received_total")) for m in metrics]
    print(f"archived {archived} trace messages (expected {expected}); bridges received {received:.0f} "
          f"({per_bridge} each), dropped {dropped:.0f}; the bridges' own nats_otel_hop_links_total {links}", flush=True)

    truth = compute_truth(read_raws(archiver.path))
    describe_truth(truth)
    disagreements = Counter(what for what, _ in truth.label_mismatches if what != "size")
    if disagreements:
        notes.append(f"order and the reports' labels disagree: {dict(disagreements)} (the truth is in doubt)")
    outputs = [line for b in bridges if b.output.exists() for line in b.output.read_bytes().splitlines()]
    result = score(truth, read_otlp_json_lines(outputs))
    layout = "one bridge" if args.bridges == 1 else f"{args.bridges} bridges, one queue group (sidecars)"
    if getattr(args, "workers", 1) > 1:
        layout += f", {args.workers} workers each"
    label = f"{layout}, {traffic_label(options)}"
    row = Row(label, result, time.monotonic() - started, notes, sum(metrics, Counter()))
    print(f"  row time {row.seconds:.1f} s (traffic and bridges {traffic_s:.1f} s)", flush=True)
    return row, truth, archiver.path


def traffic_label(options: TrafficOptions) -> str:
    if options.mode == "per_message":
        return f"a traceparent per message ({options.gap_ms:g} ms apart)"
    if options.mode == "batch":
        return f"batches of {options.batch_size} under one traceparent, {options.gap_ms:g} ms apart"
    if options.mode == "back_to_back":
        return f"batches of {options.batch_size} under one traceparent, back to back"
    if options.mode == "adhoc_back_to_back":
        return f"ad hoc, one Nats-Trace-Dest, batches of {options.batch_size} back to back"
    return f"ad hoc, one Nats-Trace-Dest, {options.gap_ms:g} ms apart"


def read_raws(path: Path) -> list[RawTraceMessage]:
    return [r for r in read_archive([str(path)]) if isinstance(r, RawTraceMessage)]


def describe_truth(truth: Truth) -> None:
    """What the truth rests on, and the numbers a matcher is tuned to (µs)."""
    print(f"truth: {len(truth.reports)} reports, {len(truth.hops)} hops over {len(truth.links())} connections; "
          f"{len(truth.unplaced)} unplaced, {truth.duplicates} duplicates, {truth.rejected} undecodable, "
          f"{truth.time_ties} same-nanosecond ties, "
          f"label disagreements {dict(Counter(w for w, _ in truth.label_mismatches))}", flush=True)
    for problem in truth.problems:
        print(f"  PROBLEM {problem.describe()}")
    print("  per connection, µs (p0 / p1 / p10 / p50 / p90 / p99 / max):")
    for stats in link_statistics(truth):
        def us(values: tuple[int, ...]) -> str:
            return " / ".join(f"{v / 1000:.0f}" if abs(v) >= 10_000 else f"{v / 1000:.1f}" for v in values)
        print(f"  {stats.link.label():34} {stats.messages:5} msgs  latency {us(stats.latency)}")
        print(f"  {'':34} {'':10} latency step {us(stats.latency_step)}")
        print(f"  {'':34} {'':10} egress spacing {us(stats.spacing)}")
        if stats.same_context_spacing:
            print(f"  {'':34} {'':10} ... within one context {us(stats.same_context_spacing)}")
        print(f"  {'':34} {'':10} arrival spacing {us(stats.arrival_spacing)}")
        print(f"  {'':34} {'':10} in flight {' / '.join(map(str, stats.in_flight))} messages")


def convert_row(truth: Truth, archive: Path, drop: float, seed: int, workdir: Path) -> Row:
    """`nats-otel convert` of the archive with `drop` of its trace messages removed at random."""
    started = time.monotonic()
    lines = [line for line in archive.read_bytes().splitlines() if line.strip()]
    rng = random.Random(seed)
    kept = [line for line in lines if rng.random() >= drop]
    dropped_archive = workdir / f"archive-minus-{drop:g}.jsonl"
    dropped_archive.write_bytes(b"".join(line + b"\n" for line in kept))
    output = workdir / "convert.otlp.jsonl"
    run = subprocess.run([sys.executable, "-m", "nats_otel.cli", "convert", str(dropped_archive), "-o", str(output),
                          "--quiet"], capture_output=True, text=True, check=False)
    notes = [] if run.returncode == 0 else [f"convert exited {run.returncode}: {run.stderr[-500:]}"]
    remaining = {identity(decode(raw)) for raw in read_raws(dropped_archive)}
    linkable = {ident for ident, hop in truth.hops.items() if ident in remaining and hop.upstream in remaining}
    result = score(truth, read_otlp_json_lines(output.read_bytes().splitlines()), only=linkable)
    notes.append(f"{len(lines) - len(kept)} of {len(lines)} trace messages dropped; "
                 f"{len(linkable)} of {len(truth.hops)} hops keep both reports")
    return Row(f"`convert` of that archive, {drop:.0%} of trace messages dropped", result,
               time.monotonic() - started, notes)


def print_table(rows: list[Row]) -> None:
    print()
    print("| deployment and traffic | hops | linked right | wrong | unmatched | ambiguous | missing | time |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        c = row.result.counts
        print(f"| {row.label} | {row.result.hops:,} | {c[RIGHT]:,} ({row.result.fraction(RIGHT):.1%}) | {c[WRONG]:,} "
              f"| {c[UNMATCHED]:,} | {c[AMBIGUOUS]:,} | {c[MISSING]:,} | {row.seconds:.0f} s |")
    for row in rows:
        for note in row.notes:
            print(f"  {row.label}: {note}")
        if row.result.conflicting_duplicates:
            print(f"  {row.label}: {row.result.conflicting_duplicates} span ids output twice with different parents")
        if row.result.wrong_offsets:
            print(f"  {row.label}: wrong links, chosen egress minus true one (messages on the connection): "
                  f"{dict(sorted(row.result.wrong_offsets.items()))}")


def _interrupted(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bridges", type=int, choices=(1, 2, 3), default=1,
                        help="bridge processes, on east-1.. (more than one: one queue group)")
    parser.add_argument("--mode", choices=MODES, default="per_message")
    parser.add_argument("--workers", type=int, default=1, help="each bridge's --workers (worker processes)")
    parser.add_argument("--messages", type=int, default=1000, help="traced messages published (3 hops each)")
    parser.add_argument("--batch-size", type=int, default=100, help="messages per traceparent (batch, back_to_back)")
    parser.add_argument("--gap-ms", type=float, default=2.0, help="between messages (not back_to_back)")
    parser.add_argument("--warm-s", type=float, default=1.0,
                        help="seconds the bridges run before the traffic (0: at once)")
    parser.add_argument("--batch-gap-ms", type=float, default=20.0,
                        help="after each batch (issue 36's scenario: bursts of 50 paced to 500 msgs/s: 100)")
    parser.add_argument("--drop", type=float, default=0.0, help="also score `convert` of the archive with this "
                        "fraction of trace messages dropped at random")
    parser.add_argument("--convert-archive", type=Path, help="only the convert row, on this archive (no servers)")
    parser.add_argument("--seed", type=int, default=29)
    parser.add_argument("--unnumbered", action="store_true",
                        help="no per-message header (Hop-Check-Seq): messages of a context alike but for time")
    parser.add_argument("--workdir", type=Path, help="keep archive, spans and logs here (default: a temporary folder)")
    args = parser.parse_args(argv)
    # SIGTERM (and SIGINT, even where a shell started us with it ignored) unwinds through
    # the `finally` blocks, which stop every server and bridge; dying at once would leave
    # them running (they have sessions of their own).
    signal.signal(signal.SIGTERM, _interrupted)
    signal.signal(signal.SIGINT, _interrupted)
    if not 0 <= args.drop < 1:
        parser.error("--drop: a fraction in [0, 1)")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="hop-links-"))
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"work directory: {workdir}", flush=True)
    rows: list[Row] = []
    complete = True
    if args.convert_archive:
        started = time.monotonic()
        truth = compute_truth(read_raws(args.convert_archive))
        describe_truth(truth)
        print(f"  truth in {time.monotonic() - started:.1f} s")
        complete = not truth.problems
        archive = args.convert_archive
    else:
        row, truth, archive = asyncio.run(live_run(args, workdir))
        rows.append(row)
        complete = not row.notes and not truth.problems
    if args.drop or args.convert_archive:
        rows.append(convert_row(truth, archive, args.drop, args.seed, workdir))
    print_table(rows)
    return 0 if complete else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt as stopped:
        print(f"interrupted ({stopped}); servers and bridges stopped", file=sys.stderr)
        sys.exit(130)
