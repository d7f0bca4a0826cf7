"""Benchmark: the live bridge (a separate process) against a real nats-server and a real
OTLP/gRPC receiver, with the ceiling and the naive pipeline measured in the same run.

    python bench/bridge_throughput.py --js-workers 1 --js-workers 2   # full run (~20 min)
    python bench/bridge_throughput.py --quick                         # ~1.5 min
    python bench/bridge_throughput.py --workers 1 --workers 3 --skip naive --js-messages 0
    python bench/bridge_throughput.py --quick --baseline /tmp/base   # vs another checkout
    python bench/bridge_throughput.py --only raw --only naive --workers 1 --messages 400000 \
        --sustain-seconds 5 --find-sustained 36000                   # the sustained rate
    python bench/bridge_throughput.py --only exchange --messages 100000 --rounds 3 \
        --sustain-seconds 10 --exchange-rate 15000                    # ~10 min
    python bench/bridge_throughput.py --only raw --only naive --only core --only forward \
        --workers 1 --messages 400000 --burst 60000 --naive-messages 60000 --rounds 6 \
        --burst-only --baseline /tmp/base                             # issue 48's CPU per message

Per round and then as medians with their spread, it prints each consumer's CPU per message
of the burst (its CPU seconds from just before the burst to its last span, the bare
subscriber's to its last message, over the messages: issue 48's measure) for the bare
subscriber, the naive pipeline, ours and the baseline, with bare/ours and naive/ours.

Every phase uses the same pool of recorded trace messages (the corpus replicated with fresh
trace ids, `corpus_replay.replicate`), published raw (their own headers and payloads) by a
separate publisher process writing NATS protocol frames to a socket, so the publisher is
never the slowest part. Phases, one nats-server for all (own subject per phase):

* raw     - a nats-py subscription whose callback only counts: the ceiling.
* naive   - nats-py callback -> the same decode/map -> SDK `ReadableSpan` ->
            `BatchSpanProcessor` -> SDK `OTLPSpanExporter` (gRPC) to a receiver like ours,
            configured not to drop: `max_queue_size` holds the whole burst (what a user does
            after the SDK's "Queue full, dropping Span" warning), the default export batch
            (512), the bridge's 0.2 s delay. The ratios are against this row.
* naive-sdk-defaults - the same with the SDK's default queue (2,048 spans): it drops, and
            only what arrived counts. An extra row, not the baseline.
* core/wN - `nats-otel bridge --workers N` (core mode) fed a burst of the whole pool:
            sustained rate = spans arrived / (last - first arrival), drops from /metrics.
* sustained - with `--find-sustained RATE`: one bridge offered the pool paced at RATE for
            --sustain-seconds, then --sustained-step more each time, until it no longer keeps
            up (a span missing, a drop, or its last span more than 0.6 s after the publisher's
            last message and `link.wait`): the highest pace kept up is the rate to size by.
            Keep RATE x --sustain-seconds under --messages (fresh trace ids).
* base-core/wN - with `--baseline DIR`: the same, with the bridge of another checkout (e.g.
            `git worktree add /tmp/base HEAD~1`), alternated with ours in every round.
* core-2x - two bridge processes in one queue group, the same burst.
* forward - two bridges in one queue group with trace ownership (bridge/routing.py), the
            burst: their summed CPU beyond the round's single bridge, per trace message
            forwarded to its owner, beside the bare subscriber's per message
            (`_bridge_forward.py`).
* exchange - the link-evidence exchange (bridge/exchange.py), variants alternated in every
            round (reversed in odd ones): x-one (one bridge, no queue group: the exchange is
            off), x-q-on (one bridge, `--queue g --link-exchange auto`: it publishes its
            evidence to nobody else), x-q-off (the same with `--link-exchange off`), x-3-on
            (three bridges in the queue group, exchange on), x-3-off (the same, exchange
            off: the three processes' own cost, and the hop links lost without it). Stages: a burst of the pool;
            paced at 1.3x x-one's burst rate of the round (sustained msgs/s); paced at a
            fixed rate one bridge sustains (`--exchange-rate`, default 0.7x x-one's first
            paced rate): nothing dropped, every span arrived, the CPU per message at equal
            work. Paced stages cycle the pool: trace ids repeat after --messages, and a
            downstream report may then match an earlier copy's egress (the "linked" share
            without the exchange reads high there; the burst's is exact).
            CPU per message = bridge CPU (summed over the bridges) / messages arrived as
            spans; nats-server's apart. The exchange's extra CPU = x-q-on - x-q-off.
* latency - the same bridge fed at half its measured maximum rate for a while: per trace id,
            publish time (kept by the publisher) to the first span's arrival (receiver).
* js      - the stream is filled first (the messages "wait"), then `nats-otel bridge
            --mode jetstream` drains it: drain rate and peak RSS.

Bridge CPU is the sum over the bridge process and its worker processes (from /proc).
All rates come from the same run on the same (shared, noisy) machine: compare ratios.

This file is the command line and the report; the phases are in `_bridge_runs.py`, the
child processes (publisher, raw, naive) in `_bridge_roles.py`, the receiver and the
CPU/RSS sampling in `_bridge_meters.py`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _bridge_forward import phase_forward, report_forward
from _bridge_runs import EXCHANGE_VARIANTS, Bench


def report(results: dict[str, dict], workers: list[int]) -> None:
    raw, naive = results.get("raw"), results.get("naive")
    print("\n== summary (same run, same machine) ==")
    print(f"{'what':<22}{'msgs/s':>10}{'spans/s':>10}{'vs naive':>10}{'vs raw':>9}{'CPU':>7}{'RSS MB':>8}"
          f"{'dropped':>9}")
    for name, r in results.items():
        if "rate" not in r:
            continue
        vs_naive = r["rate"] / naive["rate"] if naive and naive["rate"] else float("nan")
        vs_raw = r["rate"] / raw["rate"] if raw and raw["rate"] else float("nan")
        spans = r.get("span_rate", float("nan"))
        print(f"{name:<22}{r['rate']:>10,.0f}{spans:>10,.0f}{vs_naive:>9.2f}x{vs_raw:>9.2f}"
              f"{r.get('cpu', float('nan')):>7.0%}{r.get('rss', 0) / 2**20:>8.0f}{r.get('dropped', 0):>9,.0f}")
    for name, r in results.items():
        if name.startswith("latency"):
            print(f"{name}: offered {r['offered']:,.0f} msgs/s -> p50 {r['p50'] * 1000:.0f} ms, p99 "
                  f"{r['p99'] * 1000:.0f} ms (target p99 < 1000 ms)")
    best = max((results[f"core-w{w}"]["rate"] for w in workers if f"core-w{w}" in results), default=0)
    for name, r in results.items():
        if name.startswith("core-"):
            print(f"{name}: offered {r['offered']:,.0f} msgs/s paced -> carried {r['rate']:,.0f} msgs/s, "
                  f"dropped {r['dropped']:,.0f} of {r['sent']:,}")
    if best and naive and raw:
        for w in workers:
            r = results.get(f"core-w{w}")
            if r:
                print(f"core bridge --workers {w}: {r['rate']:,.0f} msgs/s = {r['rate'] / naive['rate']:.2f}x the "
                      f"no-drop naive pipeline (target >= 6x with one worker), {r['rate'] / raw['rate']:.2f} of raw "
                      "receive (target >= 0.35 with one worker)")
    for name, r in results.items():
        if name.startswith("sustained-"):
            print(f"{name}: kept up with {r['offered']:,.0f} msgs/s offered for its seconds, nothing lost, "
                  f"{_cpu_per_msg(r):.1f} us/msg" + (f"; {r['offered'] / raw['rate']:.3f} of raw" if raw else "")
                  + (f", {r['offered'] / naive['rate']:.2f}x naive" if naive else ""))
    one_w, two_w = results.get("core-w1"), results.get("core-w2")
    if one_w and two_w:
        print(f"--workers 2: {two_w['rate'] / one_w['rate']:.2f}x one worker (target > 1.6x)")
    for w in workers:
        for kind in ("burst-core", "core"):
            ours, base = results.get(f"{kind}-w{w}"), results.get(f"base-{kind}-w{w}")
            if ours and base:
                print(f"{kind}-w{w}: ours {ours['rate']:,.0f} vs baseline {base['rate']:,.0f} msgs/s = "
                      f"{ours['rate'] / base['rate']:.2f}x; CPU per message {_cpu_per_msg(ours):.0f} vs "
                      f"{_cpu_per_msg(base):.0f} us = {_cpu_per_msg(base) / _cpu_per_msg(ours):.2f}x")
    one, two = results.get("core-w1"), results.get("core-2x-w1")
    if one and two:
        print(f"two bridges in a queue group: {two['rate']:,.0f} msgs/s = {two['rate'] / one['rate']:.2f}x one bridge")
    for name, r in results.items():
        if name.startswith("js-"):
            print(f"{name}: {r['rate']:,.0f} msgs/s, peak RSS {r['rss'] / 2**20:.0f} MB with {r['waiting']:,} messages "
                  "waiting (target < 300 MB at 1M)")


def report_rounds(by_round: dict[str, list[dict]], workers: list[int]) -> None:
    """Each round's bridge against that round's ceiling, naive pipeline and baseline: the
    paired ratios (the best-of figures above pair rounds that ran minutes apart)."""
    raws, naives = by_round.get("raw", []), by_round.get("naive", [])
    for w in workers:
        for kind in ("burst-core", "core"):
            ours, base = by_round.get(f"{kind}-w{w}", []), by_round.get(f"base-{kind}-w{w}", [])
            for i, r in enumerate(ours):
                parts = [(f"{kind}-w{w} round {i + 1}: {r['rate']:,.0f} msgs/s, {_cpu_per_msg(r):.1f} us/msg,"
                         f" dropped {r.get('dropped', 0):,.0f}")]
                if i < len(raws):
                    parts.append(f"{r['rate'] / raws[i]['rate']:.3f} of raw ({raws[i]['rate']:,.0f})")
                    if kind == "burst-core" and "e2e" in r:
                        parts.append(f"end to end {r['e2e']:,.0f} msgs/s = {r['e2e'] / raws[i]['e2e']:.3f} of raw's "
                                     f"({raws[i]['e2e']:,.0f})" + (f", {r['e2e'] / naives[i]['e2e']:.2f}x naive's "
                                     f"({naives[i]['e2e']:,.0f})" if i < len(naives) else ""))
                        if "window_bound" in r:  # a bridge of no CPU, waiting `link.wait`
                            parts.append(f"the link window's bound {r['window_bound']:,.0f} msgs/s = "
                                         f"{r['window_bound'] / raws[i]['e2e']:.3f} of raw's")
                if i < len(naives):
                    parts.append(f"{r['rate'] / naives[i]['rate']:.2f}x naive ({naives[i]['rate']:,.0f})")
                if i < len(base):
                    b = base[i]
                    parts.append(f"baseline {b['rate']:,.0f} msgs/s, {_cpu_per_msg(b):.1f} us/msg")
                    if i < len(raws):
                        parts.append(f"baseline {b['rate'] / raws[i]['rate']:.3f} of raw"
                                     + (f", end to end {b['e2e']:,.0f}" if kind == "burst-core" and "e2e" in b else ""))
                    parts.append(f"ours/baseline {r['rate'] / b['rate']:.2f}x rate, "
                                 f"{_cpu_per_msg(b) / _cpu_per_msg(r):.2f}x CPU per message")
                print("; ".join(parts))


def report_cpu(by_round: dict[str, list[dict]], results: dict[str, dict], workers: list[int]) -> None:
    """Issue 48's figure: each consumer's CPU per message in the burst (its CPU seconds from
    just before the burst to its last span, or the bare subscriber's to its last message,
    over the messages), paired within each round, then the medians and the spread over the
    rounds; the sustained rate (`--find-sustained`) beside it."""
    from statistics import median

    raws, naives = by_round.get("raw", []), by_round.get("naive", [])
    for w in workers:
        ours, base = by_round.get(f"burst-core-w{w}", []), by_round.get(f"base-burst-core-w{w}", [])
        if not ours:
            continue
        print(f"\n== CPU per trace message, burst, core/w{w} (us; bare/x: the bare subscriber's over x's, "
              "higher is better; naive/x: how many times less than the naive pipeline) ==")
        print(f"{'round':>5}{'bare':>8}{'naive':>8}{'ours':>8}{'base':>8}{'bare/ours':>10}{'naive/ours':>11}"
              f"{'bare/base':>10}{'naive/base':>11}{'base/ours':>10}{'whole':>7}{'RSS ours':>9}{'base':>6}")
        rows: list[dict[str, float]] = []
        nan = float("nan")
        for i, r in enumerate(ours):
            row = {"bare": raws[i]["us_per_msg"] if i < len(raws) else nan,
                   "naive": naives[i]["us_per_msg"] if i < len(naives) else nan,
                   "ours": r["us_per_msg"], "base": base[i]["us_per_msg"] if i < len(base) else nan,
                   "rss": r["rss"] / 2**20, "base_rss": base[i]["rss"] / 2**20 if i < len(base) else nan}
            row |= {"bare/ours": row["bare"] / row["ours"], "naive/ours": row["naive"] / row["ours"],
                    "bare/base": row["bare"] / row["base"], "naive/base": row["naive"] / row["base"],
                    "base/ours": row["base"] / row["ours"]}
            whole = r["whole"] and (i >= len(base) or base[i]["whole"])
            rows.append(row)
            print(f"{i + 1:>5}{row['bare']:>8.1f}{row['naive']:>8.1f}{row['ours']:>8.1f}{row['base']:>8.1f}"
                  f"{row['bare/ours']:>10.3f}{row['naive/ours']:>10.2f}x{row['bare/base']:>10.3f}"
                  f"{row['naive/base']:>10.2f}x{row['base/ours']:>9.2f}x{whole!s:>7}{row['rss']:>9.0f}"
                  f"{row['base_rss']:>6.0f}")

        def spread(key: str, rows: list[dict[str, float]] = rows) -> str:
            values = [row[key] for row in rows if row[key] == row[key]]
            if not values:
                return "-"
            return f"{median(values):.3g} ({min(values):.3g}-{max(values):.3g})"

        print(f"medians over {len(rows)} rounds (min-max): " + "; ".join(
            f"{key} {spread(key)}" for key in ("bare", "naive", "ours", "base", "bare/ours", "naive/ours",
                                               "bare/base", "naive/base", "base/ours", "rss", "base_rss")))
        sustained = results.get(f"sustained-w{w}")
        if sustained:
            print(f"sustained (--find-sustained): {sustained['offered']:,.0f} msgs/s kept up with, "
                  f"{sustained['us_per_msg']:.1f} us/msg")


def report_exchange(exchange: dict[str, list[dict[str, dict]]]) -> None:
    """Per stage: each variant's median over the rounds, and its ratio to x-one within each
    round (median of the rounds' ratios); then the exchange's extra CPU and the three bridges."""
    from statistics import median

    def med(values: list[float]) -> float:
        values = [v for v in values if v == v]
        return median(values) if values else float("nan")

    for stage, rounds in exchange.items():
        print(f"\n== link-evidence exchange, {stage} ({len(rounds)} rounds, alternated; medians, ratios "
              "within a round) ==")
        print(f"{'variant':<9}{'bridges':>8}{'offered':>9}{'msgs/s':>9}{'vs one':>8}{'us/msg':>8}{'vs one':>8}"
              f"{'server':>8}{'dropped':>9}{'missing':>9}{'linked':>8}{'ev MiB':>8}{'B/report':>9}{'ev fail':>8}"
              f"{'ev late':>8}")
        names = list(rounds[0])
        for v in sorted(names, key=list(EXCHANGE_VARIANTS).index):
            rs = [r[v] for r in rounds if v in r]
            ones = [r.get("x-one") for r in rounds if v in r]
            rate_ratio = med([x["rate"] / o["rate"] for x, o in zip(rs, ones, strict=True) if o and o["rate"]])
            cpu_ratio = med([x["us_per_msg"] / o["us_per_msg"] for x, o in zip(rs, ones, strict=True) if o])
            ev_bytes = sum(x["evidence_bytes"] for x in rs)
            # Bytes per report published: every message taken in (not dropped) gives one report.
            per_report = ev_bytes / max(sum(x["received"] - x["dropped"] for x in rs), 1) if ev_bytes else 0
            fails = sum(v2 for x in rs for k, v2 in x["evidence"].items() if k not in ("published", "received"))
            # Downstream reports whose upstream egress was found (all rounds).
            linked = sum(x["links"]["matched"] for x in rs) / max(sum(sum(x["links"].values()) for x in rs), 1)
            print(f"{v:<9}{rs[0]['bridges']:>8}{med([x['offered'] for x in rs]):>9,.0f}"
                  f"{med([x['rate'] for x in rs]):>9,.0f}{rate_ratio:>7.2f}x{med([x['us_per_msg'] for x in rs]):>8.1f}"
                  f"{cpu_ratio:>7.2f}x{med([x['server_us_per_msg'] for x in rs]):>8.1f}"
                  f"{sum(x['dropped'] for x in rs):>9,.0f}{sum(x['missing_spans'] for x in rs):>9,}{linked:>8.1%}"
                  f"{ev_bytes / len(rs) / 2**20:>8.1f}{per_report:>9.0f}{fails:>8,.0f}"
                  f"{sum(x['evidence_late'] for x in rs):>8,.0f}")
        on_off = [(r["x-q-on"]["us_per_msg"], r["x-q-off"]["us_per_msg"]) for r in rounds
                  if "x-q-on" in r and "x-q-off" in r]
        if on_off:
            extra = [a - b for a, b in on_off]
            print(f"exchange's extra CPU per message (x-q-on - x-q-off): {med(extra):+.1f} us median "
                  f"({', '.join(f'{e:+.1f}' for e in extra)} per round) = {med([a / b for a, b in on_off]):.2f}x")
        trio = [(r["x-3-on"], r["x-one"]) for r in rounds if "x-3-on" in r and "x-one" in r]
        if trio:
            print("three bridges (exchange on) vs one: msgs/s " + ", ".join(
                f"{t['rate']:,.0f} vs {o['rate']:,.0f} = {t['rate'] / o['rate']:.2f}x" for t, o in trio)
                + "; dropped " + ", ".join(f"{t['dropped']:,.0f} vs {o['dropped']:,.0f}" for t, o in trio)
                + "; spans missing " + ", ".join(f"{t['missing_spans']:,} vs {o['missing_spans']:,}" for t, o in trio)
                + "; split " + ", ".join(str([int(x) for x in t["split"]]) for t, _ in trio)
                + "; linked " + ", ".join(f"{t['links']['matched'] / max(sum(t['links'].values()), 1):.1%}"
                                          for t, _ in trio))


def _cpu_per_msg(r: dict) -> float:
    """Bridge CPU microseconds per trace message carried (CPU seconds / messages arrived as spans)."""
    if "us_per_msg" in r:
        return r["us_per_msg"]
    return r["cpu"] / r["rate"] * 1e6 if r.get("rate") else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a ~1 minute run (smaller pool, shorter phases)")
    parser.add_argument("--messages", type=int, help="pool size: trace messages per burst (default 200k, quick 30k)")
    parser.add_argument("--burst", type=int, default=0,
                        help="messages in the raw and bridge bursts (default: the whole pool); a pool larger "
                             "than the burst keeps the paced phases' trace ids fresh (the pool cycles after it)")
    parser.add_argument("--paced-rate", type=float, default=0,
                        help="the paced core phases' rate in msgs/s (default 1.3x the round's better burst: an "
                             "overload, drops counted); a rate the bridge holds gives the sustained rate with "
                             "nothing lost")
    parser.add_argument("--find-sustained", type=float, default=0, metavar="RATE",
                        help="step the offered pace up from RATE msgs/s (by --sustained-step) until one bridge "
                             "(the first --workers) no longer keeps up: the sustained rate, nothing lost")
    parser.add_argument("--sustained-step", type=float, default=4000, help="msgs/s added per step (default 4000)")
    parser.add_argument("--burst-only", action="store_true",
                        help="core phases: only the burst (issue 48's CPU per message), no paced run after it")
    parser.add_argument("--naive-messages", type=int, help="burst for the naive pipeline (default 60k, quick 8k)")
    parser.add_argument("--workers", type=int, action="append",
                        help="bridge --workers values (repeatable; default 1 and 2)")
    parser.add_argument("--latency-seconds", type=float,
                        help="duration of the half-rate latency phase (default 30, quick 6)")
    parser.add_argument("--rate", type=float, help="latency phase rate (default: half the best measured core rate)")
    parser.add_argument("--js-messages", type=int,
                        help="messages waiting in the stream (default 1M, quick 30k; 0 skips)")
    parser.add_argument("--js-workers", type=int, action="append",
                        help="bridge --workers values for the JetStream phase (repeatable; default 2)")
    parser.add_argument("--sustain-seconds", type=float, help="paced core phases: seconds (default 20, quick 4)")
    parser.add_argument("--rounds", type=int, help="rounds of the core phases, best counts (default 2, quick 1)")
    parser.add_argument("--baseline", type=Path,
                        help="a checkout of another version (e.g. a git worktree): its bridge runs the core "
                             "phases too, alternated with ours, and the summary gives ours/baseline")
    parser.add_argument("--exchange-rate", type=float,
                        help="exchange phase, fixed stage: msgs/s offered (default 0.7x x-one's sustained rate in "
                             "the first paced stage, or 0.6x its first burst)")
    parser.add_argument("--exchange-stages", action="append", choices=["burst", "paced", "fixed"],
                        help="exchange phase stages (repeatable; default all three)")
    phases = ["raw", "naive", "naive-defaults", "core", "forward", "pair", "exchange", "latency", "js"]
    parser.add_argument("--encoding", choices=["gzip", "snappy"],
                        help="every trace message of the pool compressed so, as a trace that asks for it "
                             "(Accept-Encoding) gets them (default: as in the corpus, a few compressed)")
    parser.add_argument("--variant", choices=["header"],
                        help="header: every trace message's traced message carries a header of its "
                             "application's own (Nats-Msg-Id), as many applications send (corpus_replay)")
    parser.add_argument("--ours-flag", action="append", metavar="FLAG",
                        help="a `nats-otel bridge` flag for our bridge only (repeatable; e.g. "
                             "--ours-flag=--cpu-affinity --ours-flag=auto): the same code with and without it "
                             "when --baseline is this checkout")
    parser.add_argument("--skip", action="append", default=[], choices=phases)
    parser.add_argument("--only", action="append", choices=phases, help="run only these phases (repeatable)")
    args = parser.parse_args()
    if args.only:
        args.skip = [p for p in phases if p not in args.only]
    stages = args.exchange_stages or ["burst", "paced", "fixed"]
    if "burst" not in stages and ("paced" in stages or not args.exchange_rate):
        parser.error("the exchange's paced stage needs its burst stage, the fixed one a burst or --exchange-rate")
    q = args.quick
    args.messages = args.messages or (30_000 if q else 200_000)
    args.naive_messages = args.naive_messages or (8_000 if q else 60_000)
    args.workers = args.workers or [1, 2]
    args.latency_seconds = args.latency_seconds or (6.0 if q else 30.0)
    args.rounds = args.rounds or (1 if q else 2)
    args.sustain_seconds = args.sustain_seconds or (4.0 if q else 20.0)
    args.js_workers = args.js_workers or [2]
    if args.js_messages is None:
        args.js_messages = 30_000 if q else 1_000_000
    print(f"machine: {os.cpu_count()} cores, {_cpu_model()}; load average {os.getloadavg()[0]:.2f}", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-bridge-") as tmp:
        bench = Bench(args, Path(tmp))
        try:
            if "naive-defaults" not in args.skip:
                bench.phase_naive(sdk_defaults=True)
            for round_number in range(args.rounds):
                # The ceiling and the naive pipeline in every round too: the ratios are paired
                # within a round (issue 39), not best against best.
                if "raw" not in args.skip:
                    bench.phase_raw(round_number)
                if "naive" not in args.skip:
                    bench.phase_naive(round_number=round_number)
                # Rounds alternate the variants so machine noise hits all; the best round counts.
                # A burst (the whole pool at once) estimates the capacity E; then the pool is
                # offered paced at 1.3 E: the sustained rate under moderate overload, without
                # the cost of reading and dropping a 20x overload dominating the result.
                if "core" not in args.skip:
                    for w in args.workers:
                        # Ours and the baseline alternate which goes first (odd rounds: the
                        # baseline), and both are paced at one rate: 1.3x the better burst of
                        # the round, so the pair is offered the same load.
                        sources = [None, args.baseline] if args.baseline else [None]
                        if round_number % 2:
                            sources.reverse()
                        for src in sources:
                            bench.phase_core(w, round_number, src=src)
                        if args.burst_only:
                            continue
                        burst = max(bench.by_round[("base-" if src else "") + f"burst-core-w{w}"][-1]["rate"]
                                    for src in sources)
                        for src in sources:
                            bench.phase_core(w, round_number, rate=args.paced_rate or 1.3 * burst, src=src)
                if "forward" not in args.skip:  # after the round's core-w1: the pair's CPU beyond it
                    for src in ([None, args.baseline] if args.baseline else [None]):
                        phase_forward(bench, round_number, src=src)
                if "pair" not in args.skip:
                    bench.phase_pair(1, round_number)
                    bench.phase_pair(1, round_number, rate=1.3 * bench.results["burst-core-2x-w1"]["rate"])
                if "exchange" not in args.skip:
                    # The burst gives one bridge's capacity; paced at 1.3x it: the sustained rate;
                    # at a fixed rate below it: nothing may be lost, the CPU per message at equal work.
                    if "burst" in stages:
                        bench.phase_exchange("burst", round_number)
                        one = bench.exchange["burst"][round_number]["x-one"]["rate"]
                        if "paced" in stages:
                            bench.phase_exchange("paced", round_number, rate=1.3 * one)
                            # A burst's rate is well above what one bridge sustains: size the
                            # fixed rate by the paced one.
                            one = bench.exchange["paced"][round_number]["x-one"]["rate"] / 0.6 * 0.7
                        args.exchange_rate = args.exchange_rate or round(0.6 * one, -2)
                    if "fixed" in stages:
                        bench.phase_exchange("fixed", round_number, rate=args.exchange_rate)
            if args.find_sustained:
                bench.phase_sustained(args.workers[0], args.find_sustained, args.sustained_step)
            if "latency" not in args.skip:
                rates = {w: bench.results.get(f"core-w{w}", {}).get("rate", 0) for w in args.workers}
                w = max(rates, key=lambda k: rates[k])
                rate = args.rate or max(1000.0, rates[w] / 2)
                bench.phase_latency(w, rate)
            if args.js_messages and "js" not in args.skip:
                for w in args.js_workers:
                    bench.phase_jetstream(w, args.js_messages)
        finally:
            bench.close()
        report(bench.results, args.workers)
        report_rounds(bench.by_round, args.workers)
        report_cpu(bench.by_round, bench.results, args.workers)
        report_forward(bench.by_round)
        if bench.exchange:
            report_exchange(bench.exchange)
        print("\n" + json.dumps({**bench.results, "exchange": bench.exchange}, default=str))


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


if __name__ == "__main__":
    main()
