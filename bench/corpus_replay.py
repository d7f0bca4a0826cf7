"""Replicate the shipped real corpus with fresh trace ids: load for the benchmarks.

Each copy of a traced message gets a new trace id (the same for all servers of that
message, so hop links stay intact); compressed messages stay compressed, or every message is
compressed with one encoding (`encoding`: what a trace that asks for it, `Accept-Encoding`,
gets from the servers).
"""

from __future__ import annotations

import gzip
import hashlib
from pathlib import Path

import cramjam

from nats_otel.core.decode import DecodeLimits, RawTraceMessage, decompress, parse_archive_line

CORPUS = Path(__file__).resolve().parent.parent / "tests" / "data" / "corpus"


def corpus_raws() -> list[RawTraceMessage]:
    return [
        parse_archive_line(line)
        for path in sorted(CORPUS.glob("*.jsonl"))
        for line in path.read_bytes().splitlines()
        if line.strip()
    ]


def _recompress(data: bytes, encoding: str | None) -> bytes:
    if encoding == "gzip":
        return gzip.compress(data, compresslevel=1)
    if encoding == "snappy":
        return bytes(cramjam.snappy.compress(data))
    return data


def replicate(count: int, seed: str = "bench", encoding: str | None = None) -> list[RawTraceMessage]:
    """`count` trace messages: the corpus over and over, each copy with fresh trace ids;
    with `encoding` ("gzip", "snappy"), every one compressed so."""
    base = corpus_raws()
    plain = []
    for raw in base:
        original = raw.header("Content-Encoding")
        text = decompress(raw.payload, original, DecodeLimits())
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
