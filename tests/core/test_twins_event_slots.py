"""A record's events as the kernel holds them (`_stage_record.pxi`: a slot each, its time and
its shape): the reports of one connection share the shape the parse kept for the members
after the event's `ts`, each keeping its own time, and every event made from a slot is the
reference's; a kept shape holds only what follows the time (an event with a member before
its `ts` does not lend it to the next one); a message of more events than the record holds
in itself converts as the reference converts it; a hand-made message whose events the
kernel cannot read at their slots is read by name, as the reference reads it.
"""

from __future__ import annotations

import json

import pytest
from msgspec.structs import force_setattr

from nats_otel.core import network, pipeline
from nats_otel.core.decode import RawTraceMessage
from nats_otel.core.mapping import MappingOptions
from nats_otel.core.model import Egress, Ingress, ServerInfo, TraceMessage
from tests.core import factories as f
from tests.core.test_twins_parse import msgspec_view, same_or_declined


def _doc(*events: dict) -> bytes:
    return json.dumps(f.message(*events), separators=(",", ":")).encode()


def _converted(converter, raws):
    """Each raw's spans (bytes) and link, as `converter` converts the batch."""
    results = converter.convert_many(raws, 0.0, True, converter.observe_held(raws, 0.0))
    return [(r.encoded.data, r.link) if isinstance(r, pipeline.Converted) else r for r in results]


def test_one_connections_events_share_their_shape_and_keep_their_own_times(kernel):
    kernel.forget_kept()
    raws = [f.raw(_doc(f.ingress(t=100 + i, name="pub-orders", subj="orders.eu.new"),
                       f.egress(t=300 + 7 * i, kind=1, name="route-east", hop="1")))
            for i in range(6)]
    records = kernel.Converter().observe_held(raws, 0.0)
    assert all(type(r) is not tuple for r in records)
    # The first report's shapes are kept; from the second on, every report holds those very ones.
    for record in records[1:]:
        assert [s is k for s, k in zip(record.shapes(), records[1].shapes(), strict=True)] == [True, True]
    # Each its own time, and each event made of a slot the reference's.
    for raw, record in zip(raws, records, strict=True):
        expected = pipeline.python_prepare(raw).msg
        assert (record.ingress, record.events) == (expected.ingress, expected.events)
        assert record.message() == expected
    assert len({r.ingress.ts_ns for r in records}) == len({r.events[0].ts_ns for r in records}) == 6
    # What the parse hands on: a shape and a time an event.
    shapes = kernel.event_shapes(raws[3].payload)
    assert [t for _, t in shapes] == [records[3].ingress.ts_ns, records[3].events[0].ts_ns]
    assert [s for s, _ in shapes] == list(records[3].shapes())
    # The spans are the reference's.
    assert _converted(kernel.Converter(), raws) == _converted(pipeline.PythonConverter(), raws)


def test_a_kept_shape_holds_only_what_follows_the_time(kernel):
    """A member before an event's `ts` is that event's alone: its shape is not kept for the
    members after the time, so a later event with the same members after its `ts` and none
    before does not take it (and in the other order, the kept shape lends its members, not
    the later event's own)."""
    rest = {"kind": 0, "cid": 7, "acc": "A", "sub": "orders.>", "queue": "workers-of-the-east"}
    early = {"type": "eg", "name": "early", "ts": f.ts(201), **rest}
    plain = {"type": "eg", "ts": f.ts(202), **rest}
    for order in ((early, plain, plain), (plain, early, plain, early)):
        kernel.forget_kept()
        before = kernel.kept_hits()["rest"]
        for event in order:
            data = _doc(f.ingress(), event)
            assert same_or_declined(kernel, data)
            assert kernel.own_parse(data)[1][1].name == ("early" if "name" in event else "")
        assert kernel.kept_hits()["rest"] > before  # the plain one's members were kept and taken
    assert msgspec_view(_doc(f.ingress(), plain))[1][1].name == ""


def test_a_message_of_more_events_than_the_record_holds_in_itself(kernel):
    # Fourteen events (the record holds three in itself, more in memory of its own), from a
    # parse and from msgspec (an escape makes the parse decline).
    egresses = [f.egress(t=200 + i, kind=1 if i % 2 else 0, name=f"peer-{i}", hop=f"{i}") for i in range(13)]
    plain = _doc(f.ingress(), *egresses)
    escaped = plain.replace(b'"name":"peer-3"', b'"name":"peer-\\u0033"', 1)
    assert escaped != plain
    raws = [RawTraceMessage("trace.a", {}, plain), RawTraceMessage("trace.a", {}, escaped)]
    records = kernel.Converter().observe_held(raws, 0.0)
    for raw, record in zip(raws, records, strict=True):
        assert len(record.shapes()) == 14
        assert record.message() == pipeline.python_prepare(raw).msg
    assert _converted(kernel.Converter(), raws) == _converted(pipeline.PythonConverter(), raws)


def _hand_made(ts_ns: object) -> pipeline.Prepared:
    """A `Prepared` of a hand-made message whose egress's time is `ts_ns` (decode always
    gives a uint64; a hand-made event can hold anything)."""
    egress = Egress(ts=f.ts(200), kind=1, name="route-east", hop="1")
    force_setattr(egress, "ts_ns", ts_ns)
    ingress = Ingress(ts=f.ts(100), kind=0, name="pub", account="A", subject="orders.new")
    msg = TraceMessage(ServerInfo(name="s1", id="ID-s1"), {"traceparent": [f.TRACEPARENT]}, 100, 0, ingress,
                       (egress,))
    raw = f.raw(_doc(f.ingress()))
    real = pipeline.python_prepare(raw)
    return pipeline.Prepared(raw, msg, real.ctx, real.ident, None, (), real.size)


def test_a_hand_made_message_is_read_by_name_as_the_reference_reads_it(kernel):
    for ts_ns in (123, "late", -5, 2**70):
        prepared = _hand_made(ts_ns)
        ours, theirs = kernel.Linker(bounded=False), pipeline.PythonLinker(bounded=False)
        ours.observe(prepared)
        theirs.observe(prepared)
        # the egress's time as the reference keeps it (whatever it is), not read as a slot's
        held = ours.index.held()
        assert held == theirs.index.held()
        assert [egress.ts_ns for _, egresses, _ in held for egress in egresses] == [ts_ns]
        # converted (made a record at the door) and sampled: the reference's outcome
        assert outcome(_finished, kernel.finish, kernel.Linker(bounded=False), prepared) == outcome(
            _finished, pipeline.finish, pipeline.PythonLinker(bounded=False), prepared)
        assert outcome(kernel.network_sample, prepared.msg, None) == outcome(
            network.python_network_sample, prepared.msg, None)


def outcome(call, *args):
    """What `call(*args)` returns, or the type and words of what it raises."""
    try:
        return call(*args)
    except Exception as exc:  # noqa: BLE001 - compared, not hidden
        return type(exc), str(exc)


def _finished(finish, linker, prepared):
    linker.observe(prepared)
    result = finish(prepared, linker, MappingOptions(), True)
    return result.encoded.data, result.link, result.issues


def test_a_record_made_empty_from_python_is_refused_not_read(kernel):
    """A `MessageRecord()` made from Python has no event slot to read: the linker's and the
    convert stage's door refuses it, the mapper and the network sample hand it to the
    reference, which raises as for a message without an ingress (no slot read: it crashed)."""
    record = kernel.MessageRecord()
    for door in (lambda: kernel.Linker().observe(record), lambda: kernel.Linker().locate(record),
                 lambda: kernel.finish(record, kernel.Linker(), MappingOptions(), True)):
        with pytest.raises(TypeError, match="empty MessageRecord"):
            door()
    with pytest.raises(AttributeError):
        kernel.network_sample(record, None)
    with pytest.raises(AttributeError):
        kernel.map_encode(record, record, None, MappingOptions())
