"""Where a live bridge's CPU goes during one burst: `perf record` on the bridge process (every
thread) from just before a burst to its last span, then perf's tables by thread, by shared
object and by function.

    python bench/bridge_profile.py                         # 60k trace messages, the corpus mix
    python bench/bridge_profile.py --encoding snappy       # every message compressed so
    python bench/bridge_profile.py --baseline /tmp/base    # that checkout's bridge instead
    python bench/bridge_profile.py --call-graph            # with call chains (perf report -g caller)

One nats-server, one bridge (core mode, one worker, OTLP/gRPC to the bench's receiver), the
burst published as fast as one client can (issue 48's scenario). perf samples the CPU clock
(a VM has no hardware counters), so the shares are of the bridge's own CPU time, sampled;
compare shares within one profile, and builds by profiles taken one after the other. Needs
`perf` (`apt-get install linux-perf`) and a `perf_event_paranoid` that lets it attach.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _bridge_meters import Sampler
from _bridge_runs import Bench


def report(data: Path, sort: str, limit: int) -> None:
    out = subprocess.run(["perf", "report", "-i", str(data), "--stdio", "--sort", sort, "-g", "none"],
                         capture_output=True, text=True, check=True).stdout
    rows = [line for line in out.splitlines() if line.strip() and not line.startswith("#")]
    print(f"\n== by {sort} ==")
    print("\n".join(rows[:limit]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=60_000, help="the burst (default 60k)")
    parser.add_argument("--encoding", choices=["gzip", "snappy"], help="every message compressed so")
    parser.add_argument("--baseline", type=Path, help="profile this checkout's bridge instead of ours")
    parser.add_argument("--frequency", type=int, default=2999, help="samples per second (default 2999)")
    parser.add_argument("--out", type=Path, default=Path("bridge-profile.perf.data"), help="perf's data file")
    parser.add_argument("--top", type=int, default=40, help="functions listed (default 40)")
    parser.add_argument("--call-graph", action="store_true",
                        help="record call chains (DWARF unwinding: larger data; perf report -g caller)")
    args = parser.parse_args()
    if shutil.which("perf") is None:
        raise SystemExit("needs perf: apt-get install linux-perf")
    bench_args = argparse.Namespace(messages=args.messages, burst=args.messages, sustain_seconds=0,
                                    encoding=args.encoding)
    with tempfile.TemporaryDirectory(prefix="bench-profile-") as tmp:
        bench = Bench(bench_args, Path(tmp))
        try:
            bridge, _ = bench.start_bridge("profile", 1, subject="bench.profile", src=args.baseline)
            time.sleep(2.0)  # its start-up done: the profile is the burst's
            sampler = Sampler(bridge.pid)
            cpu0 = sampler.cpu()
            chains = ["--call-graph", "dwarf,16384"] if args.call_graph else []
            perf = subprocess.Popen(["perf", "record", "-F", str(args.frequency), *chains, "-o", str(args.out),
                                     "-p", str(bridge.pid)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            time.sleep(0.5)
            published = bench.publish("bench.profile", limit=args.messages)
            expected = bench.expected_spans(published["sent"])
            bench.rx.wait_quiet(expected, quiet=2.5, timeout=300)
            cpu = sampler.cpu() - cpu0
            perf.send_signal(signal.SIGINT)
            _, errors = perf.communicate(timeout=60)
            sampler.stop()
            if perf.returncode not in (0, -signal.SIGINT):
                raise SystemExit(f"perf record failed: {errors.decode()[-2000:]}")
            print(f"{published['sent']:,} trace messages, {bench.rx.spans:,} of {expected:,} spans arrived; "
                  f"the bridge's CPU {cpu / max(published['sent'], 1) * 1e6:.1f} µs per message")
        finally:
            for proc in bench.procs:
                bench.stop(proc)
            bench.rx.stop()
            bench.topo.stop()
    report(args.out, "pid", 12)  # perf's "pid" column is the thread's id: one row per thread
    report(args.out, "dso", 15)
    report(args.out, "dso,sym", args.top)


if __name__ == "__main__":
    main()
