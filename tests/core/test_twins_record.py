"""The kernel's own record of an observed message (`_stage_record.pxi`: `MessageRecord`, the
kernel's converter's entry) against the reference's `Prepared`: read as a `Prepared` is
(message, context, identity, arrival, issues, size, egresses), as its message and its
context are (their fields), and made into them, it is the
reference's of the same message, on the corpus and on the messages whose context is not a
plain traceparent (ad hoc, broken, correlated); a `Prepared` given to the kernel (`finish`,
`Linker.observe`, `locate`) is made a record at the door and converts as the record the
kernel's own converter made; and the entries' decoded forms (`observed_entries`,
`observed`) give the hop evidence the reference's give.
"""

from __future__ import annotations

import pytest

from nats_otel.core import evidence, pipeline
from nats_otel.core.decode import DecodeError, RawTraceMessage
from nats_otel.core.mapping import MappingOptions
from tests.core import factories as f


def _unusual() -> list[RawTraceMessage]:
    """Messages whose context is not a plain traceparent, forwarded (an arrival) or not."""
    contexts = ({"Nats-Trace-Dest": ["trace.x"]}, {"traceparent": ["00-bad"], "Nats-Trace-Dest": ["trace.x"]},
                {"traceparent": [f.TRACEPARENT], "tracestate": ["k=v"]},
                {"traceparent": [f"00-{f.TRACE_ID}-{f.PARENT_ID}-00"]})
    raws = []
    for headers in contexts:
        for subject in ("trace.a", ""):
            arriving = f.message(f.ingress(kind=1, name="east-2"), f.egress(kind=1, name="leaf-1", hop="h.2"),
                                 headers={**headers, "Nats-Trace-Hop": ["h.1"]})
            raws += [f.raw(f.message(f.ingress(), f.egress(), headers=headers), subject=subject),
                     f.raw(arriving, subject=subject)]
    return raws


def _records(kernel, raws):
    """The kernel's converter's entries of `raws` (records, or tuples for what gave none)."""
    return kernel.Converter().observe_held(raws, 0.0)


def test_a_record_reads_and_makes_the_references_prepared(kernel, corpus_raws):
    raws = [*corpus_raws, *_unusual()]
    records = 0
    for raw, entry in zip(raws, _records(kernel, raws), strict=True):
        expected = pipeline.python_prepare(raw) if type(entry) is not tuple else None
        if expected is None:  # it gave none: the reference refuses it too
            with pytest.raises(DecodeError):
                pipeline.python_prepare(raw)
            continue
        records += 1
        assert pipeline.entry_raw(entry) is raw
        assert entry.prepared() == expected and entry.context() == expected.ctx == entry.ctx
        assert (entry.msg, entry.ident, entry.arrival, entry.issues, entry.size) == (
            expected.msg, expected.ident, expected.arrival, expected.issues, expected.size)
        msg = expected.msg
        assert (entry.server, entry.headers, entry.msg_size, entry.hops, entry.ingress, entry.events,
                entry.unknown_events, entry.seq) == (msg.server, msg.headers, msg.msg_size, msg.hops, msg.ingress,
                                                     msg.events, msg.unknown_events, msg.seq)
        assert entry.message() == msg
        ctx = expected.ctx
        assert (entry.id_fields, entry.trace_state, entry.sampled, entry.adhoc_key) == (
            ctx.id_fields, ctx.trace_state, ctx.sampled, ctx.adhoc_key)
        assert entry.egresses() == expected.egresses()
    assert records > 100


def test_unusual_contexts_reach_the_record_as_the_reference_makes_them(kernel):
    raws = _unusual()
    entries = _records(kernel, raws)
    assert all(type(entry) is not tuple for entry in entries)  # every one decoded
    assert {entry.adhoc_key is not None for entry in entries} == {True, False}
    assert {entry.arrival is not None for entry in entries} == {True, False}
    assert {entry.sampled for entry in entries} == {True, False}
    assert any(entry.issues == pipeline._BAD_TRACEPARENT for entry in entries)
    assert [entry.prepared() for entry in entries] == [pipeline.python_prepare(raw) for raw in raws]


def test_a_prepared_given_to_the_kernel_converts_as_its_record(kernel, corpus_raws):
    """`finish`, `Linker.observe` and `locate` given the reference's `Prepared` (made a record at
    the door) place and map each message as the kernel's converter does with its records."""
    raws = list(corpus_raws)
    converter = kernel.Converter()
    expected = converter.convert_many(raws, 0.0, True, converter.observe_held(raws, 0.0))
    linker = kernel.Linker(bounded=False)
    prepared = []
    for raw in raws:
        try:
            prepared.append(pipeline.python_prepare(raw))
        except DecodeError:
            prepared.append(None)
    for p in prepared:
        if p is not None:
            linker.observe(p)
    results = [kernel.finish(p, linker, MappingOptions(), True) for p in prepared if p is not None]
    converted = [r for r in expected if isinstance(r, pipeline.Converted)]
    assert len(results) == len(converted) > 100
    assert [r.encoded.data for r in results] == [r.encoded.data for r in converted]
    assert [r.link for r in results] == [r.link for r in converted]
    assert sum(r.link == "matched" for r in results) > 50


@pytest.mark.parametrize("twin", ["reference", "kernel"])
def test_the_entries_decoded_forms_give_the_references_evidence(kernel, corpus_raws, twin):
    raws = [*corpus_raws[:200], *_unusual()]
    reference = pipeline.PythonConverter()
    expected = [(at, evidence.evidence_of(p)) for at, p in pipeline.observed_entries(reference.observe_held(raws))]
    converter = pipeline.PythonConverter() if twin == "reference" else kernel.Converter()
    entries = converter.observe_held(raws)
    forms = (pipeline.observed_entries if twin == "reference" else kernel.observed_entries)(entries)
    assert [(at, evidence.evidence_of(p)) for at, p in forms] == expected
    assert len(expected) > 100
    # kept by the converter instead: `observed` finds the same forms
    converter.adopt(entries)
    observed = pipeline.observed if twin == "reference" else kernel.observed
    assert [evidence.evidence_of(p) for p in observed(converter, raws)] == [e for _, e in expected]


def test_a_records_egress_ids_can_be_replaced_only_in_a_copy(kernel, corpus_raws):
    record = next(e for e in _records(kernel, corpus_raws) if type(e) is not tuple and e.egress_ids)
    copy = kernel.with_egress_ids(record, b"\xaa" * 8)
    assert copy.egress_ids == b"\xaa" * 8 and record.egress_ids != copy.egress_ids
    assert copy.prepared() == record.prepared()
    with pytest.raises(AttributeError):
        record.egress_ids = None
