"""Reused vs distinct trace contexts: what they cost the live bridge's converter and `convert`.

Traffic: N traced messages, each reported by the server it was published to (one route
egress) and by the server it was forwarded to, at a steady `--rate` (simulated time).
Three kinds, the same size: every message its own traceparent (`distinct`), all under one
traceparent (`reused`), all to one ad-hoc destination (`adhoc`). Sizes either vary per
message or are all equal (`--same-size`: the worst case for linking).

* live: the bridge's `Converter` (observe on arrival, convert `link.wait` later, the clock
  advancing with the traffic), in this process; CPU µs per message by tenth of the run
  (flat = O(1) per message whatever the reuse) and the link window's size at the end;
* convert: `nats-otel convert` on the same archive in a child process; wall time and peak
  RSS (VmHWM of the child).

    python bench/reuse_cost.py --messages 100000 --rate 2000
"""

from __future__ import annotations

import argparse
import base64
import collections
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

from nats_otel.core.decode import RawTraceMessage
from nats_otel.core.engine import Converter
from nats_otel.core.pipeline import Converted

BASE_NS = 1_795_313_790_000_000_000


def _ts(ns: int) -> str:
    seconds, nanos = divmod(ns, 1_000_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{nanos:09d}Z"


def traffic(kind: str, count: int, rate: float, same_size: bool) -> list[RawTraceMessage]:
    """Trace messages in arrival order (downstream report first, as often seen)."""
    out = []
    step = int(1e9 / rate)
    for i in range(count):
        t = BASE_NS + i * step
        if kind == "distinct":
            headers: dict = {"traceparent": [f"00-{i + 1:032x}-{i + 1:016x}-01"]}
        elif kind == "reused":
            headers = {"traceparent": ["00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"]}
        else:
            headers = {"Nats-Trace-Dest": ["trace.debug"]}
        size = 300 if same_size else 300 + i % 5000
        origin = {"server": {"name": "east-1", "id": "NEAST1"}, "request": {"header": headers, "msgsize": size},
                  "hops": 1, "events": [
                      {"type": "in", "ts": _ts(t), "kind": 0, "cid": 7, "name": "pub", "acc": "A", "subj": "work"},
                      {"type": "eg", "ts": _ts(t + 30_000), "kind": 1, "cid": 3, "name": "east-2", "hop": "1"}]}
        down = {"server": {"name": "east-2", "id": "NEAST2"},
                "request": {"header": {**headers, "Nats-Trace-Hop": ["1"]}, "msgsize": size + 19}, "events": [
                    {"type": "in", "ts": _ts(t + 250_000), "kind": 1, "cid": 4, "name": "east-1", "acc": "A",
                     "subj": "work"},
                    {"type": "eg", "ts": _ts(t + 260_000), "kind": 0, "cid": 9, "name": "sub", "sub": "work"}]}
        subject = "trace.debug" if kind == "adhoc" else "trace.a"
        out.append(RawTraceMessage(subject, {}, orjson.dumps(down)))
        out.append(RawTraceMessage(subject, {}, orjson.dumps(origin)))
    return out


def live(raws: list[RawTraceMessage], rate: float, wait: float) -> dict:
    """The bridge's converter: observe each message at its arrival, convert it `wait` later."""
    converter = Converter()
    per_message = 1 / (2 * rate)
    tenths, links = [], collections.Counter()
    chunk = max(1, len(raws) // 10)
    lag = int(wait / per_message)
    started = time.process_time()
    for i, raw in enumerate(raws):
        converter.observe(raw, i * per_message)
        if i >= lag:
            result = converter.convert(raws[i - lag], i * per_message)
            if isinstance(result, Converted) and result.link:
                links[result.link] += 1
        if (i + 1) % chunk == 0:
            now = time.process_time()
            tenths.append(round((now - started) / chunk * 1e6, 1))
            started = now
    for j in range(max(0, len(raws) - lag), len(raws)):
        result = converter.convert(raws[j], (len(raws) + lag) * per_message)
        if isinstance(result, Converted) and result.link:
            links[result.link] += 1
    return {"us_per_msg_by_tenth": tenths, "links": dict(links), "window_entries": len(converter.linker.index),
            "evicted": converter.linker.index.evicted}


def convert(raws: list[RawTraceMessage], workdir: Path) -> dict:
    archive = workdir / "archive.jsonl"
    with archive.open("wb") as out:
        for raw in raws:
            out.write(orjson.dumps({"subject": raw.subject, "headers": {},
                                    "payload_b64": base64.b64encode(raw.payload).decode()}) + b"\n")
    started = time.monotonic()
    code = (f"import sys; from nats_otel.cli import main; rc = main(['convert', {str(archive)!r}, "
            f"'-o', {str(workdir / 'out.jsonl')!r}, '--quiet']); "
            # VmHWM, not ru_maxrss: Linux carries ru_maxrss over exec from the parent (this script).
            "print([l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM')][0], file=sys.stderr); "
            "sys.exit(rc)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    elapsed = time.monotonic() - started
    rss_kb = int(done.stderr.strip().splitlines()[-1])
    return {"seconds": round(elapsed, 2), "peak_rss_mb": round(rss_kb / 1024, 1),
            "kb_per_trace_message": round(rss_kb / len(raws), 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=50_000, help="traced messages (2 trace messages each)")
    parser.add_argument("--rate", type=float, default=2000.0, help="traced messages per second (simulated)")
    parser.add_argument("--wait", type=float, default=1.0, help="link.wait of the live converter")
    parser.add_argument("--same-size", action="store_true", help="every message the same size")
    parser.add_argument("--no-convert", action="store_true", help="skip the convert runs")
    args = parser.parse_args()
    print(f"# {args.messages} traced messages at {args.rate:.0f}/s, same size: {args.same_size}; "
          f"python {sys.version.split()[0]}, pid {os.getpid()}")
    results = {}
    for kind in ("distinct", "reused", "adhoc"):
        raws = traffic(kind, args.messages, args.rate, args.same_size)
        row = {"live": live(raws, args.rate, args.wait)}
        if not args.no_convert:
            with tempfile.TemporaryDirectory() as tmp:
                row["convert"] = convert(raws, Path(tmp))
        results[kind] = row
        print(kind, orjson.dumps(row).decode(), flush=True)
    base = results["distinct"]
    for kind in ("reused", "adhoc"):
        ratio = sum(results[kind]["live"]["us_per_msg_by_tenth"]) / sum(base["live"]["us_per_msg_by_tenth"])
        line = f"{kind}/distinct: live CPU per message {ratio:.2f}x"
        if "convert" in base:
            ours, theirs = results[kind]["convert"], base["convert"]
            line += (f", convert time {ours['seconds'] / theirs['seconds']:.2f}x, "
                     f"convert peak RSS {ours['peak_rss_mb'] / theirs['peak_rss_mb']:.2f}x")
        print(line)
    print("ru_maxrss of this process (MB):", round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1))


if __name__ == "__main__":
    main()
