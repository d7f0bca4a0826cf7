"""Benchmark: CPU per trace message of the pure core (decode -> map -> encode), this checkout
against another one (a baseline), in alternating fresh processes.

    git worktree add /tmp/base <commit>
    python bench/core_ab.py /tmp/base [--messages 20000] [--rounds 5] [--path convert|bridge|view]

Each round runs both checkouts once, each in a new process that imports only its own
`nats_otel` and times one path over the same replicated corpus, GC off, best of 3 passes:
`convert` (the default), `convert_throughput.ours` (`Converter.convert` one message at a
time, then one request per 512 spans); `bridge`, the bridge's calls (`observe_many`, the
ledger's vouching of one bridge without peers where the checkout has it, then `convert_many`
encoded, per batch of 512; no request); `view`, the same and the batch's
network samples counted into the live network view (`NetworkMetrics.record`, as
`accounting` does; exemplars included); `window`, the conversion thread's work in the live
bridge: each batch converted a link window (60 batches) after it was observed, one request
per batch, GC on with the bridge's settings (what the records held through the window cost;
issue 48); `receive`, the event loop's receive path: the messages as NATS frames (HMSG with
their header block where they have headers: `--encoding` gives each its Content-Encoding),
read by read, scanned into a core source's handler and the bridge's intake, taken in batches of 512
(the frame scanner, the handler, the intake). The machine is shared and noisy:
alternation spreads the noise over both, and the summary gives the best round of each and
their ratio. For CPU per message, not throughput: nothing else runs.

    python bench/core_ab.py /tmp/base --instructions [--path window] [--encoding snappy] [--variant header]

`--instructions` counts instead of timing: the instructions each checkout executes per
message on the path (valgrind's cachegrind, `apt-get install valgrind`; one pass and three
over the same messages in two runs, their difference over two passes' messages, so the
pool's making and the imports cancel out). The count does not move with the machine's
load, so a change of 1 % shows in one run where the timed rounds spread by 30 %; it does
not see what memory costs (cache misses, page faults), which the timed rounds do. Nor does
it weigh a large memset or memcpy right: glibc does those with `rep stosb`/`rep movsb`, which
valgrind counts as one instruction per byte (a 64 KiB memset reads ~65k instructions; a few
thousand vector stores on the machine). cramjam's framed snappy decoder zeroes its 64 KiB
buffers for each message: with `--encoding snappy` the baseline read 233k instructions per
message where its time was ~3 µs more than ours (docs/performance.md): time such paths. The
hash seed is fixed (PYTHONHASHSEED=0): the same run gives the same count.
"""

from __future__ import annotations

import argparse
import gc
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()
OURS = HERE.parent.parent


def bridge_calls(raws, view: bool = False) -> None:
    """The bridge's calls to the core: observed on arrival, converted per batch; with `view`,
    each batch's network samples counted as the bridge counts them."""
    from _core_api import hot_path

    converter = hot_path().Converter()
    record = None
    if view:
        from prometheus_client import CollectorRegistry

        from nats_otel.bridge.network_metrics import NetworkMetrics

        record = NetworkMetrics(CollectorRegistry()).record
    ledger = converter.linker.index.sequences.ledger
    # One bridge without peers vouches for the gaps in the servers' numbers as it observes
    # (issue 36), where the checkout has it.
    vouching = hasattr(ledger, "receiving")
    for start in range(0, len(raws), 512):
        batch = raws[start : start + 512]
        if vouching:
            ledger.receiving = ("a", 0)
        converter.observe_many(batch, 0.0)
        if vouching:
            ledger.receiving = None
        results = converter.convert_many(batch, 0.0, True)
        if record is not None:
            record([r.network for r in results if getattr(r, "network", None) is not None])


# Batches the link window holds in `window_calls`: `link.wait` (1 s) at ~30k msgs/s in 512s.
WINDOW_BATCHES = 60


def window_calls(raws) -> None:
    """The conversion thread's work in the live bridge: each batch of 512 observed on
    arrival and converted `WINDOW_BATCHES` batches later (the link window; its entries held
    as the bridge holds them), into one export
    request, with the bridge's collector settings (`gc_tuning`, set by `measure`): what the
    records a message holds through the window cost the allocator, the collector and the
    caches shows here (issue 48), where `bridge` converts each batch at once, GC off."""
    from _core_api import hot_path

    from nats_otel import gc_tuning
    from nats_otel.core.pipeline import Converted

    core = hot_path()
    converter = core.Converter()
    encode_results = getattr(core, "encode_results", None)
    held: frozenset[int] = frozenset()  # the positions a JetStream bridge holds back: none here
    batches = [raws[start : start + 512] for start in range(0, len(raws), 512)]
    # The bridge holds each batch's entries itself where the checkout has it (`observe_held`,
    # `observed_batches`), else the converter keeps them (`observe_many`).
    held_entries = hasattr(converter, "observe_held")
    tally_results = getattr(core, "tally_results", None)
    # Since session 49 the bridge converts a batch straight into its request and its counts
    # (`convert_encoded`); before, `convert_many`, then `encode_results` and `tally_results`.
    fused = held_entries and hasattr(converter, "convert_encoded")
    observed: list = []
    for k in range(len(batches) + WINDOW_BATCHES):
        if k < len(batches):
            if held_entries:
                observed.append(converter.observe_held(batches[k], 0.0))
            else:
                converter.observe_many(batches[k], 0.0)
            gc_tuning.after_batch()  # as the bridge does after each observed batch (`Bridge._observe`)
        if k >= WINDOW_BATCHES:
            batch = batches[k - WINDOW_BATCHES]
            if fused:  # the batch straight into its request, counted as it is converted
                converted = converter.convert_encoded(batch, 0.0, observed.pop(0))
                del converted
                gc_tuning.after_batch()
                continue
            results = (converter.convert_many(batch, 0.0, True, observed.pop(0)) if held_entries
                       else converter.convert_many(batch, 0.0, True))
            if encode_results is not None:  # the bridge's pass over the results, as it makes it
                encode_results(results, held)
            else:  # a checkout from before `encode_results`: the bridge's comprehension then
                items = [r.encoded for i, r in enumerate(results)
                         if isinstance(r, Converted) and r.encoded is not None and i not in held]
                if sum(item.span_count for item in items):
                    core.encode_request(items)
            if tally_results is not None:  # the bridge's accounting of the batch
                tally_results(results)
            del results
            gc_tuning.after_batch()


_READS: dict[int, list[bytes]] = {}  # the frames of a pool, cut into reads: made once per process


def _frame(raw) -> bytes:
    """A raw message as the server delivers it: MSG, or HMSG with its header block (a
    compressed trace message's `Content-Encoding`)."""
    subject = raw.subject.encode()
    if not raw.headers:
        return b"MSG %s 1 %d\r\n%s\r\n" % (subject, len(raw.payload), raw.payload)
    block = b"NATS/1.0\r\n" + b"".join(f"{k}: {v}\r\n".encode() for k, vs in raw.headers.items() for v in vs) + b"\r\n"
    return b"HMSG %s 1 %d %d\r\n%s%s\r\n" % (subject, len(block), len(block) + len(raw.payload), block, raw.payload)


def receive_calls(raws) -> None:
    """The event loop's receive path (issue 48): the messages as NATS frames of one
    subscription, read 64 KiB at a time, scanned into a core source's direct handler and the
    bridge's intake, then taken and released in batches of 512, as the bridge's batcher does."""
    from nats_otel.bridge.intake import Intake
    from nats_otel.bridge.settings import BatchSettings, NatsSource
    from nats_otel.bridge.sources import frames
    from nats_otel.bridge.sources.nats_core import CoreSource
    from nats_otel.bridge.telemetry import Metrics

    reads = _READS.get(id(raws))
    if reads is None:
        stream = b"".join(_frame(raw) for raw in raws)
        reads = _READS[id(raws)] = [stream[at:at + 65536] for at in range(0, len(stream), 65536)]
    intake = Intake(1 << 40)
    source = CoreSource(NatsSource(name="bench", urls=["nats://127.0.0.1:4222"], subjects=["trace.>"]),
                        BatchSettings(), intake, Metrics())
    handlers = {1: source.direct_handler()}
    buf = bytearray()
    for data in reads:
        buf += data
        used = frames.scan(buf, handlers)[0]
        del buf[:used]
        while intake.qsize() >= 512:
            intake.release(intake.take(512))
    intake.release(intake.take(len(raws)))


def measure(messages: int, path: str, passes: int = 0, encoding: str | None = None,
            variant: str | None = None) -> None:
    """In the child: print microseconds of CPU per message, best of 3 passes; with `passes`,
    only run the path that many times (counted from outside: `instructions`)."""
    sys.path.insert(1, str(HERE.parent))
    # Both resolve `nats_otel` from PYTHONPATH: the checkout under test.
    from convert_throughput import ours
    from corpus_replay import replicate

    run_path = {"bridge": bridge_calls, "view": lambda raws: bridge_calls(raws, view=True),
                "window": window_calls, "receive": receive_calls}.get(path, ours)
    raws = replicate(messages, encoding=encoding, variant=variant)
    if path == "window":  # the collector as the bridge runs it: the window's cost includes it
        from nats_otel import gc_tuning

        gc_tuning.tune_gc_for_throughput()
    else:
        gc.disable()
    if passes:
        for _ in range(passes):
            run_path(raws)
        return
    best = float("inf")
    for _ in range(3):
        started = time.process_time()
        run_path(raws)
        best = min(best, time.process_time() - started)
    print(best / messages * 1e6)


def _child(messages: int, path: str, encoding: str | None, variant: str | None = None) -> list[str]:
    """The command line of a child measuring `path`."""
    return [sys.executable, str(HERE), "--child", "--messages", str(messages), "--path", path,
            *(["--encoding", encoding] if encoding else []), *(["--variant", variant] if variant else [])]


def run(src: Path, messages: int, path: str, encoding: str | None = None, variant: str | None = None) -> float:
    # cwd and PYTHONPATH: the child imports that checkout's nats_otel, not the installed one.
    env = {**os.environ, "PYTHONPATH": str(src)}
    out = subprocess.run(_child(messages, path, encoding, variant), cwd=src, env=env, check=True, capture_output=True,
                         text=True)
    return float(out.stdout.strip().splitlines()[-1])


def instructions(src: Path, messages: int, path: str, encoding: str | None = None,
                 variant: str | None = None) -> float:
    """Instructions executed per message on `path` by checkout `src` (see the docstring)."""
    counts = []
    for passes in (1, 3):
        env = {**os.environ, "PYTHONPATH": str(src), "PYTHONHASHSEED": "0"}
        out = subprocess.run(["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null",
                              *_child(messages, path, encoding, variant), "--passes", str(passes)],
                             cwd=src, env=env, check=True, capture_output=True, text=True)
        found = re.search(r"I\s+refs:\s+([\d,]+)", out.stderr)
        if found is None:
            raise SystemExit(f"no instruction count in valgrind's output:\n{out.stderr[-2000:]}")
        counts.append(int(found.group(1).replace(",", "")))
    return (counts[1] - counts[0]) / (2 * messages)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("baseline", type=Path, nargs="?", help="the other checkout")
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--path", choices=("convert", "bridge", "view", "window", "receive"), default="convert",
                        help="convert: Converter.convert per message + requests; bridge: the bridge's batch calls; "
                             "view: those and the network view's counting; window: the bridge's calls with a link "
                             "window held, one request per batch, the bridge's GC settings; receive: the event "
                             "loop's receive path, frames into the intake")
    parser.add_argument("--instructions", action="store_true",
                        help="count instructions per message (valgrind) instead of timing rounds")
    parser.add_argument("--encoding", choices=("gzip", "snappy"),
                        help="every message compressed so (default: as in the corpus, a few compressed)")
    parser.add_argument("--variant", choices=("header", "adhoc"),
                        help="every message with a header of its application's own, or traced ad hoc "
                             "(corpus_replay.replicate)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--passes", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        measure(args.messages, args.path, args.passes, args.encoding, args.variant)
        return
    if args.baseline is None:
        parser.error("give the baseline checkout")
    if args.instructions:
        if shutil.which("valgrind") is None:
            raise SystemExit("--instructions needs valgrind (apt-get install valgrind)")
        base, ours = (instructions(src, args.messages, args.path, args.encoding, args.variant)
                      for src in (args.baseline.resolve(), OURS))
        print(f"{args.messages:,} messages, path {args.path}, encoding {args.encoding or 'as in the corpus'}"
              f"{', every message ' + args.variant if args.variant else ''}: "
              f"baseline {base:,.0f} instructions per message, "
              f"ours {ours:,.0f}: ours executes {ours / base:.3f} of the baseline's")
        return
    print(f"load average {os.getloadavg()[0]:.2f}; {args.messages:,} messages, {args.rounds} rounds", flush=True)
    best = {"baseline": float("inf"), "ours": float("inf")}
    ratios = []
    for round_number in range(1, args.rounds + 1):
        base, ours = (run(src, args.messages, args.path, args.encoding, args.variant)
                      for src in (args.baseline.resolve(), OURS))
        best["baseline"], best["ours"] = min(best["baseline"], base), min(best["ours"], ours)
        ratios.append(base / ours)
        print(f"round {round_number}: baseline {base:6.2f} us/msg   ours {ours:6.2f} us/msg   "
              f"ratio {base / ours:.2f}x", flush=True)
    print(f"\nbest: baseline {best['baseline']:.2f} us/msg, ours {best['ours']:.2f} us/msg: "
          f"ours uses {best['ours'] / best['baseline']:.2f} of the baseline's CPU "
          f"({best['baseline'] / best['ours']:.2f}x as many messages per core)")
    # The paired ratio's median: each round's two runs share the machine's state of the moment.
    print(f"median paired ratio baseline/ours {statistics.median(ratios):.3f}x over {len(ratios)} rounds "
          f"(min {min(ratios):.3f}, max {max(ratios):.3f}); load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
