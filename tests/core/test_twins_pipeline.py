"""The compiled converter and `finish` (`_pipeline.pyx`) against the pure references
(`pipeline.PythonConverter`, `pipeline.python_finish`): the same results, in the same
order, with the same link index afterwards, whatever the calls: batches observed first or
not, single messages, redeliveries (the same object again, or the same bytes in another
object), a pending store and a link index at their bounds, encoded or as span records.
As in test_twins.py, the twin is imported directly, whichever core the process chose; both
CI runs of tests/core run these.
"""

from __future__ import annotations

import random
from types import ModuleType

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nats_otel.core import accel, choice, pipeline
from nats_otel.core.decode import RawTraceMessage
from nats_otel.core.linking import LinkSettings
from nats_otel.core.mapping import MappingOptions
from tests.core.test_fuzz_decode import LIMITS, payloads
from tests.core.test_twins import _bench_fuzzer, _twin, outcome
from tests.core.test_twins_linking import _index_state, _reused


@pytest.fixture(scope="module")
def pipeline_twin() -> ModuleType:
    module = _twin("_pipeline")
    pipeline.configure_pipeline(module)  # as pipeline.py does (not done when NATS_OTEL_NO_EXTENSIONS is set)
    return module


def test_the_process_runs_the_pipeline_twins_it_was_asked_for():
    python = (pipeline.Converter is pipeline.PythonConverter, pipeline.finish is pipeline.python_finish)
    assert python == ((True, True) if accel.NO_EXTENSIONS else (False, False)), choice.unavailable()


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
        if style < 0.5:  # the bridge: observed on arrival, converted a little later
            converter.observe_many(batch, now)
            out.append(("waiting", len(converter._pending)))  # bounded by the pending capacity
            out.extend(converter.convert_many(batch, now + 0.003, encoded))
        elif style < 0.7:  # observed one by one, some converted twice
            for raw in batch:
                converter.observe(raw, now)
            out.extend(converter.convert_many(batch[::-1], now, encoded))
        else:  # never observed: converted one at a time
            out.extend(converter.convert(raw, now, encoded) for raw in batch)
    return out


def _alike(twin: ModuleType, raws: list[RawTraceMessage], seed: int, link: LinkSettings,
           pending_capacity: int = 200_000, options: MappingOptions | None = None) -> list:
    """Both converters through the same calls: the same results and link index state."""
    results, states = [], []
    for converter_type in (pipeline.PythonConverter, twin.Converter):
        converter = converter_type(options or MappingOptions(), LIMITS, link, pending_capacity)
        results.append(_play(converter, raws, seed))
        assert all(r[1] <= pending_capacity for r in results[-1] if isinstance(r, tuple))
        states.append(_index_state(converter.linker.index))
    assert results[1] == results[0]
    assert states[1] == states[0]
    return results[0]


def test_the_corpus_converts_alike(pipeline_twin, corpus_raws):
    from tests.core.test_linking_properties import WINDOW

    raws = _reused(corpus_raws)
    kinds = set()
    windows = [(0.5, 0.1), (WINDOW.max_hop_latency_s, WINDOW.max_clock_skew_s)]
    for seed, (capacity, pending) in enumerate([(1_000_000, 200_000), (5, 200_000), (50, 3), (10_000, 1)]):
        link = LinkSettings(*windows[seed % 2], capacity, retention_s=0.05)
        results = _alike(pipeline_twin, raws, seed, link, pending)
        kinds |= {getattr(r, "link", "rejected") for r in results}
        assert any(getattr(r, "encoded", None) is not None for r in results)
        assert any(getattr(r, "spans", None) for r in results)
    assert kinds >= {"", "matched", "ambiguous", "unmatched"}  # every link decision was compared
    options = MappingOptions("svc", frozenset({"traceparent", "x"}))
    _alike(pipeline_twin, raws, 9, LinkSettings(), options=options)


def test_the_bench_fuzzers_messages_convert_alike(pipeline_twin):
    fuzz = _bench_fuzzer()
    rnd = random.Random(31)
    results = _alike(pipeline_twin, [fuzz.generate(rnd)[1] for _ in range(1500)], 4, LinkSettings())
    assert sum(1 for r in results if isinstance(r, pipeline.Rejected)) > 50  # the rejections were compared
    assert sum(1 for r in results if isinstance(r, pipeline.Converted)) > 100


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(payloads(), min_size=1, max_size=6), st.integers(0, 2**16))
def test_fuzzed_messages_convert_alike(pipeline_twin, raws, seed):
    _alike(pipeline_twin, raws, seed, LinkSettings(capacity=3, retention_s=0.1), pending_capacity=2)


def test_finish_alike_and_bad_calls_fail_alike(pipeline_twin, corpus_raws):
    prepared = [pipeline.prepare(raw) for raw in corpus_raws]
    options = MappingOptions()
    # `locate` claims a hop (its latency is counted once): each twin has a linker of its own.
    linkers = (pipeline.Linker(bounded=False), pipeline.Linker(bounded=False))
    for p in prepared:
        for linker in linkers:
            linker.observe(p)
    for p in prepared:
        for encoded in (False, True):
            assert pipeline_twin.finish(p, linkers[0], options, encoded) == pipeline.python_finish(
                p, linkers[1], options, encoded)
    linker = linkers[0]
    # Not a message, a linker or options: the same error from both.
    for args in [("x", linker, options), (prepared[0], None, options), (prepared[0], linker, None)]:
        assert outcome(pipeline_twin.finish, *args) == outcome(pipeline.python_finish, *args)
    # A raw message that is not one: both converters raise the same error.
    for converter_type in (pipeline.PythonConverter, pipeline_twin.Converter):
        with pytest.raises(AttributeError):
            converter_type().convert("not a raw message")


class _PreparedCopy(pipeline.Prepared, frozen=True, gc=False):
    """A subclass: the compiled linker and `finish` read it by name, not at slot offsets."""


def test_records_of_other_types_are_read_by_name_alike(pipeline_twin, corpus_raws):
    prepared = [pipeline.prepare(raw) for raw in corpus_raws]
    copies = [_PreparedCopy(*(getattr(p, name) for name in p.__struct_fields__)) for p in prepared]
    options = MappingOptions()
    linkers = (pipeline.Linker(bounded=False), pipeline.PythonLinker(bounded=False))
    for copy, p in zip(copies, prepared, strict=True):
        linkers[0].observe(copy)
        linkers[1].observe(p)
    for copy, p in zip(copies, prepared, strict=True):
        assert pipeline_twin.finish(copy, linkers[0], options, True) == pipeline.python_finish(
            p, linkers[1], options, True)
    assert _index_state(linkers[0].index) == _index_state(linkers[1].index)


def test_a_twin_whose_configure_refuses_it_is_not_used_and_says_why(monkeypatch):
    from nats_otel.core.span_layout import LayoutChanged

    monkeypatch.setattr(accel, "_unavailable", {})

    def refuse(error: Exception):
        def configure(module: ModuleType) -> None:
            raise error
        return configure

    assert accel.configured("_pipeline", refuse(TypeError("a field moved"))) is None
    assert accel.configured("_network", refuse(LayoutChanged("a slot moved")), (LayoutChanged,)) is None
    if accel.NO_EXTENSIONS:  # not imported at all: nothing to refuse
        assert choice.unavailable() == {}
        return
    assert choice.unavailable() == {"_pipeline": "not used: a field moved", "_network": "not used: a slot moved"}
    with pytest.raises(ValueError):  # anything else is a bug, not a refusal
        accel.configured("_pipeline", refuse(ValueError("bug")))
    assert accel.configured("_pipeline", lambda module: None) is not None
