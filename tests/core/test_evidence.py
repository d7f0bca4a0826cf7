"""Hop evidence shared between bridges (`evidence`): what one bridge observes, another
records, with the same links as if it had observed the reports itself; anything malformed,
oversized, of another format or not signed with the shared key is refused with a reason."""

from __future__ import annotations

from collections import Counter

import msgspec
import pytest

from nats_otel.core import evidence
from nats_otel.core.pipeline import Converted


def _links(results) -> Counter:
    return Counter(r.link for r in results if isinstance(r, Converted))


def test_evidence_from_other_bridges_links_as_one_bridge(core, corpus_raws):
    whole = core.convert_batch(corpus_raws)
    # Two bridges of one queue group: each receives every other report.
    mine, theirs = corpus_raws[::2], corpus_raws[1::2]
    bridge, other = core.Converter(), core.Converter()
    bridge.observe_many(mine)
    other.observe_many(theirs)
    shared = evidence.encode_batch("other", [evidence.evidence_of(p) for p in core.observed(other, theirs)])
    sender, reports = evidence.decode_batch(shared)
    assert sender == "other" and len(reports) == len(core.observed(other, theirs))
    alone = core.Converter()
    alone.observe_many(mine)
    evidence.observe_evidence(bridge.linker, reports)
    exchanged = bridge.convert_many(mine)
    by_position = {id(raw): result for raw, result in zip(corpus_raws, whole, strict=True)}
    expected = [by_position[id(raw)] for raw in mine]
    assert exchanged == expected  # the same spans, parents included, as one bridge with everything
    assert _links(alone.convert_many(mine))["unmatched"] > _links(exchanged)["unmatched"]


def test_bad_batches_are_refused_with_a_reason(core, corpus_raws):
    converter = core.Converter()
    converter.observe_many(corpus_raws[:20])
    good = evidence.encode_batch("b", [evidence.evidence_of(p) for p in core.observed(converter, corpus_raws[:20])])
    key = b"k" * 32
    cases = {
        "malformed": b"\xc1not msgpack",
        "invalid": msgspec.msgpack.encode([1, "b", [["ident", 5]]]),
        "format": msgspec.msgpack.encode([evidence.EVIDENCE_FORMAT + 1, "b", []]),
    }
    for reason, data in cases.items():
        with pytest.raises(evidence.EvidenceError) as caught:
            evidence.decode_batch(data)
        assert caught.value.reason == reason
    for signature in (None, "0" * 32, evidence.sign(b"x" * 32, good)):
        with pytest.raises(evidence.EvidenceError) as caught:
            evidence.decode_batch(good, key, signature)
        assert caught.value.reason == "forged"
    assert evidence.decode_batch(good, key, evidence.sign(key, good))[0] == "b"
    # Bounds: a batch of more reports than allowed is refused whole.
    huge = msgspec.msgpack.encode([evidence.EVIDENCE_FORMAT, "b", [msgspec.msgpack.decode(good)[2][0]] * 10_001])
    with pytest.raises(evidence.EvidenceError) as caught:
        evidence.decode_batch(huge)
    assert caught.value.reason == "invalid"


def test_egress_span_ids_are_worked_out_not_read(core, corpus_raws):
    """Evidence names an egress by its report and position: the span id is the one that
    report's egress span has, whatever else a sender might want it to be."""
    converter = core.Converter()
    converter.observe_many(corpus_raws)
    prepared = [p for p in core.observed(converter, corpus_raws) if p.egresses()]
    report = evidence.evidence_of(prepared[0])
    other = core.Converter()
    evidence.observe_evidence(other.linker, [report])
    held = {egress.span_id for key, egresses, _ in other.linker.index.held() for egress in egresses}
    assert held == {egress.span_id for _, egress in prepared[0].egresses()}
    # A position of 0 names no event: such an egress is not recorded.
    forged = msgspec.structs.replace(report, egresses=tuple(msgspec.structs.replace(e, position=0)
                                                            for e in report.egresses))
    fresh = core.Converter()
    evidence.observe_evidence(fresh.linker, [forged])
    assert not any(egresses for _, egresses, _ in fresh.linker.index.held())


def test_a_sibling_workers_numbers_complete_the_ledger(core, corpus_raws):
    """Worker processes split a server's reports by trace: a sibling's event numbers
    (`encode_numbers`) give each worker's ledger the runs one process would see."""
    one, mine, sibling = core.Converter(), core.Converter(), core.Converter()
    one.observe_many(corpus_raws)
    ours, theirs = corpus_raws[::2], corpus_raws[1::2]
    mine.observe_many(ours)
    sibling.observe_many(theirs)
    ledger = mine.linker.index.sequences.ledger
    alone = ledger.runs()
    evidence.observe_numbers(mine.linker, evidence.encode_numbers(core.observed(sibling, theirs)))
    whole = one.linker.index.sequences.ledger.runs()
    assert ledger.runs() == whole != alone
    assert len(ledger) == len(core.observed(mine, ours))  # identities: only this worker's reports


def _peer_vouches(core, corpus_raws, missed: int) -> tuple[bool, bool]:
    """A bridge that received every other report on its stream "default" (lost nothing),
    and a peer's batch of the rest with its stream's state: whether a stretch of one server's
    reports is complete here before and after the peer's batch is recorded."""
    mine, theirs = corpus_raws[::2], corpus_raws[1::2]
    bridge, other = core.Converter(), core.Converter()
    ledger = bridge.linker.index.sequences.ledger
    ledger.receiving = ("default", 0)
    bridge.observe_many(mine)
    ledger.receiving = None
    ledger.whole("default", 0, 0, 2**62)
    other.observe_many(theirs)
    ours = {p.ident: p.msg for p in core.observed(bridge, mine)}
    peers = list(core.observed(other, theirs))
    first_of_peer = {}
    for p in peers:
        first_of_peer[p.msg.server.id] = min(first_of_peer.get(p.msg.server.id, 1 << 62), p.msg.seq)
    # A server whose first report here came before the peer's first of it.
    by_server: dict[str, list[tuple[int, bytes]]] = {}
    for ident, msg in ours.items():
        by_server.setdefault(msg.server.id, []).append((msg.seq, ident))
    seqs = next(sorted(v) for s, v in sorted(by_server.items())
                if len(v) > 1 and s in first_of_peer and min(v)[0] < first_of_peer[s] < max(v)[0])
    first, last = seqs[0][1], seqs[-1][1]
    before = ledger.complete(first, last)
    state = evidence.StreamState("default", 0, 0, 2**62)
    data = evidence.encode_batch("other", [evidence.evidence_of(p, 0, 0) for p in peers], (), [state])
    batch = evidence.decode_peer_batch(data)
    assert batch.streams == (state,) and len(batch.reports) == len(peers)
    recorded = evidence.PeerBatch(batch.sender, batch.reports, batch.latencies, batch.streams, missed)
    evidence.observe_evidence(bridge.linker, batch.reports, 0.0, batch.latencies, recorded)
    return before, ledger.complete(first, last)


def test_a_peers_streams_vouch_here_as_in_its_own_ledger(core, corpus_raws):
    """One bridge alone vouches for what its stream received; once a peer shares the
    reports (a queue group), the gaps are complete only where the peer's stream vouches too."""
    before, after = _peer_vouches(core, corpus_raws, missed=0)
    assert before and after


def test_a_peers_missed_batch_is_a_loss_of_its_streams(core, corpus_raws):
    """A batch of the peer's that never arrived hid reports: from its first report recorded
    here on, its stream vouches anew, not for what came before."""
    before, after = _peer_vouches(core, corpus_raws, missed=1)
    assert before and not after
