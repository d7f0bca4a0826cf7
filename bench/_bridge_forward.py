"""bench/bridge_throughput.py, the forwarding phase (issue 48, item 3): what trace ownership's
forwarding path (bridge/routing.py) costs per trace message forwarded, beside the bare
subscriber's CPU per message in the same round.

Two bridges in one queue group (trace ownership on, the default with the exchange): each
receives about half of the burst and forwards the reports of the traces the other owns,
about half of its half, to it. Both bridges' CPU seconds (from just before the burst to the
last span), summed, minus one bridge's for the same burst in the same round
(`burst-core-w1`), over the reports forwarded: the CPU per forwarded report. It charges the
forwarding everything the pair spends beyond one bridge (the forward's publish, its receipt
at the owner, the second process's receive path and heartbeats, the smaller batches of
each): an upper bound of the forward itself, the cost of scaling out to two.
"""

from __future__ import annotations

import time
from typing import Any

from _bridge_meters import Sampler, scrape, total

__all__ = ["phase_forward", "report_forward"]


def phase_forward(bench: Any, round_number: int, settle_s: float = 3.0, src: Any = None) -> dict:
    """The burst to two bridges in one queue group; returns the pair's CPU, the reports
    forwarded and received as forwards, whether every span arrived, and the CPU per
    forwarded report against this round's single bridge (`burst-core-w1`), when it ran.
    `src`: the bridges of another checkout (the baseline: `base-forward-2`, against its
    own single bridge, `base-burst-core-w1`)."""
    prefix = "base-" if src else ""
    name = prefix + "forward-2"
    bench.rx.reset(track=False)
    subject = f"bench.{name}.{round_number}"
    bridges = [bench.start_bridge(f"{name}-{i}-{round_number}", 1, subject=subject, extra=["--queue", "fwd"],
                                  src=src) for i in (1, 2)]
    # Each bridge waits to hear the other before it routes (routing.SETTLE_S); heartbeats
    # come every second: give both time to agree on the ring before the burst.
    time.sleep(settle_s)
    samplers = [Sampler(proc.pid) for proc, _ in bridges]
    cpu0 = sum(s.cpu() for s in samplers)
    pub = bench.publish(subject, limit=bench.args.burst or 0)
    expected = bench.expected_spans(pub["sent"])
    bench.rx.wait_quiet(expected, quiet=2.5, timeout=300)
    cpu_s = sum(s.cpu() for s in samplers) - cpu0
    metrics = [scrape(port) for _, port in bridges]
    for s in samplers:
        s.stop()
    for proc, _ in bridges:
        bench.stop(proc)

    def routed(result: str) -> float:
        return sum(total(m, f'nats_otel_routed_total{{result="{result}"}}') for m in metrics)

    arrived = bench.rx.spans / bench.spans_per_msg
    r = {"sent": pub["sent"], "spans": bench.rx.spans, "whole": bench.rx.spans >= expected,
         "cpu_s": cpu_s, "us_per_msg": cpu_s / max(arrived, 1) * 1e6,
         "forwarded": routed("forwarded"), "received_forwards": routed("received"),
         "unforwarded": routed("unforwarded"), "rerouted": routed("rerouted"),
         "dropped": sum(total(m, "nats_otel_messages_dropped") for m in metrics),
         "split": [total(m, "nats_otel_messages_received") for m in metrics],
         "rss": sum(s.peak_rss for s in samplers)}
    one = bench.by_round.get(prefix + "burst-core-w1", [])
    if len(one) > round_number and r["forwarded"]:
        single = one[round_number]
        single_cpu_s = single["us_per_msg"] * single["spans"] / bench.spans_per_msg / 1e6
        r["us_per_forward"] = (cpu_s - single_cpu_s) / r["forwarded"] * 1e6
        r["pair_over_single"] = r["us_per_msg"] / single["us_per_msg"]
    raws = bench.by_round.get("raw", [])
    if len(raws) > round_number and "us_per_forward" in r:
        r["bare_over_forward"] = raws[round_number]["us_per_msg"] / r["us_per_forward"]
    bench.by_round.setdefault(name, []).append(r)
    print(f"bridge {name}: {r['us_per_msg']:.1f} us/msg summed over both, forwarded {r['forwarded']:,.0f} "
          f"(received as forwards {r['received_forwards']:,.0f}, unforwarded {r['unforwarded']:,.0f}), "
          f"split {[int(x) for x in r['split']]}, dropped {r['dropped']:,.0f}, every span: {r['whole']}"
          + (f"; {r['us_per_forward']:.1f} us per forwarded report beyond one bridge"
             if "us_per_forward" in r else ""), flush=True)
    return r


def report_forward(by_round: dict[str, list[dict]], prefix: str = "") -> None:
    """Per round, the forwarding path's CPU per forwarded report against the bare
    subscriber's per message; then the medians (`prefix` "base-": the baseline's)."""
    from statistics import median

    rounds = by_round.get(prefix + "forward-2", [])
    if not rounds:
        return
    raws = by_round.get("raw", [])
    print(f"\n== the forwarding path{' of the baseline' if prefix else ''}: two bridges, one queue group (trace "
          "ownership), the burst; CPU beyond one bridge per forwarded report ==")
    singles = by_round.get(prefix + "burst-core-w1", [])
    print(f"{'round':>5}{'bare':>8}{'single':>8}{'pair':>8}{'pair/single':>12}{'forwarded':>11}{'us/fwd':>8}"
          f"{'bare/fwd':>10}{'whole':>7}")
    nan = float("nan")
    for i, r in enumerate(rounds):
        bare = raws[i]["us_per_msg"] if i < len(raws) else nan
        single = singles[i]["us_per_msg"] if i < len(singles) else nan
        print(f"{i + 1:>5}{bare:>8.1f}{single:>8.1f}{r['us_per_msg']:>8.1f}{r.get('pair_over_single', nan):>11.2f}x"
              f"{r['forwarded']:>11,.0f}{r.get('us_per_forward', nan):>8.1f}{r.get('bare_over_forward', nan):>10.3f}"
              f"{r['whole']!s:>7}")

    def spread(values: list[float], digits: int) -> str:
        return f"{median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})" if values else "-"

    per = [r["us_per_forward"] for r in rounds if "us_per_forward" in r]
    ratio = [r["bare_over_forward"] for r in rounds if "bare_over_forward" in r]
    pair = [r["pair_over_single"] for r in rounds if "pair_over_single" in r]
    print(f"medians over {len(rounds)} rounds (min-max): us per forwarded report {spread(per, 1)}; bare/forward "
          f"{spread(ratio, 3)}; the pair's CPU per message over one bridge's {spread(pair, 2)}")
    if per and len(singles) >= len(rounds):
        # The difference of two noisy figures is noisier than either: from the medians too.
        forwarded = median(r["forwarded"] for r in rounds)
        sent = median(r["sent"] for r in rounds)
        from_medians = ((median(r["us_per_msg"] for r in rounds) - median(s["us_per_msg"] for s in singles))
                        * sent / forwarded)
        print(f"from the medians (pair - single, per forwarded report): {from_medians:.1f} us")
    base = by_round.get("base-forward-2", [])
    if not prefix and base and len(base) == len(rounds):
        report_forward(by_round, "base-")
        pairs = [b["us_per_msg"] / r["us_per_msg"] for r, b in zip(rounds, base, strict=True)]
        print(f"the pair's CPU per message, base / ours, round by round: {spread(pairs, 3)}")
