"""The processor's observed batches (`observed_batches.ObservedBatches`): the entries of each
observed batch held by its first message and given back whole on convert, with the same
results as the converter's own store (`observe_many` / `convert_many`); what is not
converted as observed (a split, a reordering, the bound) goes back to the converter, which
then finds each message's entry: nothing observed twice, nothing held past the bound. With
each implementation of the core (`core` fixture), and through a real `Processor`."""

from __future__ import annotations

import time
from types import ModuleType

from nats_otel.bridge.loop import Bridge
from nats_otel.bridge.observed_batches import PAST_THE_BOUND, RELEASED, ObservedBatches
from nats_otel.bridge.processor import Processor
from nats_otel.bridge.settings import load_settings
from nats_otel.core.decode import RawTraceMessage
from nats_otel.core.pipeline import Converted, entry_raw
from tests.core.test_twins_linking import _index_state

# A processor's settings that export to no backend (its spans written to /dev/null).
_NO_BACKEND = {"sources": [{"subjects": ["trace.a"]}], "output": "/dev/null", "export_otlp": False}


def _batches(raws: list[RawTraceMessage], size: int) -> list[list[RawTraceMessage]]:
    return [raws[at:at + size] for at in range(0, len(raws), size)]


def _by_the_store(core: ModuleType, batches: list[list[RawTraceMessage]], converts: list[list[RawTraceMessage]]):
    """The reference sequence: the converter's own store (observe_many / convert_many)."""
    converter = core.Converter()
    for batch in batches:
        converter.observe_many(batch, 0.0)
    results = [r for raws in converts for r in converter.convert_many(raws, 0.01, True)]
    return results, _index_state(converter.linker.index)


def test_whole_batches_in_order_convert_as_the_converters_store_does(core, corpus_raws):
    raws = list(corpus_raws[:300])
    batches = _batches(raws, 37)
    converts = [batches[0] + batches[1], *batches[2:]]  # the ripening joins whole batches
    converter = core.Converter()
    held = ObservedBatches(converter, 10_000)
    for batch in batches:
        held.put(converter.observe_held(batch, 0.0))
    assert held.messages == len(raws) and not converter._pending
    assert held.peek(batches[3]) is not None and held.peek(batches[3][1:]) is None
    results = []
    for part in converts:
        entries = held.take(part)
        assert entries is not None and [entry_raw(e) for e in entries] == part
        results += converter.convert_many(part, 0.01, True, entries)
    assert held.messages == 0 and not converter._pending
    assert (results, _index_state(converter.linker.index)) == _by_the_store(core, batches, converts)


def test_what_is_not_converted_as_observed_goes_back_to_the_converter(core, corpus_raws):
    raws = list(corpus_raws[:200])
    batches = _batches(raws, 50)
    # A split batch, then the rest in another order: the converter finds each message.
    converts = [batches[0][:20], batches[2], batches[0][20:] + batches[1], batches[3][::-1]]
    converter = core.Converter()
    held = ObservedBatches(converter, 10_000)
    for batch in batches:
        held.put(converter.observe_held(batch, 0.0))
    assert held.take(converts[0]) is None
    assert held.messages == 0 and len(converter._pending) == len(raws)  # every entry handed back, once
    results = [r for part in converts for r in converter.convert_many(part, 0.01, True, held.take(part))]
    assert not converter._pending
    assert (results, _index_state(converter.linker.index)) == _by_the_store(core, batches, converts)


def test_the_bound_hands_the_oldest_batches_to_the_converter(core, corpus_raws):
    batches = _batches(list(corpus_raws[:40]), 8)
    converter = core.Converter(pending_capacity=12)
    held = ObservedBatches(converter, 20)
    for batch in batches:
        held.put(converter.observe_held(batch, 0.0))
    assert held.messages == 16  # the two newest batches
    # The three oldest went back; the converter's own bound kept its newest 12 of them.
    assert [entry_raw(entry) for entry in converter._pending.values()] == [*batches[1][4:], *batches[2]]
    assert held.take(batches[3]) is not None and held.take(batches[4]) is not None
    assert held.messages == 0


def test_the_processor_observes_and_converts_through_them(corpus_raws):
    settings = load_settings(overrides=_NO_BACKEND)
    processor, reference = Processor(settings, []), Processor(settings, [])
    batches = _batches(list(corpus_raws[:240]), 60)
    for batch in batches:
        processor.observe(batch)
        reference.converter.observe_many(batch, time.monotonic())  # as `observe` did before
    assert not processor.converter._pending
    assert processor.report_numbers(batches[1]) == reference.report_numbers(batches[1])
    got = [processor.convert(batches[0] + batches[1]), processor.convert(batches[2]), processor.convert(batches[3])]
    want = [reference.convert(batches[0] + batches[1]), reference.convert(batches[2]), reference.convert(batches[3])]
    assert [g.outcome.results for g in got] == [w.outcome.results for w in want]
    assert [g.payload for g in got] == [w.payload for w in want]
    assert not processor.converter._pending and processor._observed.messages == 0
    processor.close()
    reference.close()


def test_a_batch_begun_again_by_its_first_message_hands_the_earlier_to_the_converter(core, corpus_raws):
    batch = list(corpus_raws[:10])
    converter = core.Converter()
    held = ObservedBatches(converter, 10_000)
    earlier = converter.observe_held(batch, 0.0)
    held.put(earlier)
    held.put(converter.observe_held(batch[:4], 0.0))
    assert held.messages == 4  # the earlier batch no longer counted here
    assert [entry_raw(entry) for entry in converter._pending.values()] == batch  # but kept by the converter
    assert held.take(batch[:4]) is not None and held.messages == 0


def _copies(raws: list[RawTraceMessage]) -> list[RawTraceMessage]:
    """New raw messages of the same content: a release replaces the payload of the raw
    message itself, so the tests release copies, never the shared corpus's own."""
    return [RawTraceMessage(r.subject, r.headers, r.payload, r.received_at) for r in raws]


def test_released_payloads_convert_as_kept_ones(core, corpus_raws):
    kept = _batches(_copies(list(corpus_raws[:300])), 37)  # the reference: payloads kept throughout
    want = _by_the_store(core, kept, [kept[0] + kept[1], *kept[2:]])
    batches = _batches(_copies(list(corpus_raws[:300])), 37)
    converts = [batches[0] + batches[1], *batches[2:]]
    converter = core.Converter()
    held = ObservedBatches(converter, 10_000, release_payloads=True)
    assert held.released is RELEASED and ObservedBatches(converter, 10).released is None
    for batch in batches:
        held.put(converter.observe_held(batch, 0.0, held.released))
        assert all(raw.payload is RELEASED for raw in batch)  # released as the batch is observed
    results = [r for part in converts for r in converter.convert_many(part, 0.01, True, held.take(part))]
    assert (results, _index_state(converter.linker.index)) == want


def test_a_released_message_decoded_again_says_why(core, corpus_raws):
    raws = _copies(list(corpus_raws[:40]))
    batches = _batches(raws, 8)
    converter = core.Converter(pending_capacity=12)
    held = ObservedBatches(converter, 20, release_payloads=True)
    for batch in batches:
        held.put(converter.observe_held(batch, 0.0, held.released))
    # The oldest batch and half the next went past both bounds: their entries are gone (as
    # when `take` gives None: the processor converts without the entries).
    part = batches[0] + batches[1]
    results = converter.convert_many(part, 0.01, True, None)
    assert [r.reason for r in results[:12]] == ["bad_json"] * 12  # the kernel decoded `RELEASED`
    held.name_released(part, results)
    assert [(r.reason, r.subject) for r in results[:12]] == [(PAST_THE_BOUND, raw.subject) for raw in part[:12]]
    assert all(isinstance(r, Converted) and r.span_count for r in results[12:])  # still held: converted


def test_the_processor_releases_payloads_only_when_asked_and_not_archiving(tmp_path, corpus_raws):
    plain = load_settings(overrides=_NO_BACKEND)
    archiving = load_settings(overrides=_NO_BACKEND | {"archive": str(tmp_path / "archive.jsonl")})
    for settings, release, released in [(plain, False, False), (plain, True, True), (archiving, True, False)]:
        processor = Processor(settings, [], release_payloads=release)
        batch = _copies(list(corpus_raws[:20]))
        processor.observe(batch)
        assert [raw.payload is RELEASED for raw in batch] == [released] * 20
        outcome = processor.convert(batch).outcome
        assert sum(isinstance(r, Converted) for r in outcome.results) == 20
        processor.close()
    # The archive was written from the payloads as received.
    assert (tmp_path / "archive.jsonl").read_bytes().count(b"\n") == 20


def test_the_bridge_releases_payloads_in_core_mode_in_one_process_only(tmp_path, corpus_raws):
    """The wiring (`Bridge`): core mode in one process releases; JetStream mode (each message
    kept to settle), worker processes (`report_numbers` may decode again) and an archive do not."""
    cases = [({}, True), ({"mode": "jetstream"}, False), ({"batch": {"workers": 2}}, False),
             ({"archive": str(tmp_path / "archive.jsonl")}, False)]
    for overrides, released in cases:
        bridge = Bridge(load_settings(env={}, overrides=_NO_BACKEND | overrides))
        batch = _copies(list(corpus_raws[:10]))
        bridge.processor.observe(batch)
        assert [raw.payload is RELEASED for raw in batch] == [released] * 10, overrides
        bridge.processor.close()
