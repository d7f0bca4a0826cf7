"""Benchmark: this project's convert path against the naive OTel SDK path, in one run.

    python bench/convert_throughput.py [--messages 200000] [--rounds 3] [--tune-gc]

Both paths start from the same raw trace messages (the real corpus replicated with fresh
trace ids) and end with serialized OTLP protobuf export requests of 512 spans:
- ours:  the bridge's OTLP path: decode -> link -> map straight into protobuf
         (`Converter.convert(encoded=True)`, the compiled core when built) -> one request
         per 512 spans (`span_bytes.encode_request`). A checkout without that path (a
         baseline of `bench/core_ab.py`) runs its SpanRecord path + `to_protobuf_bytes`.
- naive: the same decode and mapping to SpanRecords -> SDK ReadableSpan -> the SDK
         exporter's encode_spans -> SerializeToString.
Rounds alternate between the two so machine noise hits both; the best round counts.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _core_api import hot_path
from corpus_replay import replicate
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource as SdkResource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from nats_otel.core.encode import to_protobuf_bytes
from nats_otel.core.pipeline import Converted

BATCH = 512
_KINDS = {1: SpanKind.INTERNAL, 2: SpanKind.SERVER, 3: SpanKind.CLIENT, 4: SpanKind.PRODUCER, 5: SpanKind.CONSUMER}
_SCOPE = InstrumentationScope("nats-otel", "0.1.0")


def ours(raws) -> tuple[int, int]:
    core = hot_path()
    if not hasattr(core, "encode_request"):  # an older checkout: span records, then the encoder
        return ours_records(raws)
    encode_request = core.encode_request
    converter = core.Converter()
    batch, count, spans_total, bytes_total = [], 0, 0, 0
    for raw in raws:
        result = converter.convert(raw, encoded=True)
        if isinstance(result, Converted) and result.encoded is not None:
            batch.append(result.encoded)
            count += result.encoded.span_count
            if count >= BATCH:
                bytes_total += len(encode_request(batch))
                spans_total += count
                batch, count = [], 0
    if batch:
        bytes_total += len(encode_request(batch))
        spans_total += count
    return spans_total, bytes_total


def ours_records(raws) -> tuple[int, int]:
    """Span records, then one request per 512 spans (`to_protobuf_bytes`)."""
    converter = hot_path().Converter()
    batch, spans_total, bytes_total = [], 0, 0
    for raw in raws:
        result = converter.convert(raw)
        if isinstance(result, Converted):
            batch.extend(result.spans)
            if len(batch) >= BATCH:
                bytes_total += len(to_protobuf_bytes(batch))
                spans_total += len(batch)
                batch = []
    if batch:
        bytes_total += len(to_protobuf_bytes(batch))
        spans_total += len(batch)
    return spans_total, bytes_total


def _readable(span, resources) -> ReadableSpan:
    resource = resources.get(span.resource)
    if resource is None:
        resource = resources[span.resource] = SdkResource(dict(span.resource.attributes))
    trace_id = int.from_bytes(span.trace_id, "big")
    context = SpanContext(trace_id, int.from_bytes(span.span_id, "big"), True, TraceFlags(1))
    parent = (
        SpanContext(trace_id, int.from_bytes(span.parent_span_id, "big"), True, TraceFlags(1))
        if span.parent_span_id
        else None
    )
    status = Status(StatusCode.ERROR, span.status_message) if span.status_code == 2 else Status(StatusCode.UNSET)
    return ReadableSpan(
        name=span.name,
        context=context,
        parent=parent,
        resource=resource,
        attributes=dict(span.attributes),
        kind=_KINDS[span.kind],
        status=status,
        start_time=span.start_ns,
        end_time=span.end_ns,
        instrumentation_scope=_SCOPE,
    )


def naive(raws) -> tuple[int, int]:
    converter = hot_path().Converter()
    resources: dict = {}
    batch, spans_total, bytes_total = [], 0, 0
    for raw in raws:
        result = converter.convert(raw)
        if isinstance(result, Converted):
            batch.extend(_readable(span, resources) for span in result.spans)
            if len(batch) >= BATCH:
                bytes_total += len(encode_spans(batch).SerializeToString())
                spans_total += len(batch)
                batch = []
    if batch:
        bytes_total += len(encode_spans(batch).SerializeToString())
        spans_total += len(batch)
    return spans_total, bytes_total


def encode_stage(spans, naive_path: bool) -> float:
    """Seconds to turn ready span records into serialized requests: the stage that differs."""
    resources: dict = {}
    started = time.perf_counter()
    for start in range(0, len(spans), BATCH):
        batch = spans[start : start + BATCH]
        if naive_path:
            encode_spans([_readable(span, resources) for span in batch]).SerializeToString()
        else:
            to_protobuf_bytes(batch)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tune-gc", action="store_true",
                        help="apply the GC settings `nats-otel convert` and the bridge use, for both paths")
    args = parser.parse_args()
    if args.tune_gc:
        from nats_otel.gc_tuning import tune_gc_for_throughput

        tune_gc_for_throughput()
    print(f"preparing {args.messages} trace messages (corpus replicated with fresh ids)...", flush=True)
    raws = replicate(args.messages)
    best = {"ours": 0.0, "naive": 0.0}
    spans = {}
    for round_number in range(1, args.rounds + 1):
        for name, path in (("ours", ours), ("naive", naive)):
            gc.collect()
            started = time.perf_counter()
            spans[name], size = path(raws)
            elapsed = time.perf_counter() - started
            rate = len(raws) / elapsed
            best[name] = max(best[name], rate)
            print(f"round {round_number} {name:5}: {rate:10,.0f} msgs/s  {spans[name] / elapsed:10,.0f} spans/s  "
                  f"({size:,} bytes)", flush=True)
    assert spans["ours"] == spans["naive"], "both paths must produce the same number of spans"
    converter = hot_path().Converter()
    records = [s for raw in raws for s in converter.convert(raw).spans]
    encode_best = {"ours": float("inf"), "naive": float("inf")}
    for _ in range(args.rounds):
        for name in ("ours", "naive"):
            gc.collect()
            encode_best[name] = min(encode_best[name], encode_stage(records, name == "naive"))
    print(f"\nencode stage only ({len(records):,} spans): ours {len(records) / encode_best['ours']:,.0f} spans/s, "
          f"naive {len(records) / encode_best['naive']:,.0f} spans/s, "
          f"ratio {encode_best['naive'] / encode_best['ours']:.2f}x")
    print(f"\nbest ours : {best['ours']:10,.0f} trace messages/s")
    print(f"best naive: {best['naive']:10,.0f} trace messages/s")
    print(f"ratio ours/naive: {best['ours'] / best['naive']:.2f}x  (target >= 10x, issue 17)")


if __name__ == "__main__":
    main()
