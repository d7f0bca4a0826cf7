"""The compiled kernel's converter and `finish` (`_kernel.Converter`, `_kernel.finish`:
`_stage_convert.pxi`) against the pure references (`pipeline.PythonConverter`,
`pipeline.python_finish`): the same results, in the same order, with the same link index
afterwards, whatever the calls: batches observed first or not, single messages,
redeliveries (the same object again, or the same bytes in another object), entries held by
the caller (`observe_held`) and given back or left to the converter (`adopt`), a pending store
and a link index at their bounds, encoded or as span records. As in test_twins.py, the
kernel comes from the `kernel` fixture (skipped under NATS_OTEL_NO_EXTENSIONS=1) and is
compared with the reference in one process. Also: a compiled module that refuses to
import is not used, and says why.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nats_otel.core import accel, engine, pipeline
from nats_otel.core.decode import RawTraceMessage
from nats_otel.core.linking import LinkSettings
from nats_otel.core.mapping import MappingOptions
from tests.core.test_fuzz_decode import LIMITS, payloads
from tests.core.test_twins import _bench_fuzzer, outcome
from tests.core.test_twins_linking import _index_state, _reused


def _play(converter, raws: list[RawTraceMessage], seed: int) -> list:
    """One random but repeatable sequence of calls over `raws`; every result, in order, and
    how many messages waited decoded after each `observe_many`."""
    rnd = random.Random(seed)
    out: list = []
    now = 0.0
    start = 0
    while start < len(raws):
        size = rnd.choice([1, 2, 7, 40])
        batch = list(raws[start : start + size])
        start += size
        if rnd.random() < 0.2 and batch:  # a redelivery: the same bytes in another object
            again = batch[0]
            batch.append(RawTraceMessage(again.subject, again.headers, again.payload))
        if rnd.random() < 0.1 and batch:  # the same object twice in one batch
            batch.append(batch[0])
        now += rnd.choice([0.0, 0.001, 0.002, 0.03])
        style = rnd.random()
        encoded = rnd.random() < 0.5
        if style < 0.3:  # observed on arrival, converted a little later
            converter.observe_many(batch, now)
            out.append(("waiting", len(converter._pending)))  # bounded by the pending capacity
            out.extend(converter.convert_many(batch, now + 0.003, encoded))
        elif style < 0.55:  # the bridge: the batch's entries held by the caller, given back
            entries = converter.observe_held(batch, now)
            if rnd.random() < 0.25:  # not converted as observed: the converter keeps them after all
                converter.adopt(entries)
                out.append(("waiting", len(converter._pending)))
                out.extend(converter.convert_many(batch[::-1], now + 0.003, encoded))
            elif encoded:  # the bridge's own path: straight into one request (`EncodedBatch`)
                out.append(_batch_values(converter.convert_encoded(batch, now + 0.003, entries)))
            else:
                out.extend(converter.convert_many(batch, now + 0.003, encoded, entries))
        elif style < 0.7:  # observed one by one, some converted twice
            for raw in batch:
                converter.observe(raw, now)
            out.extend(converter.convert_many(batch[::-1], now, encoded))
        else:  # never observed: converted one at a time
            out.extend(converter.convert(raw, now, encoded) for raw in batch)
    return out


def _batch_values(batch) -> dict:
    """What an `EncodedBatch` gives: its request and counts, and each message's result."""
    return {"request": batch.request, "spans": batch.spans, "tally": (batch.decoded, batch.links, batch.issues,
                                                                    batch.samples), "rejected": batch.rejected,
            "results": list(batch)}


def _alike(kernel: ModuleType, raws: list[RawTraceMessage], seed: int, link: LinkSettings,
           pending_capacity: int = 200_000, options: MappingOptions | None = None) -> list:
    """Both converters through the same calls: the same results and link index state."""
    results, states = [], []
    for converter_type in (pipeline.PythonConverter, kernel.Converter):
        converter = converter_type(options or MappingOptions(), LIMITS, link, pending_capacity)
        results.append(_play(converter, raws, seed))
        assert all(r[1] <= pending_capacity for r in results[-1] if isinstance(r, tuple))
        states.append(_index_state(converter.linker.index))
    assert results[1] == results[0]
    assert states[1] == states[0]
    return results[0]


def test_the_corpus_converts_alike(kernel, corpus_raws):
    from tests.core.test_linking_properties import WINDOW

    raws = _reused(corpus_raws)
    kinds = set()
    windows = [(0.5, 0.1), (WINDOW.max_hop_latency_s, WINDOW.max_clock_skew_s)]
    for seed, (capacity, pending) in enumerate([(1_000_000, 200_000), (5, 200_000), (50, 3), (10_000, 1)]):
        link = LinkSettings(*windows[seed % 2], capacity, retention_s=0.05)
        results = _alike(kernel, raws, seed, link, pending)
        kinds |= {getattr(r, "link", "rejected") for r in results}
        assert any(getattr(r, "encoded", None) is not None for r in results)
        assert any(getattr(r, "spans", None) for r in results)
    assert kinds >= {"", "matched", "ambiguous", "unmatched"}  # every link decision was compared
    options = MappingOptions("svc", frozenset({"traceparent", "x"}))
    _alike(kernel, raws, 9, LinkSettings(), options=options)


def test_the_bench_fuzzers_messages_convert_alike(kernel):
    fuzz = _bench_fuzzer()
    rnd = random.Random(31)
    results = _alike(kernel, [fuzz.generate(rnd)[1] for _ in range(1500)], 4, LinkSettings())
    assert sum(1 for r in results if isinstance(r, pipeline.Rejected)) > 50  # the rejections were compared
    assert sum(1 for r in results if isinstance(r, pipeline.Converted)) > 100


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(payloads(), min_size=1, max_size=6), st.integers(0, 2**16))
def test_fuzzed_messages_convert_alike(kernel, raws, seed):
    _alike(kernel, raws, seed, LinkSettings(capacity=3, retention_s=0.1), pending_capacity=2)


def test_finish_alike_and_bad_calls_fail_alike(kernel, corpus_raws):
    prepared = [pipeline.prepare(raw) for raw in corpus_raws]
    options = MappingOptions()
    # `locate` claims a hop (its latency is counted once): each has a linker of its own.
    linkers = (kernel.Linker(bounded=False), pipeline.PythonLinker(bounded=False))
    for p in prepared:
        for linker in linkers:
            linker.observe(p)
    for p in prepared:
        for encoded in (False, True):
            assert kernel.finish(p, linkers[0], options, encoded) == pipeline.python_finish(
                p, linkers[1], options, encoded)
    assert _index_state(linkers[0].index) == _index_state(linkers[1].index)
    # Not a message, a linker or options: the same error from both.
    for linker in linkers:
        for args in [("x", linker, options), (prepared[0], None, options), (prepared[0], linker, None)]:
            assert outcome(kernel.finish, *args) == outcome(pipeline.python_finish, *args)
    # A raw message that is not one: both converters raise the same error.
    for converter_type in (pipeline.PythonConverter, kernel.Converter):
        with pytest.raises(AttributeError):
            converter_type().convert("not a raw message")


class _PreparedCopy(pipeline.Prepared, frozen=True, gc=False):
    """A subclass: the compiled linker and `finish` read it by name, not at slot offsets."""


def test_records_of_other_types_are_read_by_name_alike(kernel, corpus_raws):
    prepared = [pipeline.prepare(raw) for raw in corpus_raws]
    copies = [_PreparedCopy(*(getattr(p, name) for name in p.__struct_fields__)) for p in prepared]
    options = MappingOptions()
    linkers = (kernel.Linker(bounded=False), pipeline.PythonLinker(bounded=False))
    for copy, p in zip(copies, prepared, strict=True):
        linkers[0].observe(copy)
        linkers[1].observe(p)
    for copy, p in zip(copies, prepared, strict=True):
        assert kernel.finish(copy, linkers[0], options, True) == pipeline.python_finish(
            p, linkers[1], options, True)
    assert _index_state(linkers[0].index) == _index_state(linkers[1].index)


def test_a_compiled_module_that_refuses_to_import_is_not_used_and_says_why(monkeypatch):
    monkeypatch.setattr(accel, "_unavailable", {})
    assert accel.compiled("_no_such_module") is None
    if accel.NO_EXTENSIONS:  # not imported at all: nothing to refuse
        assert accel.refused() == engine.unavailable() == {}
        return
    assert list(accel.refused()) == ["_no_such_module"]
    assert "nats_otel.core._no_such_module" in accel.refused()["_no_such_module"]
    assert engine.unavailable() == accel.refused()


# In a child process (this one keeps its records): a NamedTuple the kernel builds by
# position, its fields renamed, before anything imports the kernel.
_CHANGED_RECORD = """
from typing import NamedTuple

from nats_otel.core import linking

class Link(NamedTuple):
    outcome: str
    egress: object = None
    candidates: int = 0
    first: bool = False

linking.Link = Link
from nats_otel.core import accel, engine
try:
    import nats_otel.core._kernel
except ImportError as exc:
    print("ImportError:", exc)
print(engine.implementation(), engine.IMPLEMENTATION, sorted(engine.IMPLEMENTATIONS))
print(engine.unavailable().get("_kernel"))
"""


def test_the_kernel_refuses_a_record_laid_out_otherwise_and_the_reference_runs():
    if accel.NO_EXTENSIONS:
        pytest.skip("NATS_OTEL_NO_EXTENSIONS is set: the compiled kernel is not used in this run")
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", _CHANGED_RECORD], env=dict(os.environ), cwd=root,
                          capture_output=True, text=True, check=True)
    refusal, chosen, why = done.stdout.splitlines()
    assert refusal.startswith("ImportError: a record is not laid out as the kernel reads it: Link's fields changed")
    assert chosen == "python python ['python']"
    assert "Link's fields changed" in why


def _encoded_batch(corpus_raws: list[RawTraceMessage]) -> list:
    """The corpus converted with `encoded=True`, two undecodable messages among it (Rejected)."""
    raws = [*corpus_raws[:40], RawTraceMessage("trace.a", {}, b"{"), *corpus_raws[40:],
            RawTraceMessage("trace.a", {"Content-Encoding": ["gzip"]}, b"not gzip")]
    converter = pipeline.PythonConverter()
    converter.observe_many(raws, 0.0)
    return converter.convert_many(raws, 0.0, True)


def test_a_converted_batch_makes_the_same_request(kernel, corpus_raws):
    """`encode_results`, the bridge's pass over a converted batch: the request of the spans
    of every `Converted` but those held, and their count, on both twins; the request is
    `encode_request`'s of those items."""
    from nats_otel.core.span_bytes import python_encode_request

    results = _encoded_batch(corpus_raws)
    assert any(isinstance(r, pipeline.Rejected) for r in results)
    for held in (frozenset(), frozenset(range(0, len(results), 3)), frozenset(range(len(results))),
                 frozenset({len(results) + 5, -1})):
        request, spans = kernel.encode_results(results, held)
        assert (request, spans) == pipeline.encode_results(results, held)
        items = [r.encoded for i, r in enumerate(results) if isinstance(r, pipeline.Converted) and i not in held]
        assert spans == sum(item.span_count for item in items)
        assert request == (python_encode_request(items) if spans else b"")
    assert kernel.encode_results(results, frozenset(range(len(results)))) == (b"", 0)


def test_odd_converted_batches_go_to_the_reference(kernel, corpus_raws):
    """Not a list, `held` not a frozenset, a result or its `encoded` of another type: the
    reference's outcome (its bytes, or its error) on both."""
    from nats_otel.core.span_bytes import EncodedSpans

    results = _encoded_batch(corpus_raws)[:12]
    first = next(r for r in results if isinstance(r, pipeline.Converted))
    odd_span_count = pipeline.Converted([], encoded=EncodedSpans(first.encoded.resource, b"", "2"))
    odd_encoded = pipeline.Converted([], encoded=(first.encoded.resource, b"", 1))
    none: frozenset[int] = frozenset()
    for batch, held in [(tuple(results), none), (results, {1, 2}), (results, [1]), ([*results, None], none),
                        ([*results, odd_span_count], none), ([*results, odd_encoded], none),
                        ([*results, "text"], none)]:
        assert outcome(kernel.encode_results, batch, held) == outcome(pipeline.encode_results, batch, held)


def test_a_converted_batch_is_tallied_alike(kernel, corpus_raws):
    """`tally_results`, what the bridge's accounting counts of a batch: the converted, their
    links by kind, their issues in order, their network samples, on both twins; and the
    counts are those of the results themselves."""
    results = _encoded_batch(corpus_raws)
    with_issue = pipeline.Converted([], issues=["malformed_header: x", "unknown_event: y"], link="matched")
    rejected = [r for r in results if isinstance(r, pipeline.Rejected)]
    for batch in (results, [*results, with_issue, with_issue], [], rejected):
        decoded, links, issues, samples = kernel.tally_results(batch)
        assert (decoded, links, issues, samples) == pipeline.tally_results(batch)
        converted = [r for r in batch if isinstance(r, pipeline.Converted)]
        assert decoded == len(converted)
        assert sum(links.values()) == sum(1 for r in converted if r.link) and "" not in links
        assert issues == [i for r in converted for i in r.issues]
        assert samples == [r.network for r in converted if r.network is not None]
    assert kernel.tally_results(results)[1]["matched"] > 0 and rejected
    assert kernel.tally_results([*results, with_issue])[2][-2:] == with_issue.issues


def test_odd_batches_are_tallied_by_the_reference(kernel, corpus_raws):
    """Not a list, a result of another type, a link that is not a string or issues not a
    list: the reference's tally (or its error) on both."""
    results = _encoded_batch(corpus_raws)[:12]
    for batch in (tuple(results), [*results, None], [*results, "text"],
                  [*results, pipeline.Converted([], link=None)], [*results, pipeline.Converted([], issues=("a",))]):
        assert outcome(kernel.tally_results, batch) == outcome(pipeline.tally_results, batch)


@pytest.mark.parametrize("twin", ["reference", "kernel"])
def test_entries_not_of_the_batch_convert_nothing(kernel, corpus_raws, twin):
    """`convert_many(observed=...)` checks the entries against the batch before it converts
    any: another batch's, too few, reordered, or another twin's entries are a ValueError,
    and nothing was converted (the link index is as before)."""
    converter_type = pipeline.PythonConverter if twin == "reference" else kernel.Converter
    other_type = kernel.Converter if twin == "reference" else pipeline.PythonConverter
    converter = converter_type(MappingOptions(), LIMITS, LinkSettings())
    first, second = list(corpus_raws[:6]), list(corpus_raws[6:12])
    held = converter.observe_held(first, 0.0)
    before = _index_state(converter.linker.index)
    foreign = other_type(MappingOptions(), LIMITS, LinkSettings()).observe_held(first, 0.0)
    for raws, entries in [(second, held), (first, held[:-1]), (first, held[::-1]), (first, foreign)]:
        with pytest.raises(ValueError, match="observed entr"):
            converter.convert_many(raws, 0.01, True, entries)
        with pytest.raises(ValueError, match="observed entr"):  # the bridge's path checks them alike
            converter.convert_encoded(raws, 0.01, entries)
        assert _index_state(converter.linker.index) == before
    assert converter.convert_many(first, 0.01, True, held) == converter_type(
        MappingOptions(), LIMITS, LinkSettings()).convert_many(first, 0.01, True)


@pytest.mark.parametrize("twin", ["reference", "kernel"])
def test_held_entries_given_as_a_list_are_consumed(kernel, corpus_raws, twin):
    """`convert_many(observed=<list>)` replaces each entry by its result in that list and
    returns it (each entry, and the message it decoded, let go as it is converted, not a
    batch later); entries given as a tuple are left as they were. The results are the same
    either way, and the same as a converter's that kept what it observed (`observe_many`)."""
    converter_type = pipeline.PythonConverter if twin == "reference" else kernel.Converter
    raws = list(corpus_raws[:40])
    keeping = converter_type(MappingOptions(), LIMITS, LinkSettings())
    keeping.observe_many(raws, 0.0)
    expected = keeping.convert_many(raws, 0.01, True)
    assert any(isinstance(r, pipeline.Converted) and r.link == "matched" for r in expected)
    converter = converter_type(MappingOptions(), LIMITS, LinkSettings())
    held = converter.observe_held(raws, 0.0)
    results = converter.convert_many(raws, 0.01, True, held)
    assert results is held and results == expected
    assert all(type(r) in (pipeline.Converted, pipeline.Rejected) for r in held)
    converter = converter_type(MappingOptions(), LIMITS, LinkSettings())
    entries = tuple(converter.observe_held(raws, 0.0))
    assert converter.convert_many(raws, 0.01, True, entries) == expected
    # left as they were: the reference's (raw, ...) tuples, the kernel's records
    assert all(pipeline.entry_raw(entry) is raw for entry, raw in zip(entries, raws, strict=True))


class _RawCopy(RawTraceMessage):
    """A raw message of another type: the kernel releases its payload through Python."""


@pytest.mark.parametrize("twin", ["reference", "kernel"])
def test_held_entries_release_their_payloads_when_asked(kernel, corpus_raws, twin):
    """`observe_held(..., release=X)`: each raw's payload is X once observed (one observed and
    kept before, too; one of another type, too), and the batch converts as with its payloads
    kept (the entries hold the parse); without `release`, the payloads stay."""
    converter_type = pipeline.PythonConverter if twin == "reference" else kernel.Converter
    released = b"<released>"

    def copies() -> list[RawTraceMessage]:
        raws = [RawTraceMessage(r.subject, r.headers, r.payload, r.received_at) for r in corpus_raws[:40]]
        return [*raws[:-1], _RawCopy(raws[-1].subject, raws[-1].headers, raws[-1].payload)]

    keeping, raws = converter_type(MappingOptions(), LIMITS, LinkSettings()), copies()
    expected = keeping.convert_many(raws, 0.01, True, keeping.observe_held(raws, 0.0))
    assert [raw.payload for raw in raws] == [raw.payload for raw in corpus_raws[:40]]
    converter, raws = converter_type(MappingOptions(), LIMITS, LinkSettings()), copies()
    converter.observe_many(raws[:3], 0.0)  # observed and kept before: handed over, released too
    held = converter.observe_held(raws, 0.0, released)
    assert all(raw.payload is released for raw in raws)
    assert converter.convert_many(raws, 0.01, True, held) == expected
