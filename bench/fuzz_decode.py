"""Fuzz decode + map + encode with generated hostile trace messages (not part of CI).

    python bench/fuzz_decode.py [--count 120000] [--seed 1] [--json out.json]

Every payload goes through `Converter().convert` (the bridge's path) and, when it gives
spans, through both encoders. A crash (any exception) or a case slower than `--slow`
seconds fails the run (exit 1). Prints counts by outcome (`ok` or the rejection reason)
and by generator family, and the slowest case.

The generator mutates a valid trace message (real shape: ingress, egress to a route with a
hop id, JetStream event) in the ways issue 7 lists: truncated or garbage gzip/snappy, wrong
types, huge numbers, deep nesting, invalid UTF-8, unknown event types, odd hop ids,
oversized headers and payloads.
"""

from __future__ import annotations

import argparse
import copy
import gzip
import json
import random
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import cramjam

from nats_otel.core.decode import DecodeLimits, RawTraceMessage
from nats_otel.core.encode import to_otlp_json_line, to_protobuf_bytes
from nats_otel.core.engine import Converter
from nats_otel.core.pipeline import Converted

# Small limits so "oversized" cases are cheap to build; the bridge's are configurable
# (`limits:` in the settings).
LIMITS = DecodeLimits(max_payload_bytes=256 * 1024, max_decompressed_bytes=512 * 1024, max_events=500)
REASONS = {"bad_compression", "too_large", "bad_json", "bad_schema", "decode_error", "bad_record"}


def base_doc(rnd: random.Random) -> dict:
    tid, pid = rnd.getrandbits(128), rnd.getrandbits(64)
    t = f"2026-01-02T03:04:05.{rnd.randrange(10**8):09d}Z"
    headers: dict = {"traceparent": [f"00-{tid:032x}-{pid:016x}-01"], "X-App": ["v"]}
    if rnd.random() < 0.4:
        headers["Nats-Trace-Hop"] = [rnd.choice(["1", "2", "1.1", "3.2.1"])]
    return {
        "server": {"name": "s1", "id": "NID" + str(rnd.randrange(100)), "cluster": "c", "ver": "2.15.1",
                   "host": "127.0.0.1", "tags": ["a"], "jetstream": True, "seq": 3, "time": t},
        "request": {"header": headers, "msgsize": rnd.randrange(1, 2000)},
        "hops": 1,
        "events": [
            {"type": "in", "ts": t, "kind": 0, "cid": 5, "name": "pub", "acc": "A", "subj": "orders.new"},
            {"type": "sm", "ts": t, "to": "orders.mapped"},
            {"type": "js", "ts": t, "stream": "ORDERS", "subject": "orders.new"},
            {"type": "eg", "ts": t, "kind": 1, "cid": 9, "name": "s2", "hop": "1", "acc": "A"},
            {"type": "eg", "ts": t, "kind": 0, "cid": 7, "name": "sub", "sub": "orders.>", "queue": "q"},
        ],
    }


WEIRD_VALUES: list[Callable[[random.Random], object]] = [
    lambda r: None, lambda r: True, lambda r: -1, lambda r: 2**64, lambda r: -(2**63) - 1, lambda r: 10**30,
    lambda r: 1e308, lambda r: -0.0, lambda r: "", lambda r: "x" * r.choice([1, 300, 70_000]),
    lambda r: [], lambda r: {}, lambda r: [1, "a", None], lambda r: {"a": {"b": []}},
    lambda r: "\u0000\u202e\ufeff", lambda r: "2026-13-45T99:99:99.999999999999Z", lambda r: "\ud7ff\ue000",
]
ODD_HOPS = ["1..2", "", ".", "1.", ".1", "a", "-1", "1" * 10_000, "1." * 2000 + "1", "\u0661", "1 2", "0", "00"]


def _paths(doc: object, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _paths(v, (*prefix, i))
    return out


def _set(doc: dict, path: tuple, value: object) -> dict:
    if not path:
        return value  # type: ignore[return-value]
    node = doc
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = value
    return doc


def _nest(depth: int) -> object:
    value: object = 1
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


def dumps(doc: object) -> bytes:
    # The standard library writes what orjson refuses (ints over 64 bits, NaN): we want those.
    return json.dumps(doc, separators=(",", ":")).encode()


def wrong_type(rnd, doc):
    return dumps(_set(doc, rnd.choice(_paths(doc)), rnd.choice(WEIRD_VALUES)(rnd))), {}


def drop_field(rnd, doc):
    path = rnd.choice([p for p in _paths(doc) if p])
    parent = doc
    for p in path[:-1]:
        parent = parent[p]
    del parent[path[-1]]
    return dumps(doc), {}


def deep_nesting(rnd, doc):
    depth = rnd.choice([50, 200, 1000, 5000])
    # orjson refuses to serialise deeper than 254 levels: write the JSON text by hand.
    inner = "[" * depth + "1" + "]" * depth
    where = rnd.choice(["server", "request", "events", "extra", "header"])
    text = dumps(doc).decode()
    if where == "events":
        text = text.replace('"events":[', f'"events":[{inner},', 1)
    elif where == "header":
        text = text.replace('"header":{', f'"header":{{"X-Deep":{inner},', 1)
    else:
        text = text[:-1] + f',"{where}x":{inner}}}'
    return text.encode(), {}


def huge_numbers(rnd, doc):
    text = dumps(doc).decode()
    big = rnd.choice(["1" + "0" * 400, "1e999", "-1e999", "18446744073709551616", "1.5", "NaN", "Infinity"])
    key = rnd.choice(['"msgsize":', '"hops":', '"cid":', '"kind":', '"seq":'])
    head, sep, tail = text.partition(key)
    num_end = 0
    while num_end < len(tail) and (tail[num_end].isdigit() or tail[num_end] in "-."):
        num_end += 1
    return (head + sep + big + tail[num_end:]).encode(), {}


def invalid_utf8(rnd, doc):
    data = bytearray(dumps(doc))
    bad = rnd.choice([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\x80"])
    at = rnd.randrange(len(data))
    data[at:at] = bad
    if rnd.random() < 0.3:  # lone surrogate escapes: valid JSON, not valid Unicode
        return dumps(doc).replace(b'"pub"', b'"\\ud800"'), {}
    return bytes(data), {}


def unknown_events(rnd, doc):
    for _ in range(rnd.randrange(1, 5)):
        doc["events"].insert(rnd.randrange(1, len(doc["events"]) + 1),
                             rnd.choice([{"type": "zz", "ts": "x"}, {"type": None}, {"type": 7}, "eg", [], None,
                                         {"type": "in", "ts": doc["events"][0]["ts"]}, {}]))
    return dumps(doc), {}


def odd_hops(rnd, doc):
    hop = rnd.choice(ODD_HOPS)
    if rnd.random() < 0.5:
        doc["events"][3]["hop"] = hop
    else:
        doc["request"]["header"]["Nats-Trace-Hop"] = [hop]
    return dumps(doc), {}


def oversized(rnd, doc):
    kind = rnd.choice(["header", "payload", "events", "many_headers"])
    if kind == "header":
        doc["request"]["header"]["X-Big"] = ["v" * rnd.choice([100_000, 300_000])]
    elif kind == "payload":
        return b" " * (LIMITS.max_payload_bytes + rnd.randrange(1, 1000)) + dumps(doc), {}
    elif kind == "events":
        doc["events"] += [doc["events"][-1]] * rnd.choice([LIMITS.max_events, LIMITS.max_events * 3])
    else:
        doc["request"]["header"].update({f"H{i}": [str(i)] for i in range(rnd.choice([1000, 20_000]))})
    return dumps(doc), {}


def bad_gzip(rnd, doc):
    data = gzip.compress(dumps(doc))
    kind = rnd.choice(["truncate", "flip", "garbage", "bomb", "trailing"])
    if kind == "truncate":
        data = data[: rnd.randrange(len(data))]
    elif kind == "flip":
        i = rnd.randrange(len(data))
        data = data[:i] + bytes([data[i] ^ (1 << rnd.randrange(8))]) + data[i + 1:]
    elif kind == "garbage":
        data = rnd.randbytes(rnd.randrange(0, 200))
    elif kind == "bomb":
        data = gzip.compress(b" " * (LIMITS.max_decompressed_bytes * 4) + dumps(doc), 9)
    else:
        data += rnd.randbytes(8)
    return data, {"Content-Encoding": [rnd.choice(["gzip", "GZIP", " gzip "])]}


def bad_snappy(rnd, doc):
    data = bytes(cramjam.snappy.compress(dumps(doc)))
    kind = rnd.choice(["truncate", "flip", "garbage", "raw_not_framed", "bomb"])
    if kind == "truncate":
        data = data[: rnd.randrange(len(data))]
    elif kind == "flip":
        i = rnd.randrange(len(data))
        data = data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1:]
    elif kind == "garbage":
        data = rnd.randbytes(rnd.randrange(0, 200))
    elif kind == "raw_not_framed":
        data = bytes(cramjam.snappy.compress_raw(dumps(doc)))
    else:
        data = bytes(cramjam.snappy.compress(b" " * (LIMITS.max_decompressed_bytes * 2) + dumps(doc)))
    return data, {"Content-Encoding": ["snappy"]}


def odd_encoding(rnd, doc):
    return dumps(doc), {"Content-Encoding": [rnd.choice(["br", "zstd", "x" * 500, "gzip, snappy", ""])]}


def garbage(rnd, doc):
    choice = rnd.randrange(4)
    if choice == 0:
        return rnd.randbytes(rnd.randrange(0, 300)), {}
    if choice == 1:
        return rnd.choice([b"", b"null", b"[]", b'"s"', b"1", b"{}", b'{"events":[]}', b"{\"server\":1}"]), {}
    if choice == 2:
        data = dumps(doc)
        return data[: rnd.randrange(len(data))], {}
    return dumps(doc), {rnd.choice(["Content-Encoding", "Nats-Trace-Hop"]): [rnd.randbytes(20).decode("latin-1")]}


def valid(rnd, doc):
    return dumps(doc), rnd.choice([{}, {"Content-Encoding": ["identity"]}])


def stacked(rnd, doc):
    """Two mutations of the JSON document at once."""
    for family in rnd.sample([wrong_type, drop_field, odd_hops, unknown_events], 2):
        try:
            payload, _ = family(rnd, doc)
        except (KeyError, IndexError, TypeError, AttributeError, ValueError):
            continue  # the first mutation removed what the second one changes
        doc = json.loads(payload)
    return dumps(doc), {}


FAMILIES = [wrong_type, drop_field, deep_nesting, huge_numbers, invalid_utf8, unknown_events, odd_hops,
            oversized, bad_gzip, bad_snappy, odd_encoding, garbage, valid, stacked]
# Expensive families (megabytes per case) are drawn less often.
WEIGHTS = [10, 6, 3, 5, 6, 6, 6, 1, 5, 5, 2, 6, 4, 6]


def generate(rnd: random.Random) -> tuple[str, RawTraceMessage]:
    family = rnd.choices(FAMILIES, WEIGHTS)[0]
    payload, headers = family(rnd, copy.deepcopy(base_doc(rnd)))
    return family.__name__, RawTraceMessage(rnd.choice(["trace.a", "trace.b"]), headers, payload)


def check(converter: Converter, raw: RawTraceMessage) -> str:
    """The outcome label; raises on a crash or a broken result."""
    result = converter.convert(raw)
    if isinstance(result, Converted):
        if not result.spans:
            raise AssertionError("converted without spans")
        to_protobuf_bytes(result.spans)
        json.loads(to_otlp_json_line(result.spans))
        return "ok"
    if result.reason not in REASONS or not result.detail:
        raise AssertionError(f"rejection without a known reason: {result!r:.300}")
    return result.reason


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=120_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--slow", type=float, default=2.0, help="seconds for one case that count as a hang")
    parser.add_argument("--json", type=Path, help="write the result here")
    args = parser.parse_args(argv)
    rnd = random.Random(args.seed)
    converter = Converter(limits=LIMITS)
    outcomes: Counter[str] = Counter()
    by_family: Counter[tuple[str, str]] = Counter()
    crashes: list[str] = []
    slowest = (0.0, "", "")
    started = time.perf_counter()
    for i in range(args.count):
        family, raw = generate(rnd)
        t0 = time.perf_counter()
        try:
            outcome = check(converter, raw)
        except Exception as exc:  # noqa: BLE001 - a crash is what we are looking for
            outcome = "CRASH"
            crashes.append(f"case {i} ({family}): {type(exc).__name__}: {exc!s:.300} payload={raw.payload[:200]!r}")
        took = time.perf_counter() - t0
        if took > slowest[0]:
            slowest = (took, family, f"case {i}, {len(raw.payload)} bytes, {raw.headers}, -> {outcome}"[:300])
        outcomes[outcome] += 1
        by_family[(family, outcome)] += 1
    elapsed = time.perf_counter() - started
    print(f"{args.count} payloads in {elapsed:.1f}s ({args.count / elapsed:.0f}/s), seed {args.seed}")
    print("\noutcome                count")
    for name, n in outcomes.most_common():
        print(f"{name:<20} {n:>7}")
    print("\nfamily            outcomes")
    for family in FAMILIES:
        row = {o: n for (f, o), n in sorted(by_family.items()) if f == family.__name__}
        print(f"{family.__name__:<17} {row}")
    print(f"\nslowest case: {slowest[0] * 1000:.1f} ms ({slowest[1]}: {slowest[2]})")
    for line in crashes[:20]:
        print("CRASH", line)
    if args.json:
        args.json.write_text(json.dumps({
            "count": args.count, "seed": args.seed, "seconds": round(elapsed, 2), "outcomes": dict(outcomes),
            "by_family": {f"{f}/{o}": n for (f, o), n in sorted(by_family.items())},
            "slowest_ms": round(slowest[0] * 1000, 2), "slowest_case": f"{slowest[1]}: {slowest[2]}",
            "crashes": crashes[:100]}, indent=2))
    return 1 if crashes or slowest[0] > args.slow else 0


if __name__ == "__main__":
    sys.exit(main())
