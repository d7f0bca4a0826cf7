"""`ReportLedger.vouch`: a receiver that lost nothing vouches for the gaps in a server's
numbers (its other events), and only then."""

from __future__ import annotations

from nats_otel.core.report_ledger import ReportLedger


def _ledger(*seqs: int) -> ReportLedger:
    ledger = ReportLedger(capacity=1000, retention_s=30.0)
    for seq in seqs:
        ledger.observe(b"r%d" % seq, "S1", seq, seq * 1000, 0.0)
    return ledger


def test_reports_on_one_stream_with_no_loss_between_make_one_run():
    ledger = _ledger(10, 13, 20)
    assert not ledger.complete(b"r10", b"r20")  # gaps: 11-12, 14-19
    for seq in (10, 13, 20):
        ledger.vouch("a", "S1", seq, breaks=0)
    assert ledger.complete(b"r10", b"r20")
    assert ledger.runs()["S1"] == ((10, 20, 10_000, 20_000),)


def test_a_loss_between_two_reports_leaves_the_gap():
    ledger = _ledger(10, 13, 20)
    ledger.vouch("a", "S1", 10, breaks=0)
    ledger.vouch("a", "S1", 13, breaks=1)  # the stream lost something before 13 arrived
    ledger.vouch("a", "S1", 20, breaks=1)
    assert not ledger.complete(b"r10", b"r13")
    assert ledger.complete(b"r13", b"r20")


def test_streams_and_servers_are_vouched_for_apart_and_out_of_order_vouches_nothing():
    ledger = _ledger(10, 13, 20)
    ledger.observe(b"t5", "S2", 5, 0, 0.0)
    ledger.observe(b"t9", "S2", 9, 0, 0.0)
    ledger.vouch("a", "S1", 10, breaks=0)
    ledger.vouch("b", "S1", 13, breaks=0)  # another stream: says nothing of what "a" received
    ledger.vouch("a", "S2", 5, breaks=0)
    ledger.vouch("a", "S2", 9, breaks=0)
    assert not ledger.complete(b"r10", b"r13") and ledger.complete(b"t5", b"t9")
    ledger.vouch("a", "S1", 20, breaks=0)
    ledger.vouch("a", "S1", 13, breaks=0)  # came after 20: a redelivery, joins nothing more
    assert ledger.runs()["S1"] == ((10, 20, 10_000, 20_000),)


def test_a_server_numbering_anew_is_not_vouched_for():
    ledger = _ledger(5, 300_000)
    ledger.vouch("a", "S1", 5, breaks=0)
    ledger.vouch("a", "S1", 300_000, breaks=0)  # wider than any burst of other events
    assert not ledger.complete(b"r5", b"r300000")
