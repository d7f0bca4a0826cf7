"""Benchmark: the report ledger (core/report_ledger.py) under live-like report numbers: 8
servers, a gap after every GAP reports of each (a server's statsz and advisories, or the
reports of accounts this bridge does not receive), 48k reports/s in batches of 512, the
default retention (30 s); CPU per report of `observe` and of the batch's `expire`, once
the retention is full.

    python bench/ledger_expiry.py 100 10     # a gap every 100 reports, then every 10

Each GAP runs in a fresh process (`--one`), so that one's memory does not weigh on the next.
"""

from __future__ import annotations

import subprocess
import sys
import time

RATE, BATCH, RETENTION_S, SERVERS = 48_000, 512, 30.0, 8


def one(gap_every: int) -> str:
    from nats_otel.core.report_ledger import ReportLedger

    ledger = ReportLedger(capacity=200_000, retention_s=RETENTION_S)
    servers = [f"S{i}" for i in range(SERVERS)]
    seqs = dict.fromkeys(servers, 0)
    now, n, observing, expiring, measured = 0.0, 0, 0.0, 0.0, 0
    full_after = int(RATE * (RETENTION_S + 5) / BATCH)
    for batch in range(full_after + int(RATE * 5 / BATCH)):
        started = time.process_time()
        for _ in range(BATCH):
            server = servers[n % SERVERS]
            seqs[server] += 2 if seqs[server] % gap_every == 0 else 1
            ledger.observe(n.to_bytes(8, "little"), server, seqs[server], int(now * 1e9), now, "A")
            n += 1
        observed = time.process_time()
        ledger.expire(now)
        expired = time.process_time()
        now += BATCH / RATE
        if batch >= full_after:
            observing += observed - started
            expiring += expired - observed
            measured += BATCH
    runs = sum(len(r.firsts) for r in ledger._servers.values())
    return (f"gap every {gap_every:>7,} reports: observe {observing / measured * 1e9:6.0f} ns, expire "
            f"{expiring / measured * 1e9:8.0f} ns per report; {runs:,} runs held")


def main() -> None:
    if sys.argv[1:2] == ["--one"]:
        print(one(int(sys.argv[2])), flush=True)
        return
    for gap in sys.argv[1:] or ["1000000", "100", "10"]:
        subprocess.run([sys.executable, __file__, "--one", gap], check=True)


if __name__ == "__main__":
    main()
