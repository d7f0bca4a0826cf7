"""Which worker process a message goes to (`batch.workers` > 1): every report of one trace
to the same one, found without decoding the message (the parent's share of the work is what
limits `--workers`); and which worker records the evidence another bridge observed."""

from __future__ import annotations

import re
import zlib

from nats_otel.core.decode import DecodeError, DecodeLimits, RawTraceMessage, decompress
from nats_otel.core.engine import parse_traceparent
from nats_otel.core.evidence import HopEvidence

__all__ = ["evidence_shard", "shard_key", "shard_of"]

# nats-server writes the traced message's headers as `"<name>":["<value>",...]`; the name's
# case is the publisher's (2.14+).
_TRACEPARENT = re.compile(rb'"traceparent"\s*:\s*\[\s*"([^"]{1,128})"', re.IGNORECASE)


def shard_key(raw: RawTraceMessage, limits: DecodeLimits = DecodeLimits()) -> bytes:
    """What must reach one worker together: the trace id of a usable traceparent, else the
    arrival subject (ad-hoc traces are correlated by it, DESIGN §4). Never raises."""
    payload = raw.payload
    encoding = raw.header("Content-Encoding")
    if encoding and encoding.lower() != "identity":
        try:
            payload = decompress(payload, encoding, limits)
        except DecodeError:
            return (raw.subject or "").encode()
    # How nats-server writes it (Go's encoding/json: no spaces), with the name as publishers
    # almost always spell it: found without copying the payload in lower case. (Which
    # occurrence is used only has to be the same for every report of one message.)
    start = payload.find(b'"traceparent":["')
    if start >= 0:
        start += 16
        value: bytes | None = payload[start : payload.find(b'"', start)]
    else:
        lowered = payload.lower()
        start = lowered.find(b'"traceparent":["')
        if start >= 0:
            start += 16
            value = lowered[start : lowered.find(b'"', start)]
        else:
            match = _TRACEPARENT.search(lowered) if b"traceparent" in lowered else None
            value = match.group(1) if match is not None else None
    if value:
        try:
            trace_id, _, _ = parse_traceparent(value.decode("ascii", "replace"))
            return trace_id
        except DecodeError:
            pass
    return (raw.subject or "").encode()


def shard_of(raw: RawTraceMessage, workers: int) -> int:
    """The worker (0..workers-1) that handles `raw`."""
    return zlib.crc32(shard_key(raw)) % workers


def evidence_shard(report: HopEvidence, workers: int) -> int | None:
    """The worker whose link window holds the trace of a report another bridge observed:
    `shard_of` its trace message, by the trace id in the context's id fields (a 32-digit hex
    field, `ids._context_fields`). None for an ad-hoc trace, sharded by its arrival subject,
    which the evidence does not carry (every worker records those: rare, and bounded by
    each link window's capacity)."""
    fields = report.context
    if report.adhoc or fields[:4] != b"\x00\x00\x00\x20":
        return None
    try:
        trace_id = bytes.fromhex(fields[4:36].decode("ascii"))
    except ValueError:
        return None
    return zlib.crc32(trace_id) % workers
