"""Benchmark: CPU per trace message of each stage of the bridge loop, measured one by one.

    python bench/stage_costs.py [--messages 30000] [--rounds 3]

Stages, on the same replicated corpus (`corpus_replay.replicate`), best of --rounds:
* receive        - nats-py delivering the messages to a callback that only counts (a real
                   nats-server and publisher): the ceiling's cost per message;
* intake         - what the bridge's receive path costs beyond that: its direct dispatch
                   (`sources/direct.py`: no nats-py `Msg`, queue or task) into `CoreSource`'s
                   handler (received tally, headers, the core's raw message, the `Delivery`,
                   the byte-bounded `Intake`), minus the receive row. Negative when the
                   bridge's whole receive is cheaper than nats-py's bare callback; the JSON
                   also has the direct path whole ("direct receive+intake") and the callback
                   path it falls back to ("callback intake", as intake was measured before);
* decode         - decompress, parse and validate, trace context (`pipeline.prepare`);
* link           - record hop evidence (`Linker.observe`) and decide parents (`place`);
* map+encode     - spans straight into protobuf (`span_bytes.map_encode`);
* request        - one export request per 512 spans (`span_bytes.encode_request`);
* gRPC send      - `GrpcExporter.export_bytes` of those requests to a real receiver in
                   another process (this thread's CPU: serialization is done, this is
                   the call);
* network        - the network sample of each message (`core.network`, pure Python);
* accounting     - `BatchAccounting.account` of each batch (counters, the network view's
                   per-message histograms; the received counter is counted in intake);
* GC             - time in collections while the core stages run with the bridge's GC
                   settings (`gc_tuning`), measured with `gc.callbacks`.
The core stages run in this process (the core it chose) and again in a child with
NATS_OTEL_NO_EXTENSIONS=1, side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

BATCH = 512


def _best(rounds: int, work) -> float:
    best = float("inf")
    for _ in range(rounds):
        started = time.process_time()
        work()
        best = min(best, time.process_time() - started)
    return best


def core_stages(messages: int, rounds: int) -> dict[str, float]:
    """Microseconds of CPU per message of the pure core's stages, GC off (measured apart)."""
    from _core_api import hot_path
    from corpus_replay import replicate

    from nats_otel.core.mapping import MappingOptions
    from nats_otel.core.span_bytes import EncodedSpans

    core = hot_path()
    linker_class, prepare, encode_request, map_encode = core.Linker, core.prepare, core.encode_request, core.map_encode

    raws = replicate(messages)
    options = MappingOptions()
    out: dict[str, float] = {"implementation": core.implementation()}  # type: ignore[dict-item]
    gc.disable()
    prepared = [prepare(raw) for raw in raws]
    out["decode"] = _best(rounds, lambda: [prepare(raw) for raw in raws])

    def link() -> list:
        linker = linker_class(bounded=False)
        for p in prepared:
            linker.observe(p)
        return [linker.place(p) for p in prepared]

    out["link"] = _best(rounds, link)
    placements = link()
    pairs = list(zip(prepared, placements, strict=True))
    out["map+encode"] = _best(rounds, lambda: [map_encode(p.msg, p.ctx, pl, options) for p, pl in pairs])
    items = [EncodedSpans(*map_encode(p.msg, p.ctx, pl, options)[:3]) for p, pl in pairs]

    def requests() -> None:
        batch, count = [], 0
        for item in items:
            batch.append(item)
            count += item.span_count
            if count >= BATCH:
                encode_request(batch)
                batch, count = [], 0

    out["request"] = _best(rounds, requests)
    network_sample = core.network_sample
    out["network"] = _best(rounds, lambda: [network_sample(p.msg, None) for p in prepared])
    for key in ("decode", "link", "map+encode", "request", "network"):
        out[key] = out[key] / len(raws) * 1e6
    # GC: the same stages with the bridge's settings, time spent collecting.
    from nats_otel.gc_tuning import tune_gc_for_throughput

    spent = [0.0, 0.0]

    def watch(phase: str, info: dict) -> None:
        if phase == "start":
            spent[1] = time.perf_counter()
        else:
            spent[0] += time.perf_counter() - spent[1]

    gc.enable()
    tune_gc_for_throughput()
    gc.callbacks.append(watch)
    started = time.perf_counter()
    linker = linker_class()
    for raw in raws:
        p = prepare(raw)
        linker.observe(p)
        map_encode(p.msg, p.ctx, linker.place(p), options)
    whole = time.perf_counter() - started
    gc.callbacks.remove(watch)
    out["GC"] = spent[0] / len(raws) * 1e6
    out["GC share"] = spent[0] / whole
    return out


def receive_stages(messages: int) -> dict[str, float]:
    """nats-py receive and the bridge's intake, CPU per message, against a real server."""
    import nats
    from _bridge_roles import build_pool

    from nats_otel.bridge.intake import Intake
    from nats_otel.bridge.settings import BatchSettings, NatsSource
    from nats_otel.bridge.sources.connection import raw_from_msg
    from nats_otel.bridge.sources.delivery import delivery
    from nats_otel.bridge.sources.direct import DirectClient
    from nats_otel.bridge.sources.nats_core import CoreSource
    from nats_otel.bridge.telemetry import Metrics
    from nats_otel.devkit.processes import start_topology
    from nats_otel.devkit.topology import single_server

    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="stage-costs-") as tmp:
        topo = start_topology(single_server(), Path(tmp) / "nats")
        try:
            pool = Path(tmp) / "pool.pkl"
            build_pool(messages, pool)
            port = topo.server("n1").ports.client
            metrics = Metrics()
            received = metrics.received.labels("a")

            async def publish(subject: str) -> None:
                publisher = await asyncio.create_subprocess_exec(
                    sys.executable, str(Path(__file__).with_name("_bridge_roles.py")), "_publish", "--pool",
                    str(pool), "--subject", subject, "--host", "127.0.0.1", "--port", str(port),
                    "--user", "a", "--password", "pwd", "--out", str(Path(tmp) / f"pub-{subject}.pkl"))
                await publisher.wait()

            def meter() -> tuple[dict[str, float], asyncio.Event]:
                return {"n": 0, "cpu0": 0.0, "cpu1": 0.0}, asyncio.Event()

            def tick(state: dict[str, float], done: asyncio.Event) -> None:
                state["n"] += 1
                if state["n"] == messages:
                    state["cpu1"] = time.process_time()
                    done.set()

            async def run(name: str, callback) -> float:
                """nats-py's callback path: `callback(msg)` per message."""
                nc = await nats.connect(topo.client_url("n1", "a"), pending_size=1 << 30)
                state, done = meter()

                async def cb(msg) -> None:
                    if not state["n"]:
                        state["cpu0"] = time.process_time()
                    callback(msg)
                    tick(state, done)

                await nc.subscribe(f"stage.{name}", cb=cb, pending_msgs_limit=-1, pending_bytes_limit=-1)
                await nc.flush()
                await publish(f"stage.{name}")
                await asyncio.wait_for(done.wait(), 120)
                await nc.close()
                return (state["cpu1"] - state["cpu0"]) / messages * 1e6

            async def run_direct() -> float:
                """The bridge's path: a direct subscription into `CoreSource`'s handler."""
                source = CoreSource(NatsSource(name="a", subjects=["stage.direct"]), BatchSettings(),
                                    Intake(1 << 34), metrics)
                handler = source.direct_handler()
                nc = DirectClient()
                await nc.connect(topo.client_url("n1", "a"), pending_size=1 << 30)
                state, done = meter()

                def on_raw(subject: bytes, reply: bytes | None, headers: bytes | None, payload: bytes) -> None:
                    if not state["n"]:
                        state["cpu0"] = time.process_time()
                    handler(subject, reply, headers, payload)
                    tick(state, done)

                await nc.subscribe_direct("stage.direct", on_raw)
                await nc.flush()
                await publish("stage.direct")
                await asyncio.wait_for(done.wait(), 120)
                await nc.close()
                return (state["cpu1"] - state["cpu0"]) / messages * 1e6

            async def both() -> None:
                for _ in range(2):
                    intake = Intake(1 << 34)
                    raw = await run("raw", lambda msg: None)
                    callback = await run("intake", lambda msg, intake=intake: (
                        received.inc(), intake.offer(delivery(raw_from_msg(msg), "a"))))
                    whole = await run_direct()
                    for key, value in (("receive", raw), ("direct receive+intake", whole), ("callback", callback)):
                        out[key] = min(out.get(key, float("inf")), value)
                # Differences of the best runs: a difference per round carries that round's noise.
                out["intake"] = out["direct receive+intake"] - out["receive"]
                out["callback intake"] = out.pop("callback") - out["receive"]

            asyncio.run(both())
        finally:
            topo.stop()
    return out


def send_stage(messages: int) -> dict[str, float]:
    """gRPC send of ready requests (this thread's CPU per message) and the metrics updates."""
    from _core_api import hot_path
    from corpus_replay import replicate

    from nats_otel.bridge.export.otlp import GrpcExporter
    from nats_otel.bridge.settings import OtlpSettings
    from nats_otel.bridge.telemetry import Metrics
    from nats_otel.core.pipeline import Converted

    encode_request = hot_path().encode_request
    converter = hot_path().Converter()
    items = [r.encoded for r in (converter.convert(raw, encoded=True) for raw in replicate(messages))
             if isinstance(r, Converted) and r.encoded is not None]
    requests, batch, count = [], [], 0
    for item in items:
        batch.append(item)
        count += item.span_count
        if count >= BATCH:
            requests.append(encode_request(batch))
            batch, count = [], 0
    receiver = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; sys.path.insert(0, sys.argv[1]); from _bridge_meters import Receiver; "
        "r = Receiver(); print(r.endpoint, flush=True); time.sleep(600)"), str(Path(__file__).parent)],
        stdout=subprocess.PIPE, text=True)
    try:
        assert receiver.stdout is not None
        endpoint = receiver.stdout.readline().strip()
        exporter = GrpcExporter(OtlpSettings(endpoint=endpoint))
        exporter.export_bytes(requests[0])  # connect first
        best = float("inf")
        for _ in range(2):
            started = time.thread_time()
            for request in requests:
                assert exporter.export_bytes(request).ok
            best = min(best, time.thread_time() - started)
        exporter.close()
    finally:
        receiver.kill()
        receiver.wait()
    # Accounting of batches of 500 converted messages, all exported (the usual case).
    from nats_otel.bridge.accounting import BatchAccounting
    from nats_otel.bridge.export.result import ExportResult
    from nats_otel.bridge.processor import BatchOutcome
    from nats_otel.bridge.readiness import BackendReadiness
    from nats_otel.bridge.settings import TelemetrySettings

    results = [r for r in (hot_path().Converter().convert(raw, encoded=True) for raw in replicate(messages))
               if isinstance(r, Converted)]
    accounting = BatchAccounting(Metrics(), TelemetrySettings(), BackendReadiness([]), ["otlp-grpc"])
    outcomes = [BatchOutcome(results[i : i + 500], {"otlp-grpc": ExportResult.success()}, {"otlp-grpc": 0.01},
                             spans=1000) for i in range(0, len(results), 500)]
    started = time.process_time()
    for outcome in outcomes:
        accounting.account(outcome)
    per_message = (time.process_time() - started) / len(results)
    return {"gRPC send": best / len(items) * 1e6, "accounting": per_message * 1e6}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=30_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--core-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.core_only:
        print(json.dumps(core_stages(args.messages, args.rounds)))
        return
    print(f"load average {os.getloadavg()[0]:.2f}; {args.messages:,} messages", flush=True)
    ours = core_stages(args.messages, args.rounds)
    env = {**os.environ, "NATS_OTEL_NO_EXTENSIONS": "1"}
    pure = json.loads(subprocess.run([sys.executable, __file__, "--core-only", "--messages", str(args.messages),
                                      "--rounds", str(args.rounds)], env=env, check=True, capture_output=True,
                                     text=True).stdout.splitlines()[-1])
    other = {**receive_stages(args.messages), **send_stage(args.messages)}
    print(f"\n{'stage':<14}{ours['implementation'] + ' core':>16}{'python core':>14}   (us of CPU per trace message)")
    for key in ("receive", "intake"):
        print(f"{key:<14}{other[key]:>16.1f}{'':>14}")
    for key in ("decode", "link", "map+encode", "request", "network"):
        print(f"{key:<14}{ours[key]:>16.1f}{pure[key]:>14.1f}")
    for key in ("gRPC send", "accounting"):
        print(f"{key:<14}{other[key]:>16.1f}{'':>14}")
    print(f"{'GC':<14}{ours['GC']:>16.1f}{pure['GC']:>14.1f}   ({ours['GC share']:.0%} / {pure['GC share']:.0%} "
          "of the core's time)")
    loop_rows = ("receive", "intake", "gRPC send", "accounting")
    total = sum(other[k] for k in loop_rows) + sum(ours[k] for k in ("decode", "link", "map+encode", "request",
                                                                      "network", "GC"))
    print(f"{'sum':<14}{total:>16.1f}")
    print("\n" + json.dumps({"ours": ours, "python": pure, "loop": other}))


if __name__ == "__main__":
    main()
