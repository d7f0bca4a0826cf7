"""Benchmark: burst absorption. `nats-otel bridge` with default settings (only URL, subject,
endpoint, metrics port; JetStream mode adds a stream it creates) fed a burst of recorded trace
messages (default 60,000) by one publisher process writing them as fast as its socket takes
them; how much of the burst arrives, what is dropped and why, how much the bridge held at
its peak, and its peak RSS.

    python bench/burst_absorption.py                                  # core and JetStream
    python bench/burst_absorption.py --baseline /tmp/base-5b7332e     # and another checkout
    python bench/burst_absorption.py --burst-messages 200000 --mode core --rounds 2

* core      - the intake (bounded in bytes, `batch.queue_bytes`) absorbs the burst or drops
              and counts; intake peak = `nats_otel_queue_depth` / `_queue_bytes` from
              /metrics, sampled every 0.2 s.
* jetstream - the stream takes the burst, the bridge drains it; what it held at its peak =
              the durable's unacked messages (`num_ack_pending`, bounded by
              `jetstream.max_ack_pending`) from the server's /jsz, sampled every 0.2 s.
              "stored" is what the stream kept of the burst (a core publish into a stream has
              no flow control: the server may drop past its ingest queue, 100k msgs/128 MB).

Arrived = spans at the receiver / spans per pool message (an average over the corpus); drain
= first publish to last span. With `--baseline DIR` the other checkout's bridge runs each
phase too, alternated with ours in every round, and the summary gives ours / baseline. Peak
RSS covers the bridge and its children (sampled every 0.25 s). The pool, the publisher, the
receiver and the bridge process come from bench/_bridge_runs.py and its helpers.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _bridge_meters import Sampler, scrape, total
from _bridge_runs import Bench

_DROPPED = "nats_otel_messages_dropped_total{"


class HeldSampler:
    """What the bridge holds, every 0.2 s: core, its intake (messages, bytes) from /metrics;
    JetStream, the durable's unacked messages from the server's /jsz. Keeps the peaks."""

    def __init__(self, bench: Bench, port: int, stream: str | None) -> None:
        self.bench, self.port, self.stream = bench, port, stream
        self.depth = self.bytes = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            if self.stream is None:
                m = scrape(self.port)
                self.depth = max(self.depth, m.get("nats_otel_queue_depth", 0.0))
                self.bytes = max(self.bytes, m.get("nats_otel_queue_bytes", 0.0))
            else:
                consumer = _jsz(self.bench, self.stream)[1]
                self.depth = max(self.depth, float(consumer.get("num_ack_pending", 0)))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _jsz(bench: Bench, stream: str) -> tuple[dict, dict]:
    """The stream's and its (one) durable's details from the server's /jsz; {} when absent."""
    try:
        jsz = bench.topo.server("n1").monitor("jsz?accounts=true&streams=true&consumers=true")
    except (ConnectionError, OSError):
        return {}, {}
    for account in jsz.get("account_details") or []:
        for detail in account.get("stream_detail") or []:
            if detail.get("name") == stream:
                consumers = detail.get("consumer_detail") or [{}]
                return detail, consumers[0]
    return {}, {}


def absorb(bench: AbsorbBench, mode: str, round_number: int, src: Path | None) -> dict:
    """One burst into a fresh default-settings bridge; the row of the summary."""
    name = ("base-" if src else "") + mode
    bench.rx.reset(track=False)
    subject = f"bench.absorb.{name}.{round_number}"
    stream = f"ABSORB_{name.replace('-', '_').upper()}_{round_number}" if mode == "jetstream" else None
    extra = ["--stream", stream, "--durable", "absorb", "--create-stream"] if stream else []
    proc, port = bench.start_bridge(f"absorb-{name}-{round_number}", 1, mode=mode, subject=subject,
                                    extra=extra, src=src)
    sampler, held = Sampler(proc.pid), HeldSampler(bench, port, stream)
    pub = bench.publish(subject, limit=bench.args.burst_messages)
    expected = pub["sent"] * bench.spans_per_msg
    bench.rx.wait_quiet(int(expected), quiet=5.0, timeout=600)
    m = scrape(port)
    stored = _jsz(bench, stream)[0].get("state", {}).get("messages") if stream else None
    held.stop()
    sampler.stop()
    bench.stop(proc)
    if stream:
        bench.delete_stream(stream)
    drops = {k.split('"')[1]: v for k, v in m.items() if k.startswith(_DROPPED) and v}
    r = {"mode": mode, "bridge": str(src) if src else "this", "sent": pub["sent"],
         "pub_rate": pub["sent"] / max(pub["ended"] - pub["started"], 1e-6), "stored": stored,
         "received": total(m, "nats_otel_messages_received"), "arrived": bench.rx.spans / bench.spans_per_msg,
         "share": bench.rx.spans / expected if expected else 0.0, "drops": drops,
         "naks": total(m, 'nats_otel_jetstream_acks_total{kind="nak"}'),
         "held_peak": held.depth, "held_peak_bytes": held.bytes, "rss": sampler.peak_rss,
         "drain": max(bench.rx.last - pub["started"], 0.0)}
    print(f"absorb {name} (round {round_number}): {r['share']:.1%} of {r['sent']:,} arrived in {r['drain']:.1f} s "
          f"(published at {r['pub_rate']:,.0f}/s; received {r['received']:,.0f}"
          f"{f', stored {stored:,}' if stored is not None else ''}, drops {drops or 0}); held at peak "
          f"{held.depth:,.0f} msgs{f' / {held.bytes / 2**20:.1f} MiB' if not stream else ''}; "
          f"peak RSS {sampler.peak_rss / 2**20:.0f} MB", flush=True)
    return r


class AbsorbBench(Bench):
    def delete_stream(self, stream: str) -> None:
        """Free the server's storage for the next round."""
        import asyncio

        import nats

        async def delete() -> None:
            nc = await nats.connect(self.url)
            try:
                await nc.jetstream().delete_stream(stream)
            finally:
                await nc.close()

        asyncio.run(delete())


def report(rows: list[dict]) -> None:
    print("\n== burst absorption (same run, same machine; default settings) ==")
    print(f"{'mode':<10}{'bridge':<26}{'burst':>8}{'arrived':>9}{'drops':>28}{'held at peak':>28}{'RSS MB':>8}"
          f"{'drain s':>9}")
    for r in rows:
        drops = ", ".join(f"{v:,.0f} {k}" for k, v in r["drops"].items()) or "0"
        held = f"{r['held_peak']:,.0f} msgs" + (" unacked" if r["mode"] == "jetstream" else
                                                f" / {r['held_peak_bytes'] / 2**20:.1f} MiB" if r["held_peak_bytes"]
                                                else " (no byte gauge)")
        print(f"{r['mode']:<10}{Path(r['bridge']).name[:25]:<26}{r['sent']:>8,}{r['share']:>9.1%}{drops:>28}"
              f"{held:>28}{r['rss'] / 2**20:>8.0f}{r['drain']:>9.1f}")
    for mode in ("core", "jetstream"):
        ours = [r for r in rows if r["mode"] == mode and r["bridge"] == "this"]
        base = [r for r in rows if r["mode"] == mode and r["bridge"] != "this"]
        if ours and base:
            o = min(x["share"] for x in ours)
            b = min(x["share"] for x in base)
            print(f"{mode}: arrived (worst round) ours {o:.1%} vs baseline {b:.1%} = {o / b:.2f}x; peak RSS "
                  f"{max(x['rss'] for x in ours) / 2**20:.0f} vs {max(x['rss'] for x in base) / 2**20:.0f} MB; "
                  f"drain {max(x['drain'] for x in ours):.1f} vs {max(x['drain'] for x in base):.1f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--burst-messages", type=int, default=60_000, help="the burst (default 60k)")
    parser.add_argument("--mode", action="append", choices=["core", "jetstream"],
                        help="bridge mode (repeatable; default both)")
    parser.add_argument("--rounds", type=int, default=1, help="rounds, each alternating ours and the baseline")
    parser.add_argument("--baseline", type=Path, help="a checkout of another version (e.g. a git worktree)")
    parser.add_argument("--json", type=Path, help="write the rows here")
    args = parser.parse_args()
    args.messages = args.burst_messages  # the pool Bench builds: one burst
    modes = args.mode or ["core", "jetstream"]
    print(f"machine: {os.cpu_count()} cores; load average {os.getloadavg()[0]:.2f}", flush=True)
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="bench-absorb-") as tmp:
        bench = AbsorbBench(args, Path(tmp))
        try:
            for round_number in range(args.rounds):
                for mode in modes:
                    for src in (None, args.baseline) if args.baseline else (None,):
                        rows.append(absorb(bench, mode, round_number, src))
        finally:
            bench.close()
    report(rows)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
