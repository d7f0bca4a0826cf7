"""bench/bridge_throughput.py, the child processes: the message pool and the roles run in
their own processes (the raw publisher, the ceiling subscriber, the naive SDK pipeline).

The parent starts a role as ``python bench/_bridge_roles.py _publish|_raw|_naive ...``;
each writes its results to ``--out`` (and ``--out``.ready once subscribed).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pickle
import re
import signal
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _core_api import hot_path

_TID = re.compile(rb"00-([0-9a-f]{32})-")


def build_pool(count: int, path: Path, encoding: str | None = None, variant: str | None = None) -> list[int]:
    """`count` raw trace messages as (header block, payload, trace id) -> pickle; returns
    the spans each corpus message gives, in order (the pool repeats the corpus). `encoding`:
    every message compressed so; `variant`: every message changed so (`corpus_replay.replicate`;
    the spans each gives do not change)."""
    from corpus_replay import corpus_raws, replicate

    from nats_otel.core.decode import DecodeLimits, decompress
    from nats_otel.core.pipeline import Converted

    pool = []
    for raw in replicate(count, encoding=encoding, variant=variant):
        hdr = b""
        if raw.headers:
            hdr = b"NATS/1.0\r\n" + b"".join(f"{k}: {v}\r\n".encode() for k, vs in raw.headers.items()
                                              for v in vs) + b"\r\n"
        text = decompress(raw.payload, raw.header("Content-Encoding"), DecodeLimits())
        m = _TID.search(text)
        pool.append((hdr, raw.payload, m.group(1).decode() if m else None))
    path.write_bytes(pickle.dumps(pool))
    base = corpus_raws()
    conv = hot_path().Converter()
    return [len(r.spans) if isinstance(r, Converted) else 0 for r in map(conv.convert, base)]


def role_publish(args: argparse.Namespace) -> None:
    """Write the pool as PUB/HPUB frames to a raw socket, at --rate (0: as fast as possible)."""
    pool = pickle.loads(Path(args.pool).read_bytes())
    if args.limit:
        pool = pool[: args.limit]
    subject = args.subject.encode()
    frames = []
    for hdr, payload, _ in pool:
        if hdr:
            frames.append(b"HPUB %s %d %d\r\n%s%s\r\n" % (subject, len(hdr), len(hdr) + len(payload), hdr, payload))
        else:
            frames.append(b"PUB %s %d\r\n%s\r\n" % (subject, len(payload), payload))
    sock = socket.create_connection((args.host, args.port))
    sock.recv(4096)  # INFO
    connect = {"verbose": False, "pedantic": False, "headers": True, "user": args.user, "pass": args.password,
               "name": "bench-publisher", "lang": "python", "version": "0", "protocol": 1}
    sock.sendall(b"CONNECT " + json.dumps(connect).encode() + b"\r\nPING\r\n")
    buf = b""
    while b"PONG" not in buf:
        chunk = sock.recv(4096)
        if not chunk or b"-ERR" in chunk:
            raise SystemExit(f"publisher: connect failed: {chunk!r}")
        buf += chunk
    times: dict[str, float] = {}
    started = time.time()
    i, n = 0, len(frames)
    duration = args.duration or 0.0
    if args.rate <= 0:
        for start in range(0, n, 500):
            sock.sendall(b"".join(frames[start : start + 500]))
        sent = n
    else:
        # Paced in 5 ms ticks; the pool is cycled if the duration needs more (ids then repeat).
        sent = 0
        while True:
            now = time.time()
            elapsed = now - started
            if (duration and elapsed >= duration) or (not duration and sent >= n):
                break
            due = int(elapsed * args.rate) - sent
            if due > 0:
                chunk = []
                for _ in range(due):
                    chunk.append(frames[i])
                    tid = pool[i][2]
                    if tid is not None and tid not in times:
                        times[tid] = now
                    i = (i + 1) % n
                sock.sendall(b"".join(chunk))
                sent += due
            time.sleep(0.005)
    sock.sendall(b"PING\r\n")
    buf = b""
    while b"PONG" not in buf:
        buf += sock.recv(4096)
    ended = time.time()
    sock.close()
    Path(args.out).write_bytes(pickle.dumps({"sent": sent, "started": started, "ended": ended, "times": times}))


def _subscribe_until_sigterm(args: argparse.Namespace, on_message) -> None:
    """Run a nats-py subscriber calling `on_message(msg)` until SIGTERM; ready file when subscribed."""
    import nats

    async def main() -> None:
        nc = await nats.connect(args.url)

        async def cb(msg) -> None:
            on_message(msg)

        await nc.subscribe(args.subject, cb=cb)
        await nc.flush()
        Path(args.out + ".ready").touch()
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()
        await nc.close()

    asyncio.run(main())


def role_raw(args: argparse.Namespace) -> None:
    """The ceiling: a nats-py callback that only counts."""
    state = {"n": 0, "first": 0.0, "last": 0.0}

    def count(_msg) -> None:
        if not state["n"]:
            state["first"] = time.time()
        state["n"] += 1
        state["last"] = time.time()

    _subscribe_until_sigterm(args, count)
    Path(args.out).write_text(json.dumps(state))


def role_naive(args: argparse.Namespace) -> None:
    """nats-py callback -> decode/map -> SDK ReadableSpan -> BatchSpanProcessor -> OTLPSpanExporter."""
    from convert_throughput import _readable
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    from nats_otel.bridge.sources.connection import raw_from_msg
    from nats_otel.core.pipeline import Converted

    # --max-queue 0: the SDK's defaults (a 2,048-span queue that drops past it: "Queue full,
    # dropping Span"). Otherwise the settings a user picks after seeing that warning: a queue
    # holding the whole run, the default export batch, and the bridge's 0.2 s delay.
    if args.max_queue:
        processor = BatchSpanProcessor(OTLPSpanExporter(endpoint=args.endpoint, insecure=True),
                                       max_queue_size=args.max_queue, max_export_batch_size=args.batch_size,
                                       schedule_delay_millis=args.delay_ms)
    else:
        processor = BatchSpanProcessor(OTLPSpanExporter(endpoint=args.endpoint, insecure=True))
    converter = hot_path().Converter()
    resources: dict = {}
    state = {"n": 0, "spans": 0, "first": 0.0, "last": 0.0}

    def convert_and_export(msg) -> None:
        if not state["n"]:
            state["first"] = time.time()
        state["n"] += 1
        result = converter.convert(raw_from_msg(msg))
        if isinstance(result, Converted):
            for span in result.spans:
                processor.on_end(_readable(span, resources))
                state["spans"] += 1
        state["last"] = time.time()

    _subscribe_until_sigterm(args, convert_and_export)
    processor.shutdown()
    Path(args.out).write_text(json.dumps(state))


def main(argv: list[str]) -> None:
    """Run role ``argv[0]`` with the options that follow it."""
    role, rest = argv[0], argv[1:]
    p = argparse.ArgumentParser()
    for flag in ("--pool", "--subject", "--host", "--user", "--password", "--out", "--url", "--endpoint"):
        p.add_argument(flag)
    p.add_argument("--port", type=int)
    p.add_argument("--rate", type=float, default=0)
    p.add_argument("--duration", type=float, default=0)
    p.add_argument("--limit", type=int, default=0)
    p.add_argument("--max-queue", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--delay-ms", type=float, default=200)
    a = p.parse_args(rest)
    roles: dict[str, Callable[[argparse.Namespace], None]] = {
        "_publish": role_publish, "_raw": role_raw, "_naive": role_naive}
    roles[role](a)


if __name__ == "__main__":
    main(sys.argv[1:])
