"""What the compiled kernel's span ids cost (BLAKE2b of `_blake2b.h`): ns per call of the
kernel's `server_span_id` and `event_span_id` on realistic inputs (a traceparent's context,
a 56-character server id, a nanosecond timestamp, a connection id: 170-180 bytes hashed, two
compressions), best of `--repeat` passes of `--calls` calls, GC off. For reference, the
kernel's `blake2b` and `hashlib.blake2b(data, digest_size=16)` on the same bytes, and the
bare loop (calling `len`), which every line includes.

    python setup.py build_ext --inplace
    PYTHONPATH=. python bench/blake2b_cost.py [--calls 200000] [--repeat 5]

Alternate runs with a baseline checkout (`PYTHONPATH=/path/to/base`): the machine is noisy.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import random
import time

from nats_otel.core import accel, ids


def contexts_and_idents(count: int) -> list[tuple[ids.TraceContext, bytes]]:
    """`count` (context, identity) pairs as the bridge builds them (`ids.trace_context`,
    `ids.identity`), from 1024 distinct ones."""
    rng = random.Random(7)
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"
    pool = []
    for _ in range(1024):
        ctx = ids.TraceContext.of(rng.randbytes(16), rng.randbytes(8))
        server_id = "N" + "".join(rng.choice(alphabet) for _ in range(55))
        ident = ids._fields(server_id, str(1_763_800_000_000_000_000 + rng.randrange(10**15)),
                            str(rng.randrange(1, 20_000)))
        pool.append((ctx, ident))
    return [pool[i % len(pool)] for i in range(count)]


def best_ns(run, calls: int, repeat: int) -> float:
    """The best of `repeat` runs of `run()`, in ns per call."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter_ns()
        run()
        best = min(best, time.perf_counter_ns() - start)
    return best / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    kernel = accel.compiled("_kernel")
    if kernel is None:
        raise SystemExit("the compiled kernel is not built here (python setup.py build_ext --inplace)")
    pairs = contexts_and_idents(args.calls)
    server_bytes = [ids._ROLE_PREFIX[b"server"] + ctx.id_fields + ident for ctx, ident in pairs]
    event_bytes = [ids._ROLE_PREFIX[b"event"] + ctx.id_fields + ident + ids._POSITIONS[3] for ctx, ident in pairs]
    # The kernel's ids are hashlib's (tests/core/test_twins.py); checked here on these inputs too.
    for (ctx, ident), data in zip(pairs[:1024], server_bytes[:1024], strict=True):
        assert kernel.server_span_id(ctx, ident) == ids._digest(data), "kernel and hashlib differ"
    for (ctx, ident), data in zip(pairs[:1024], event_bytes[:1024], strict=True):
        assert kernel.event_span_id(ctx, ident, 3) == ids._digest(data), "kernel and hashlib differ"

    server_span_id, event_span_id, blake2b, h_blake2b = (kernel.server_span_id, kernel.event_span_id,
                                                        kernel.blake2b, hashlib.blake2b)

    def loop() -> None:
        for data in server_bytes:
            len(data)

    def server() -> None:
        for ctx, ident in pairs:
            server_span_id(ctx, ident)

    def event() -> None:
        for ctx, ident in pairs:
            event_span_id(ctx, ident, 3)

    def kernel_blake2b() -> None:
        for data in server_bytes:
            blake2b(data, 16)

    def hashlib_blake2b() -> None:
        for data in server_bytes:
            h_blake2b(data, digest_size=16).digest()

    print(f"{kernel.__file__}")
    print(f"bytes hashed: server {len(server_bytes[0])}, event {len(event_bytes[0])}; "
          f"{args.calls} calls, best of {args.repeat}")
    gc.disable()
    try:
        for name, run in (("loop (len)", loop), ("kernel.server_span_id", server),
                          ("kernel.event_span_id", event), ("kernel.blake2b(data, 16)", kernel_blake2b),
                          ("hashlib.blake2b(data, digest_size=16)", hashlib_blake2b)):
            print(f"{name:40s} {best_ns(run, args.calls, args.repeat):7.1f} ns per call")
    finally:
        gc.enable()


if __name__ == "__main__":
    main()
