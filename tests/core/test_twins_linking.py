"""The compiled kernel's link index and linker (`_kernel.LinkIndex`, `_kernel.Linker`:
`_stage_link.pxi`) against the pure references (`linking.PythonLinkIndex`,
`pipeline.PythonLinker`): the same links, counters and length, in every mode, on the
corpus (also under reused contexts) and on generated index operations. As in
test_twins.py, the kernel comes from the `kernel` fixture (skipped under
NATS_OTEL_NO_EXTENSIONS=1) and is compared with the reference in one process.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nats_otel.core.decode import RawTraceMessage
from nats_otel.core.linking import LinkSettings
from nats_otel.core.pipeline import Converted, Converter, convert_batch
from nats_otel.core.shapes import SHAPE_DIGEST

# --- The link index and linker (`_kernel` against `linking.PythonLinkIndex` and
# `pipeline.PythonLinker`): the same links, counters and length, in every mode. -----------


def _decisions(sequences) -> dict:
    """The crowded keys' decisions (`HopSequences._decided`), forgotten as arrivals expire."""
    return {key: dict(by_arrival) for key, by_arrival in sequences._decided.items()}


def _index_state(index) -> tuple:
    return len(index), index.evicted, dict(index.expired_unmatched), index._claimed, _decisions(index.sequences)


def _reused(raws) -> list[RawTraceMessage]:
    """The corpus, and copies of it under the same contexts: some apart in time (linked),
    some within one hop's latency of each other (ambiguous), some under one ad-hoc subject."""
    import orjson

    from tests.core.test_linking_properties import copies_of

    def plain(raw: RawTraceMessage) -> bool:  # JSON with events and headers: what copies_of rewrites
        try:
            doc = orjson.loads(raw.payload)
        except orjson.JSONDecodeError:
            return False
        return isinstance(doc, dict) and bool(doc.get("events")) and "header" in doc.get("request", {})

    copied = [raw for raw in raws if plain(raw)]
    traced = [raw for raw in copied if "traceparent" in orjson.loads(raw.payload)["request"]["header"]]
    assert len(traced) > 40
    return [*raws, *copies_of(copied, [0, 3_000, 2_000_000]), *copies_of(traced[:40], [0, 5_000_000], adhoc=True)]


def test_the_corpus_links_alike_through_convert_batch(kernel, corpus_raws, monkeypatch):
    from nats_otel.core import pipeline
    from tests.core.test_linking_properties import WINDOW

    raws = _reused(corpus_raws)

    def batches(convert) -> list:
        return [convert(raws), convert(raws, link=WINDOW), convert(raws[::-1], link=WINDOW)]

    python = batches(convert_batch)
    # The kernel's whole `convert_batch` (its prepare, linker and mapping) ...
    assert batches(kernel.convert_batch) == python
    # ... and its linker alone, in the pure `convert_batch` (which looks `Linker` up when called).
    monkeypatch.setattr(pipeline, "Linker", kernel.Linker)
    assert batches(convert_batch) == python
    links = {r.link for batch in python for r in batch if isinstance(r, Converted)}
    assert links == {"", "matched", "ambiguous", "unmatched"}  # every decision was compared


def test_the_corpus_links_alike_in_a_bounded_converter(kernel, corpus_raws):
    from nats_otel.core import pipeline
    from tests.core.test_linking_properties import WINDOW

    raws = _reused(corpus_raws)
    for capacity in (1, 2, 5, 50, 10_000):
        settings = LinkSettings(WINDOW.max_hop_latency_s, WINDOW.max_clock_skew_s, capacity, retention_s=0.05)
        states, outcomes = [], []
        for linker in (pipeline.PythonLinker(settings), kernel.Linker(settings)):
            converter = Converter(link=settings)
            converter.linker = linker
            out = []
            for start in range(0, len(raws), 7):  # batches, observed then converted a little later
                batch, now = raws[start : start + 7], start / 1000
                converter.observe_many(batch, now)
                out.extend(converter.convert_many(batch, now + 0.003))
            outcomes.append(out)
            states.append(_index_state(linker.index))
        assert outcomes[1] == outcomes[0]
        assert states[1] == states[0]
        if capacity <= 5:
            assert states[0][1] > 0  # the capacity bound was compared too


def _bookkeeping(linker) -> tuple:
    """What the ledger and the sequences keep of every report and matched hop (the kernel's
    `_stage_ledger.pxi` writes into the reference's own objects: they must hold the same)."""
    sequences = linker.index.sequences
    ledger = sequences.ledger
    runs = {server: (r.firsts, r.lasts, r.since_ns, r.until_ns, r.touched, sorted(r.due))
            for server, r in ledger._servers.items()}
    members = {name: (m.heard, m.breaks) for name, m in ledger._members.items()}
    latency = sequences.latency
    return (ledger._reports, runs, list(ledger._fifo), ledger._covers, members,
            {link: list(samples) for link, samples in latency._samples.items()}, latency._estimates,
            {link: (p.times, p.pairs) for link, p in sequences._link_pairs.items()}, dict(sequences.decided_by),
            _decisions(sequences))


def test_the_ledger_and_sequences_keep_alike_what_each_report_and_hop_leaves(kernel, corpus_raws):
    """Batches observed while their stream vouches (`ReportLedger.receiving`: a stream kept,
    another, a loss, none) and converted a little later: the kernel's per-report steps
    (its common case, and the methods it hands the rest to) leave the reference's state."""
    from nats_otel.core import pipeline

    raws = _reused(corpus_raws)
    receiving = [("s1", 0), ("s1", 0), ("s2", 0), ("s1", 1), None, ("s1", 1)]
    window = LinkSettings()  # the default hop window: most hops match, and their links are learned
    settings = LinkSettings(window.max_hop_latency_s, window.max_clock_skew_s, 10_000, retention_s=0.2)
    states = []
    for linker in (pipeline.PythonLinker(settings), kernel.Linker(settings)):
        converter = Converter(link=settings)
        converter.linker = linker
        ledger = linker.index.sequences.ledger
        for turn, start in enumerate(range(0, len(raws), 9)):
            batch, now = raws[start : start + 9], start / 1000
            ledger.receiving = receiving[turn % len(receiving)]
            converter.observe_many(batch, now)
            ledger.receiving = None
            converter.convert_many(batch, now + 0.003)
        states.append(_bookkeeping(linker))
    assert states[1] == states[0]
    reports, runs, fifo, covers, members, samples, _, pairs, _, _ = states[0]
    # The common case and the others were both met: runs extended and started, streams
    # followed and vouched for, latencies and pairs learned on links kept.
    assert any(len(firsts) > 1 for firsts, *_ in runs.values())
    assert any(hi > lo for _, lo, hi in covers.values())
    assert {"s1", "s2"} <= set(members)
    assert max(len(kept) for kept in samples.values()) == 64  # a link's latencies, to the deque's bound
    assert max(len(times) for times, _ in pairs.values()) == 32  # its latest pairs, to `_LINK_PAIRS`
    assert len(reports) > 100 and fifo


# Colliding keys (equal, not identical), equal and huge timestamps, duplicate entries.
_keys = st.sampled_from([(b"c", "1", "a", "b"), (b"c", "2", "a", "b"), (b"d", "1", "a", "b")]).map(
    lambda key: (bytes(key[0]), *key[1:]))
_ts_ns = (st.integers(0, 12) | st.integers(2**62 - 3, 2**62 + 3) | st.integers(2**64 - 8, 2**64 - 1)
          | st.integers(0, 2**64 - 1) | st.integers(-3, -1))
# Shapes: plain sizes, and digests (`shapes.SHAPE_DIGEST` and above: exact evidence).
_shapes = st.integers(0, 2) | st.sampled_from([SHAPE_DIGEST, SHAPE_DIGEST + 1])
_entry_fields = st.tuples(_ts_ns, _shapes, st.sampled_from([b"u", b"v", b"w"]))
_ops = st.one_of(
    st.tuples(st.just("egress"), _keys, _entry_fields, st.sampled_from([b"s1", b"s2"])),
    st.tuples(st.just("arrival"), _keys, _entry_fields),
    st.tuples(st.just("resolve"), _keys, _entry_fields),
    st.tuples(st.just("expire"), st.sampled_from([0.0, 0.5, 1.0, 2.5])),
)
# A window of a few ns (worked out in C), and one too wide for it (worked out on Python ints).
_windows = st.sampled_from([(3e-9, 1e-9), (0.0, 0.0), (5e9, 5e9)])


@settings(max_examples=1500, deadline=None)
@given(st.lists(_ops, max_size=40), _windows, st.integers(1, 5), st.booleans())
def test_index_operations_give_the_same_links_and_counts(kernel, ops, window, capacity, bounded):
    from nats_otel.core.linking import Arrival, Egress, PythonLinkIndex

    settings = LinkSettings(window[0], window[1], capacity, retention_s=2.0)
    indexes = (PythonLinkIndex(settings, bounded), kernel.LinkIndex(settings, bounded))
    now = 0.0
    for op in ops:
        if op[0] == "expire":
            now += op[1]
        for index in indexes:
            if op[0] == "egress":
                index.add_egress(op[1], Egress(*op[2], op[3]), now)
            elif op[0] == "arrival":
                index.add_arrival(op[1], Arrival(*op[2]), now)
            elif op[0] == "expire":
                index.expire(now)
        if op[0] == "resolve":
            python, compiled = (index.resolve(op[1], Arrival(*op[2])) for index in indexes)
            assert compiled == python
        assert _index_state(indexes[1]) == _index_state(indexes[0])


def test_a_wrong_entry_is_an_error_not_a_crash(kernel):
    index = kernel.LinkIndex(LinkSettings())
    for call in (index.add_egress, index.add_arrival, index.resolve):
        with pytest.raises(TypeError):
            call((b"c", "1", "a", "b"), 5)
    from nats_otel.core.linking import Egress

    index.add_egress((b"c", "1", "a", "b"), Egress(1, 2, b"u", b"s"))
    with pytest.raises(IndexError):  # read by position, bounds checked
        index.resolve((b"c", "1", "a", "b"), ())


def test_evidence_observed_again_stays_a_retention_from_then(core):
    """A redelivered report (or replayed evidence) is observed again: its entries stay
    `retention_s` from then, for its partner may be redelivered later still (a SIGKILL)."""
    from nats_otel.core.linking import MATCHED, Arrival, Egress

    index = core.LinkIndex(LinkSettings(0.5, 0.1, 1000, retention_s=30.0))
    key = (b"ctx", "1", "east-2", "east-1")
    egress = Egress(1_000_000_000, 90, b"up", b"span0001")
    index.add_egress(key, egress, 0.0)
    index.add_egress(key, egress, 25.0)  # redelivered
    index.expire(40.0)  # 40 s after the first observation, 15 s after the second
    arrival = Arrival(1_000_200_000, 90, b"down")
    index.add_arrival(key, arrival, 40.0)
    link = index.resolve(key, arrival)
    assert (link.result, link.egress) == (MATCHED, egress)
    index.expire(56.0)  # the egress 31 s after its last observation
    assert len(index) == 1
    index.expire(71.0)
    assert len(index) == 0


def test_the_fifo_kept_alike_through_growth_wraps_and_shrinking(kernel):
    """The kernel's fifo is a ring of records that grows, wraps round and is given back as it
    drains: thousands of entries observed and expired in waves (a burst, then a trickle, then
    a redelivery of the burst) leave the same links, counts and claims as the reference's deque."""
    from nats_otel.core.linking import Arrival, Egress, PythonLinkIndex

    settings = LinkSettings(0.5, 0.1, 3_000, retention_s=1.0)
    indexes = (PythonLinkIndex(settings), kernel.LinkIndex(settings))
    resolved = ([], [])
    waves = [(0, 4_000, 0.0001), (4_000, 4_300, 0.01), (0, 1_000, 0.0001)]  # (first, end, seconds apart)
    now = 0.0
    for first, end, apart in waves:
        for t in range(first, end):
            now += apart
            key = (b"ctx%d" % (t % 1_500), "1", "east-2", "east-1")
            for side, index in enumerate(indexes):
                index.add_egress(key, Egress(t * 1_000, 90, b"up%d" % t, b"span%04d" % (t % 10_000)), now)
                index.add_arrival(key, Arrival(t * 1_000 + 200, 90, b"down%d" % t), now)
                if t % 7 == 0:
                    resolved[side].append(index.resolve(key, Arrival(t * 1_000 + 200, 90, b"down%d" % t)))
                if t % 50 == 0:
                    index.expire(now)
            assert _index_state(indexes[1]) == _index_state(indexes[0])
        now += 0.6  # a pause past half the retention
        for index in indexes:
            index.expire(now)
        assert _index_state(indexes[1]) == _index_state(indexes[0])
    assert resolved[1] == resolved[0]
    assert indexes[0].evicted > 0 and len(indexes[0]) > 0  # the capacity bound and what is left compared too
    now += 5.0  # everything past its retention: both empty
    for index in indexes:
        index.expire(now)
    assert len(indexes[1]) == len(indexes[0]) == 0 and not indexes[1]._claimed


def test_decisions_by_order_are_forgotten_with_their_arrivals(kernel):
    """A burst under one context (one crowded key): its arrivals are matched by order
    (`HopSequences._decided`), and each decision goes when its arrival expires, as in the
    reference; a second burst on the key is decided afresh, alike."""
    from nats_otel.core.linking import Arrival, Egress, PythonLinkIndex

    settings = LinkSettings(0.5, 0.1, 10_000, retention_s=1.0)
    indexes = (PythonLinkIndex(settings), kernel.LinkIndex(settings))
    key = (b"ctx", "1", "east-2", "east-1")
    links: tuple[list, list] = ([], [])
    for burst, now in ((0, 0.0), (1, 3.0)):
        for i in range(12):  # back to back, alike: only their order tells them apart
            t = burst * 10**10 + i * 1_000_000
            for index in indexes:  # each server's reports numbered without a gap: none was lost
                index.observe_report(b"up%d.%d" % (burst, i), "UP", burst * 13 + i + 1, t, now)
                index.observe_report(b"down%d.%d" % (burst, i), "DOWN", burst * 13 + i + 1, t + 200_000, now)
                index.add_egress(key, Egress(t, 90, b"up%d.%d" % (burst, i), b"span%02d%02d" % (burst, i)), now)
                index.add_arrival(key, Arrival(t + 200_000, 90, b"down%d.%d" % (burst, i)), now)
        for index in indexes:  # and a report of each a whole window later: nothing after the burst lost
            late = burst * 10**10 + 2 * 10**9
            index.observe_report(b"up-late%d" % burst, "UP", burst * 13 + 13, late, now)
            index.observe_report(b"down-late%d" % burst, "DOWN", burst * 13 + 13, late, now)
        for i in range(12):
            arrival = Arrival(burst * 10**10 + i * 1_000_000 + 200_000, 90, b"down%d.%d" % (burst, i))
            for side, index in enumerate(indexes):
                links[side].append(index.resolve(key, arrival))
        decided = _index_state(indexes[0])[-1]
        assert len(decided.get(key, {})) >= 10  # decided by order, most of them
        assert _index_state(indexes[1]) == _index_state(indexes[0])
        for index in indexes:
            index.expire(now + 2.0)  # the burst's evidence past its retention
        assert _index_state(indexes[1]) == _index_state(indexes[0])
        assert _index_state(indexes[0])[-1] == {}  # and its decisions with it
    assert links[1] == links[0]
