"""bench/bridge_throughput.py, the phases: one nats-server, the receiver, and each phase
run against them (raw, naive, core bursts and paced runs, two bridges, latency, JetStream).
Results are kept in ``Bench.results`` for the report."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pickle
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _bridge_meters import Receiver, Sampler, scrape, total
from _bridge_roles import build_pool

ROLES = Path(__file__).resolve().with_name("_bridge_roles.py")
PY = sys.executable
NAIVE_QUEUE = 2_000_000  # BatchSpanProcessor(max_queue_size=...), the no-drop naive pipeline
# A paced bridge keeps up when its last span comes within this after the publisher's last
# message and the link window: the batch's delay (0.2 s), its conversion and export.
SUSTAIN_LAG_S = 0.6


def link_wait() -> float:
    """The bridges' `link.wait` in seconds: the environment's (`NATS_OTEL_LINK__WAIT`, which
    the bridges inherit) or the default."""
    from nats_otel.bridge.settings_sections import LinkSettingsModel

    return float(os.environ.get("NATS_OTEL_LINK__WAIT", LinkSettingsModel().wait))


# The link-evidence exchange (bridge/exchange.py): its cost beside one bridge, and three
# bridges in one queue group against one. name -> (bridge processes, their arguments).
EXCHANGE_VARIANTS: dict[str, tuple[int, tuple[str, ...]]] = {
    "x-one": (1, ()),  # no queue group: the exchange is off (today's single bridge)
    "x-q-on": (1, ("--queue", "g", "--link-exchange", "auto")),  # publishing to nobody else
    "x-q-off": (1, ("--queue", "g", "--link-exchange", "off")),
    "x-3-on": (3, ("--queue", "g", "--link-exchange", "auto")),
    "x-3-off": (3, ("--queue", "g", "--link-exchange", "off")),  # what the exchange buys: the links
}


class Bench:
    def __init__(self, args: argparse.Namespace, workdir: Path) -> None:
        from nats_otel.devkit.processes import start_topology
        from nats_otel.devkit.topology import single_server

        self.args = args
        self.workdir = workdir
        self.topo = start_topology(single_server(jetstream=True), workdir / "nats")
        srv = self.topo.server("n1")
        self.url = self.topo.client_url("n1", "a")
        self.host, self.port = "127.0.0.1", srv.ports.client
        self.pool = workdir / "pool.pkl"
        print(f"building a pool of {args.messages:,} trace messages...", flush=True)
        self.corpus_spans = build_pool(args.messages, self.pool, getattr(args, "encoding", None),
                                       getattr(args, "variant", None))
        self.spans_per_msg = sum(self.corpus_spans) / len(self.corpus_spans)
        print(f"  {self.spans_per_msg:.3f} spans per trace message on average", flush=True)
        self.rx = Receiver()
        self.procs: list[subprocess.Popen] = []
        self.results: dict[str, dict] = {}
        self.by_round: dict[str, list[dict]] = {}  # phase -> its result in each round, in order
        self.exchange: dict[str, list[dict[str, dict]]] = {}

    # -- helpers

    def spawn(self, argv: list[str], **kw) -> subprocess.Popen:
        proc = subprocess.Popen(argv, **kw)
        self.procs.append(proc)
        return proc

    def stop(self, proc: subprocess.Popen, timeout: float = 30) -> None:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def publish(self, subject: str, rate: float = 0, duration: float = 0, limit: int = 0) -> dict:
        out = self.workdir / f"pub-{subject}.pkl"
        proc = self.spawn([PY, str(ROLES), "_publish", "--pool", str(self.pool), "--subject", subject,
                           "--host", self.host, "--port", str(self.port), "--user", "a", "--password", "pwd",
                           "--rate", str(rate), "--duration", str(duration), "--limit", str(limit),
                           "--out", str(out)])
        proc.wait()
        return pickle.loads(out.read_bytes())

    def wait_file(self, path: Path, timeout: float = 30) -> None:
        deadline = time.time() + timeout
        while not path.exists():
            if time.time() > deadline:
                raise TimeoutError(f"{path} did not appear")
            time.sleep(0.05)

    def expected_spans(self, sent: int) -> int:
        """The spans the first `sent` messages of the (cycled) pool give, exactly."""
        spans, n = self.corpus_spans, len(self.corpus_spans)

        def prefix(k: int) -> int:  # the first k messages of the pool
            return k // n * sum(spans) + sum(spans[: k % n])

        cycles, rest = divmod(sent, self.args.messages)
        return cycles * prefix(self.args.messages) + prefix(rest)

    def keep(self, name: str, r: dict) -> None:
        """Keep the best round of a phase, and every round's figure for the paired ratios."""
        self.by_round.setdefault(name, []).append(r)
        if name not in self.results or r["rate"] > self.results[name]["rate"]:
            self.results[name] = r

    # -- phases

    def phase_raw(self, round_number: int = 0) -> None:
        # Files and subject per round: a round's subscriber must not find the last one's ready file.
        out = self.workdir / f"raw-{round_number}.json"
        subject = f"bench.raw.{round_number}"
        proc = self.spawn([PY, str(ROLES), "_raw", "--url", self.url, "--subject", subject, "--out", str(out)])
        sampler = Sampler(proc.pid)
        self.wait_file(Path(str(out) + ".ready"))
        cpu0 = sampler.cpu()
        pub = self.publish(subject, limit=self.args.burst or 0)
        # Its CPU from just before the burst to its last message: read once the count stops
        # (it then waits on its socket, spending nothing), like the bridge's to its last span.
        time.sleep(1.0)
        cpu = sampler.cpu() - cpu0
        sampler.stop()
        self.stop(proc)
        st = json.loads(out.read_text())
        dur = max(st["last"] - st["first"], 1e-6)
        # e2e: the whole burst from the first byte published to the last message counted, as
        # a user timing the run would (the bridge's includes its link window, `link.wait`).
        r = {"msgs": st["n"], "rate": st["n"] / dur, "sent": pub["sent"],
             "e2e": st["n"] / max(st["last"] - pub["started"], 1e-6),
             "pub_rate": pub["sent"] / (pub["ended"] - pub["started"]),
             "us_per_msg": cpu / max(st["n"], 1) * 1e6, "rss": sampler.peak_rss}
        self.keep("raw", r)
        print(f"raw receive : {r['rate']:10,.0f} msgs/s  ({r['msgs']:,} of {r['sent']:,}; "
              f"publisher {r['pub_rate']:,.0f}/s; {r['us_per_msg']:.1f} us/msg)", flush=True)

    def phase_naive(self, sdk_defaults: bool = False, round_number: int = 0) -> None:
        """The naive SDK pipeline fed a burst. By default configured not to drop (its queue
        holds the whole burst); `sdk_defaults`: the SDK's 2,048-span queue, which drops.

        Its rate is measured like the bridge's: spans that arrived at the receiver, over the
        time from the first to the last arrival (what was dropped or still queued is not
        counted)."""
        name = "naive-sdk-defaults" if sdk_defaults else "naive"
        out = self.workdir / f"{name}-{round_number}.json"
        self.rx.reset(track=False)
        # What a user who saw the SDK's "Queue full" warning configures (issue 39): a queue of
        # 2,000,000 spans, far above any burst here, so nothing is dropped for a full queue.
        queue = 0 if sdk_defaults else NAIVE_QUEUE
        proc = self.spawn([PY, str(ROLES), "_naive", "--url", self.url, "--subject", f"bench.{name}.{round_number}",
                           "--endpoint", self.rx.endpoint, "--out", str(out), "--max-queue", str(queue)])
        sampler = Sampler(proc.pid)
        self.wait_file(Path(str(out) + ".ready"))
        cpu0, t0 = sampler.cpu(), time.time()
        pub = self.publish(f"bench.{name}.{round_number}", limit=self.args.naive_messages)
        expected = self.expected_spans(pub["sent"])  # exact: its CPU is read when the last arrives
        self.rx.wait_quiet(expected, quiet=6.0, timeout=600)
        cpu = sampler.cpu() - cpu0
        sampler.stop()
        self.stop(proc)
        st = json.loads(out.read_text()) if out.exists() else {"n": 0, "spans": 0}
        dur = max(self.rx.last - self.rx.first, 1e-6)
        r = {"spans": self.rx.spans, "span_rate": self.rx.spans / dur, "rate": self.rx.spans / dur / self.spans_per_msg,
             "e2e": self.rx.spans / self.spans_per_msg / max(self.rx.last - pub["started"], 1e-6),
             "sent": pub["sent"], "received": st["n"], "spans_made": st["spans"],
             "dropped": st["spans"] - self.rx.spans, "max_queue": queue or 2048,
             "cpu": cpu / max(self.rx.last - t0, 1e-6), "rss": sampler.peak_rss,
             # CPU seconds (to its last span) per message that arrived as spans, as the bridge's
             "us_per_msg": cpu / max(self.rx.spans / self.spans_per_msg, 1) * 1e6}
        self.keep(name, r)
        print(f"{name:<19}: {r['rate']:10,.0f} msgs/s  {r['span_rate']:10,.0f} spans/s  "
              f"(received {r['received']:,} of {r['sent']:,}; spans made {r['spans_made']:,}, arrived {r['spans']:,}, "
              f"queue {r['max_queue']:,}; CPU {r['cpu']:.0%}, {r['us_per_msg']:.1f} us/msg, "
              f"RSS {r['rss'] / 2**20:.0f} MB)", flush=True)

    def start_bridge(self, name: str, workers: int, mode: str = "core", subject: str = "bench.core",
                     extra: list[str] | None = None, src: Path | None = None) -> tuple[subprocess.Popen, int]:
        """Start `nats-otel bridge`; `src`: run the `nats_otel` of that checkout instead of ours."""
        from nats_otel.devkit.server_config import free_ports

        mport = free_ports(1)[0]
        argv = [PY, "-m", "nats_otel.cli", "bridge", "--nats-url", self.url, "--subject", subject,
                "--otlp-endpoint", self.rx.endpoint, "--metrics-port", str(mport), "--log-level", "WARNING",
                "--mode", mode, *(extra or [])]
        if src is None:  # `--ours-flag`: our bridge's flags, its baseline's left at their defaults
            argv += getattr(self.args, "ours_flag", None) or []
        if workers != 1:
            argv += ["--workers", str(workers)]
        log = open(self.workdir / f"bridge-{name}.log", "wb")  # noqa: SIM115
        # `python -m` puts the working directory first on sys.path; the spawned workers
        # inherit the path, so the whole bridge runs that checkout's code.
        env = {**os.environ, "PYTHONPATH": str(src)} if src else None
        proc = self.spawn(argv, stderr=log, cwd=src, env=env)
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
                if opener.open(f"http://127.0.0.1:{mport}/readyz", timeout=1).status == 200:
                    return proc, mport
            except OSError:
                pass
            if proc.poll() is not None:
                raise SystemExit(f"bridge {name} exited: see {log.name}")
            time.sleep(0.1)
        raise SystemExit(f"bridge {name} not ready: see {log.name}")

    def phase_core(self, workers: int, round_number: int = 0, rate: float = 0, src: Path | None = None,
                   label: str = "") -> dict:
        """A burst of the whole pool (rate 0), or the pool paced at `rate` for --sustain-seconds.

        `src`: the bridge of another checkout (the baseline), reported as `base-...`; `label`:
        the name to report it under instead.
        """
        name = label or ("base-" if src else "") + (f"core-w{workers}" if rate else f"burst-core-w{workers}")
        self.rx.reset(track=False)
        subject = f"bench.{name}.{round_number}"
        proc, mport = self.start_bridge(name, workers, subject=subject, src=src)
        sampler = Sampler(proc.pid)
        cpu0, t0 = sampler.cpu(), time.time()
        # A burst: the first --burst messages of the pool (default all); paced: the pool cycled.
        pub = self.publish(subject, rate=rate, duration=self.args.sustain_seconds if rate else 0,
                           limit=0 if rate else self.args.burst or 0)
        expected = self.expected_spans(pub["sent"])  # exact: its CPU is read when the last arrives
        self.rx.wait_quiet(expected, quiet=2.5, timeout=300)
        cpu = sampler.cpu() - cpu0
        m = scrape(mport)
        sampler.stop()
        self.stop(proc)
        dur = max(self.rx.last - self.rx.first, 1e-6)
        wait = link_wait()
        r = {"spans": self.rx.spans, "span_rate": self.rx.spans / dur, "rate": self.rx.spans / dur / self.spans_per_msg,
             "e2e": self.rx.spans / self.spans_per_msg / max(self.rx.last - pub["started"], 1e-6),
             "offered": rate or pub["sent"] / max(pub["ended"] - pub["started"], 1e-6),
             "sent": pub["sent"], "received": total(m, "nats_otel_messages_received"),
             "decoded": total(m, "nats_otel_messages_decoded"), "dropped": total(m, "nats_otel_messages_dropped"),
             # What a bridge of no CPU could reach end to end: the last message published
             # waits `link.wait` before it is mapped (docs/performance.md, "Targets").
             "window_bound": pub["sent"] / (max(pub["ended"] - pub["started"], 0.0) + wait),
             # Paced: how long after the window the last span came (kept up: well under a second).
             "lag": self.rx.last - pub["ended"] - wait, "whole": self.rx.spans >= expected,
             "cpu": cpu / max(self.rx.last - t0, 1e-6), "rss": sampler.peak_rss, "workers": workers,
             # CPU seconds per message carried (a burst's cores over its window read low: it waits `link.wait`)
             "us_per_msg": cpu / max(self.rx.spans / self.spans_per_msg, 1) * 1e6}
        self.keep(name, r)
        print(f"bridge {name}: {r['rate']:10,.0f} msgs/s  {r['span_rate']:10,.0f} spans/s  "
              f"(received {r['received']:,.0f} of {r['sent']:,}, decoded {r['decoded']:,.0f}, "
              f"dropped {r['dropped']:,.0f}; CPU {r['cpu']:.0%}, peak RSS {r['rss'] / 2**20:.0f} MB)", flush=True)
        return r

    def phase_sustained(self, workers: int, start: float, step: float) -> None:
        """The sustained rate, the figure to size by: the pool offered at `start` msgs/s for
        --sustain-seconds, then `step` more each time, until the bridge no longer keeps up
        (a span missing, a message dropped, or the last span later than `SUSTAIN_LAG_S`
        after the publisher's last message and the link window: the intake grew). Reports
        the highest pace kept up."""
        rate, kept = start, None
        while True:
            if rate * self.args.sustain_seconds > self.args.messages:
                print(f"sustained: stopped at {rate:,.0f} msgs/s: the pool ({self.args.messages:,}) would cycle "
                      "(trace ids repeat); raise --messages", flush=True)
                break
            r = self.phase_core(workers, rate=rate, label=f"sustain-w{workers}-{rate:.0f}")
            ok = r["whole"] and not r["dropped"] and r["lag"] <= SUSTAIN_LAG_S
            print(f"sustained: offered {rate:,.0f} msgs/s -> {'kept up' if ok else 'fell behind'} (last span "
                  f"{r['lag']:+.2f} s after the window, dropped {r['dropped']:,.0f}, every span: {r['whole']}; "
                  f"{r['us_per_msg']:.1f} us/msg)", flush=True)
            if not ok:
                break
            kept = {**r, "offered": rate}
            rate += step
        if kept is not None:
            self.results[f"sustained-w{workers}"] = kept

    def phase_pair(self, workers: int, round_number: int = 0, rate: float = 0) -> None:
        """Two bridge processes in one queue group: do they carry more than one?"""
        name = f"core-2x-w{workers}" if rate else f"burst-core-2x-w{workers}"
        r = self.run_group(name, 2, f"bench.{name}.{round_number}", ["--queue", "bench"], workers=workers,
                           rate=rate, duration=self.args.sustain_seconds if rate else 0)
        self.keep(name, r)

    def run_group(self, name: str, count: int, subject: str, extra: list[str], workers: int = 1,
                  rate: float = 0, duration: float = 0) -> dict:
        """`count` bridge processes started with `extra` (e.g. one queue group), fed the pool:
        a burst (rate 0) or paced at `rate` for `duration` s. Returns what arrived (spans,
        the rate over the arrival window, the spans missing of the exact number expected),
        the drops counted, the CPU summed over the bridges (and the nats-server's, apart),
        the link-evidence exchange's counters and what the bridges' connections published
        (nats-server's /connz: a core-mode bridge publishes only evidence)."""
        self.rx.reset(track=False)
        bridges = [self.start_bridge(f"{name}-{i}" if count > 1 else name, workers, subject=subject, extra=extra)
                   for i in range(1, count + 1)]
        samplers = [Sampler(proc.pid) for proc, _ in bridges]
        server = Sampler(self.topo.server("n1").pid or 0)
        cpu0, srv0, t0 = sum(x.cpu() for x in samplers), server.cpu(), time.time()
        pub = self.publish(subject, rate=rate, duration=duration)
        expected = self.expected_spans(pub["sent"])
        self.rx.wait_quiet(expected, quiet=2.5, timeout=300)
        cpu_s = sum(x.cpu() for x in samplers) - cpu0
        srv_s = server.cpu() - srv0
        ms = [scrape(port) for _, port in bridges]
        conns = [c for c in (self.topo.server("n1").monitor("connz?limit=1024").get("connections") or [])
                 if str(c.get("name", "")).startswith("nats-otel-bridge")]
        for x in (*samplers, server):
            x.stop()
        for proc, _ in bridges:
            self.stop(proc)

        def evidence(result: str) -> float:
            return sum(total(m, f'nats_otel_link_evidence_total{{result="{result}"}}') for m in ms)

        def links(result: str) -> float:
            return sum(total(m, f'nats_otel_hop_links_total{{result="{result}"}}') for m in ms)

        dur = max(self.rx.last - self.rx.first, 1e-6)
        arrived = self.rx.spans / self.spans_per_msg  # messages that arrived as spans
        r = {"bridges": count, "spans": self.rx.spans, "span_rate": self.rx.spans / dur,
             "rate": self.rx.spans / dur / self.spans_per_msg,
             "offered": rate or pub["sent"] / max(pub["ended"] - pub["started"], 1e-6),
             "sent": pub["sent"], "expected_spans": expected, "missing_spans": expected - self.rx.spans,
             "received": sum(total(m, "nats_otel_messages_received") for m in ms),
             "split": [total(m, "nats_otel_messages_received") for m in ms],
             "dropped": sum(total(m, "nats_otel_messages_dropped") for m in ms),
             "cpu": cpu_s / max(self.rx.last - t0, 1e-6), "cpu_s": cpu_s,
             "us_per_msg": cpu_s / arrived * 1e6 if arrived else float("nan"),
             "server_us_per_msg": srv_s / arrived * 1e6 if arrived else float("nan"),
             "rss": sum(x.peak_rss for x in samplers), "workers": workers,
             "evidence": {k: evidence(k) for k in ("published", "received", "unpublished", "dropped", "malformed",
                                                    "invalid", "format", "forged")},
             "evidence_reports": sum(total(m, "nats_otel_link_evidence_reports") for m in ms),
             "evidence_msgs": sum(c.get("in_msgs", 0) for c in conns),
             "evidence_bytes": sum(c.get("in_bytes", 0) for c in conns),
             "links": {k: links(k) for k in ("matched", "unmatched", "ambiguous")}}
        ev = r["evidence"]
        # Batches the others had not recorded (nor refused) when the last span arrived: behind.
        r["evidence_late"] = ev["published"] * (count - 1) - sum(v for k, v in ev.items() if k != "published")
        ev_note = (f"; evidence: {ev['published']:,.0f} batches published ({r['evidence_bytes'] / 2**20:,.1f} MiB), "
                   f"{ev['received']:,.0f} received ({r['evidence_reports']:,.0f} reports), "
                   f"{sum(v for k, v in ev.items() if k not in ('published', 'received')):,.0f} failed/refused"
                   if ev["published"] or ev["received"] or r["evidence_msgs"] else "")
        received = r["split"] if count > 1 else f"{r['received']:,.0f}"
        print(f"bridge {name}: {r['rate']:10,.0f} msgs/s  {r['span_rate']:10,.0f} spans/s  (received {received} "
              f"of {r['sent']:,}, dropped {r['dropped']:,.0f}, spans missing {r['missing_spans']:,}; "
              f"CPU {r['cpu']:.0%}, {r['us_per_msg']:.1f} us/msg, server {r['server_us_per_msg']:.1f} us/msg; "
              f"RSS {r['rss'] / 2**20:.0f} MB; links "
              f"{r['links']['matched']:,.0f}/{r['links']['unmatched']:,.0f}/{r['links']['ambiguous']:,.0f} "
              f"matched/unmatched/ambiguous{ev_note})", flush=True)
        return r

    def phase_exchange(self, stage: str, round_number: int, rate: float = 0) -> None:
        """Every variant of `EXCHANGE_VARIANTS` in turn (reversed in odd rounds), the same load:
        `stage` "burst" (the whole pool at once), "paced" (`rate`, above one bridge's
        capacity) or "fixed" (`rate`, below it), paced ones for --sustain-seconds. Every
        round is kept (`exchange[stage][round][variant]`), for ratios within a round."""
        order = list(EXCHANGE_VARIANTS)
        if round_number % 2:
            order.reverse()
        kept = self.exchange.setdefault(stage, [])
        while len(kept) <= round_number:
            kept.append({})
        for variant in order:
            count, extra = EXCHANGE_VARIANTS[variant]
            name = f"{variant}-{stage}"
            kept[round_number][variant] = self.run_group(
                name, count, f"bench.{name}.{round_number}", list(extra), rate=rate,
                duration=self.args.sustain_seconds if rate else 0)

    def phase_latency(self, workers: int, rate: float) -> None:
        name = f"latency-w{workers}"
        self.rx.reset(track=True)
        subject = f"bench.{name}"
        proc, mport = self.start_bridge(name, workers, subject=subject)
        sampler = Sampler(proc.pid)
        cpu0, t0 = sampler.cpu(), time.time()
        pub = self.publish(subject, rate=rate, duration=self.args.latency_seconds)
        self.rx.wait_quiet(int(pub["sent"] * self.spans_per_msg), quiet=3.0, timeout=60)
        cpu = sampler.cpu() - cpu0
        m = scrape(mport)
        sampler.stop()
        self.stop(proc)
        lat = sorted(self.rx.first_seen[bytes.fromhex(t)] - p for t, p in pub["times"].items()
                     if bytes.fromhex(t) in self.rx.first_seen)
        missing = len(pub["times"]) - len(lat)

        def q(p: float) -> float:
            return lat[min(len(lat) - 1, int(p * len(lat)))] if lat else float("nan")

        r = {"offered": rate, "sent": pub["sent"], "traces": len(pub["times"]), "missing_traces": missing,
             "p50": q(0.50), "p99": q(0.99), "max": lat[-1] if lat else float("nan"),
             "dropped": total(m, "nats_otel_messages_dropped"), "cpu": cpu / max(self.rx.last - t0, 1e-6),
             "rss": sampler.peak_rss}
        self.results[name] = r
        print(f"latency w{workers} at {rate:,.0f} msgs/s: p50 {r['p50'] * 1000:.0f} ms, p99 {r['p99'] * 1000:.0f} ms, "
              f"max {r['max'] * 1000:.0f} ms  ({r['traces']:,} traces, {missing} without spans, dropped "
              f"{r['dropped']:,.0f}; CPU {r['cpu']:.0%}, RSS {r['rss'] / 2**20:.0f} MB)", flush=True)

    def phase_jetstream(self, workers: int, count: int) -> None:
        import nats
        from nats.js.api import StorageType, StreamConfig

        name = f"js-w{workers}"
        subject = f"bench.{name}"
        stream = f"BENCH_{name.replace('-', '_').upper()}"

        async def setup() -> int:
            nc = await nats.connect(self.url)
            js = nc.jetstream()
            await js.add_stream(StreamConfig(name=stream, subjects=[subject], storage=StorageType.FILE))
            await nc.close()
            return 0

        async def stored() -> int:
            nc = await nats.connect(self.url)
            info = await nc.jetstream().stream_info(stream)
            await nc.close()
            return info.state.messages

        async def delete() -> None:
            nc = await nats.connect(self.url)
            await nc.jetstream().delete_stream(stream)
            await nc.close()

        asyncio.run(setup())
        # JetStream takes core publishes without flow control; pace the fill to what it stores.
        filled = 0
        while filled < count:
            batch = min(count - filled, self.args.messages)
            self.publish(subject, limit=batch)
            filled += batch
        time.sleep(1.0)
        waiting = asyncio.run(stored())
        self.rx.reset(track=False)
        proc, mport = self.start_bridge(name, workers, mode="jetstream", subject=subject,
                                        extra=["--stream", stream, "--durable", "bench"])
        sampler = Sampler(proc.pid)
        cpu0, t0 = sampler.cpu(), time.time()
        self.rx.wait_quiet(int(waiting * self.spans_per_msg), quiet=5.0, timeout=1800)
        cpu = sampler.cpu() - cpu0
        m = scrape(mport)
        sampler.stop()
        self.stop(proc)
        asyncio.run(delete())
        dur = max(self.rx.last - self.rx.first, 1e-6)
        r = {"waiting": waiting, "spans": self.rx.spans, "span_rate": self.rx.spans / dur,
             "rate": self.rx.spans / dur / self.spans_per_msg,
             "acked": total(m, 'nats_otel_jetstream_acks_total{kind="ack"}'),
             "cpu": cpu / max(self.rx.last - t0, 1e-6), "rss": sampler.peak_rss, "workers": workers}
        self.results[name] = r
        print(f"bridge {name}: {r['rate']:10,.0f} msgs/s  {r['span_rate']:10,.0f} spans/s  ({waiting:,} waiting in the "
              f"stream, acked {r['acked']:,.0f}; CPU {r['cpu']:.0%}, peak RSS {r['rss'] / 2**20:.0f} MB)", flush=True)

    def close(self) -> None:
        for proc in self.procs:
            self.stop(proc, timeout=10)
        self.rx.stop()
        self.topo.stop()
