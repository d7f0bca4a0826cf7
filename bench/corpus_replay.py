"""Replicate the shipped real corpus with fresh trace ids: load for the benchmarks.

Each copy of a traced message gets a new trace id (the same for all servers of that
message, so hop links stay intact); compressed messages stay compressed, or every message is
compressed with one encoding (`encoding`: what a trace that asks for it, `Accept-Encoding`,
gets from the servers). `variant` changes every message alike on every hop: "header", each
carries a header of its application's own (`Nats-Msg-Id`: its shape is then a digest,
`shapes.shape_digest`); "adhoc", each is traced ad hoc (its traceparent replaced by a
`Nats-Trace-Dest`: one trace destination, so one crowded link key).
"""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path

import cramjam

from nats_otel.core.decode import DecodeLimits, RawTraceMessage, decompress, parse_archive_line

CORPUS = Path(__file__).resolve().parent.parent / "tests" / "data" / "corpus"


def corpus_raws() -> list[RawTraceMessage]:
    """The shipped corpus's trace messages; a clear error where there are none (a copy of
    `bench/` outside the checkout finds no `tests/data/corpus`: `replicate` would loop)."""
    raws = [
        parse_archive_line(line)
        for path in sorted(CORPUS.glob("*.jsonl"))
        for line in path.read_bytes().splitlines()
        if line.strip()
    ]
    if not raws:
        raise SystemExit(f"no trace messages in {CORPUS}/*.jsonl: run the benchmarks from a checkout")
    return raws


def _recompress(data: bytes, encoding: str | None) -> bytes:
    if encoding == "gzip":
        return gzip.compress(data, compresslevel=1)
    if encoding == "snappy":
        return bytes(cramjam.snappy.compress(data))
    return data


def _with_variant(text: bytes, variant: str | None) -> bytes:
    """The trace message's JSON with its traced message's headers changed as `variant` says."""
    if variant is None:
        return text
    doc = json.loads(text)
    headers = doc.setdefault("request", {}).get("header") or {}
    if variant == "header":
        headers["Nats-Msg-Id"] = ["order-20261129-000042"]
    elif variant == "adhoc":
        headers = {name: values for name, values in headers.items() if name.lower() != "traceparent"}
        headers["Nats-Trace-Dest"] = ["trace.adhoc"]
    else:
        raise ValueError(f"unknown variant {variant!r}")
    doc["request"]["header"] = headers
    return json.dumps(doc, separators=(",", ":")).encode()


def replicate(count: int, seed: str = "bench", encoding: str | None = None,
              variant: str | None = None) -> list[RawTraceMessage]:
    """`count` trace messages: the corpus over and over, each copy with fresh trace ids;
    with `encoding` ("gzip", "snappy"), every one compressed so."""
    base = corpus_raws()
    plain = []
    for raw in base:
        original = raw.header("Content-Encoding")
        text = _with_variant(decompress(raw.payload, original, DecodeLimits()), variant)
        if encoding is None:
            plain.append((raw, original, text))
        else:
            headers = {k: v for k, v in raw.headers.items() if k.lower() != "content-encoding"}
            plain.append((RawTraceMessage(raw.subject, {**headers, "Content-Encoding": [encoding]}, raw.payload),
                          encoding, text))
    out: list[RawTraceMessage] = []
    copy = 0
    while len(out) < count:
        for raw, compressed_with, text in plain:
            if len(out) >= count:
                break
            # Trace ids are 32 hex chars after "00-"; swap each for a per-copy one.
            payload = text
            start = payload.find(b'"00-')
            if start >= 0:
                old = payload[start + 4 : start + 36]
                new = hashlib.blake2b(old + f"{seed}{copy}".encode(), digest_size=16).hexdigest().encode()
                payload = payload.replace(old, new)
            out.append(RawTraceMessage(raw.subject, raw.headers, _recompress(payload, compressed_with)))
        copy += 1
    return out
