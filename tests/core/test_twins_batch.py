"""A batch converted straight into its export request (`Converter.convert_encoded`): the
kernel's `EncodedBatch` (`_stage_batch.pxi`) against the reference (`results.EncodedBatch`,
which is `convert_many(..., encoded=True)`, `encode_results` and `tally_results` together):
the same request, span count, counts and, when indexed, results, and the same link index
afterwards. Random sequences of calls that include it: test_twins_pipeline.py (`_play`)."""

from __future__ import annotations

import re
from types import ModuleType

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from nats_otel.core import pipeline
from nats_otel.core.decode import RawTraceMessage
from nats_otel.core.linking import LinkSettings
from nats_otel.core.mapping import MappingOptions
from nats_otel.core.results import EncodedBatch
from tests.core.test_fuzz_decode import LIMITS
from tests.core.test_twins_linking import _index_state


def _with_odd_messages(corpus_raws: list[RawTraceMessage]) -> list[RawTraceMessage]:
    """The corpus with two undecodable messages among it (`Rejected`), a copy of one whose
    traced message has a header twice, in two cases (the kernel's mapper hands it whole to
    the reference), and a downstream report whose trace has no other (its hop unlinked: an
    issue)."""
    odd = next(raw for raw in corpus_raws if b'"header":{' in raw.payload)
    twice = RawTraceMessage(odd.subject, odd.headers, odd.payload.replace(
        b'"header":{', b'"header":{"Nats-Msg-Id":["a"],"nats-msg-id":["b"],', 1))
    return [*corpus_raws[:40], RawTraceMessage("trace.a", {}, b"{"), twice, *corpus_raws[40:],
            RawTraceMessage("trace.a", {"Content-Encoding": ["gzip"]}, b"not gzip"), _orphan(corpus_raws)]


def _orphan(corpus_raws: list[RawTraceMessage]) -> RawTraceMessage:
    """A downstream report of the corpus moved to a trace of its own: its upstream is missing."""
    for raw in corpus_raws:
        trace = re.search(rb'"traceparent":\["00-([0-9a-f]{32})', raw.payload)
        if trace is None:
            continue
        orphan = RawTraceMessage(raw.subject, raw.headers, raw.payload.replace(trace.group(1), b"5" * 32))
        alone = pipeline.PythonConverter().convert_encoded([orphan])
        if alone.links.get("unmatched"):
            return orphan
    raise AssertionError("no downstream report in the corpus")


def _converted(converter_type, raws: list[RawTraceMessage], size: int, fused: bool) -> tuple:
    """`raws` observed and converted `size` at a time (as the bridge does: the entries held
    and given back): each batch's `EncodedBatch` (`fused`), else `convert_many`'s results;
    and the link index afterwards."""
    converter = converter_type(MappingOptions(), LIMITS, LinkSettings())
    out = []
    for start in range(0, len(raws), size):
        batch = raws[start : start + size]
        entries = converter.observe_held(batch, 0.0)
        out.append(converter.convert_encoded(batch, 0.0, entries) if fused
                   else converter.convert_many(batch, 0.0, True, entries))
        assert not any(type(entry) is tuple for entry in entries)  # consumed as converted
    return out, _index_state(converter.linker.index)


@pytest.mark.parametrize("size", [1, 7, 64, 512])
def test_a_batch_converts_into_the_references_request(kernel: ModuleType, corpus_raws, size):
    raws = _with_odd_messages(corpus_raws)
    handed = kernel.handed_to_reference()["map"]
    ours, our_index = _converted(kernel.Converter, raws, size, True)
    assert kernel.handed_to_reference()["map"] > handed  # the message the mapper did not take was compared
    theirs, their_index = _converted(pipeline.PythonConverter, raws, size, True)
    # What the bridge did before: the kernel's results, then its request and its tally of them.
    before, _ = _converted(kernel.Converter, raws, size, False)
    assert our_index == their_index
    for batch, reference, results in zip(ours, theirs, before, strict=True):
        assert type(batch) is kernel.EncodedBatch and type(reference) is EncodedBatch
        assert (batch.request, batch.spans) == (reference.request, reference.spans) == kernel.encode_results(results)
        assert ((batch.decoded, batch.links, batch.issues, batch.samples)
                == (reference.decoded, reference.links, reference.issues, reference.samples)
                == kernel.tally_results(results))
        assert len(batch) == len(reference) == len(results)
        assert batch.rejected == reference.rejected == [r for r in results if isinstance(r, pipeline.Rejected)]
        assert list(batch) == list(reference) == results
        assert [batch[at] for at in range(-len(batch), len(batch))] == [*results, *results]
        assert batch[1:3] == results[1:3]
    assert sum(b.spans for b in ours) == sum(r.span_count for b in before for r in b
                                             if isinstance(r, pipeline.Converted))
    assert sum(1 for b in ours for r in b if isinstance(r, pipeline.Rejected)) == 2
    assert any(b.links.get("unmatched") for b in ours)
    assert any(b.links.get("matched") for b in ours) and any(b.issues for b in ours)


def test_the_request_groups_the_spans_by_server(kernel: ModuleType, corpus_raws):
    """Several servers' reports in one batch: one ResourceSpans each, in the order their
    servers first appear, each message's spans in order (`encode_request`'s grouping)."""
    (batch,), _ = _converted(kernel.Converter, corpus_raws, len(corpus_raws), True)
    request = ExportTraceServiceRequest.FromString(batch.request)
    servers = [next(a.value.string_value for a in group.resource.attributes if a.key == "service.instance.id")
               for group in request.resource_spans]
    assert len(servers) > 2 and len(set(servers)) == len(servers)
    assert sum(len(group.scope_spans[0].spans) for group in request.resource_spans) == batch.spans
    # Each message's spans, sliced from the request when its result is made, in its group.
    for result in batch:
        if isinstance(result, pipeline.Converted):
            assert result.encoded.data in batch.request
            assert result.encoded.span_count == len(ExportTraceServiceRequest.FromString(
                kernel.encode_request([result.encoded])).resource_spans[0].scope_spans[0].spans)


@pytest.mark.parametrize("twin", ["reference", "kernel"])
def test_batches_of_nothing_or_only_rejections_make_no_request(kernel: ModuleType, twin):
    converter = (pipeline.PythonConverter if twin == "reference" else kernel.Converter)()
    empty = converter.convert_encoded([], 0.0, converter.observe_held([], 0.0))
    assert (empty.request, empty.spans, empty.decoded, empty.links, empty.issues, empty.samples, len(empty)) == (
        b"", 0, 0, {}, [], [], 0)
    bad = [RawTraceMessage("trace.a", {}, b"{"), RawTraceMessage("trace.b", {}, b"[]")]
    rejected = converter.convert_encoded(bad, 0.0, converter.observe_held(bad, 0.0))
    assert (rejected.request, rejected.spans, rejected.decoded, len(rejected)) == (b"", 0, 0, 2)
    assert [r.subject for r in rejected] == [r.subject for r in rejected.rejected] == ["trace.a", "trace.b"]


def test_a_batch_not_observed_or_observed_by_the_converter_converts_alike(kernel: ModuleType, corpus_raws):
    """Without the entries: each message as `convert_many` finds it (kept by `observe_many`,
    or never observed: prepared then)."""
    raws = _with_odd_messages(corpus_raws)
    values = []
    for converter_type in (kernel.Converter, pipeline.PythonConverter):
        converter = converter_type(MappingOptions(), LIMITS, LinkSettings())
        converter.observe_many(raws[: len(raws) // 2], 0.0)
        batch = converter.convert_encoded(raws, 0.001)
        values.append((batch.request, batch.spans, batch.decoded, batch.links, batch.issues, batch.samples,
                       batch.rejected, list(batch), len(converter._pending), _index_state(converter.linker.index)))
    assert values[0] == values[1]
    assert values[0][1] > 0 and values[0][6] and values[0][8] == 0


class _Reentrant:
    """A linker of another type that, each time it places a message, has another converter
    convert a batch: the kernel's batch buffers are in use then, and that batch takes its own."""

    def __init__(self, inner, side) -> None:
        self.inner, self.index, self.side, self.done = inner, inner.index, side, []

    def observe(self, prepared, now=0.0):
        return self.inner.observe(prepared, now)

    def locate(self, prepared):
        self.done.append(self.side())
        return self.inner.locate(prepared)


def test_a_batch_converted_while_another_is_converts_alike(kernel: ModuleType, corpus_raws):
    raws, others = corpus_raws[:30], corpus_raws[30:60]

    def side_batch() -> bytes:
        side = kernel.Converter()
        return side.convert_encoded(others, 0.0, side.observe_held(others, 0.0)).request

    converter = kernel.Converter()
    converter.linker = reentrant = _Reentrant(kernel.Linker(LinkSettings()), side_batch)
    batch = converter.convert_encoded(raws, 0.0, converter.observe_held(raws, 0.0))
    reference = pipeline.PythonConverter()
    expected = reference.convert_encoded(raws, 0.0, reference.observe_held(raws, 0.0))
    alone = pipeline.PythonConverter()
    assert len(reentrant.done) == len(raws)
    assert set(reentrant.done) == {alone.convert_encoded(others, 0.0, alone.observe_held(others, 0.0)).request}
    assert (batch.request, batch.spans, batch.links, batch.samples, list(batch)) == (
        expected.request, expected.spans, expected.links, expected.samples, list(expected))
