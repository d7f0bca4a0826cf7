"""The link exchange numbers each sender's batches: one that never arrived (lost on the way,
or dropped here for a busy conversion thread) counts as a loss of the sender's streams, so
what they vouched for before proves nothing after (`ReportLedger.vouch`)."""

from __future__ import annotations

from nats_otel.bridge.exchange import LinkExchange
from nats_otel.core.evidence import PeerBatch


def _exchange() -> LinkExchange:
    return LinkExchange("links", None, metrics=None, record=lambda *a: None, pool=None)


def test_batches_in_order_miss_nothing_and_a_gap_counts_each_batch_missed():
    exchange = _exchange()
    seen = [exchange._numbered(PeerBatch("a", ()), str(n)).missed for n in (1, 2, 3, 6, 7)]
    assert seen == [0, 0, 0, 2, 2]
    first = exchange._numbered(PeerBatch("b", ()), "4")
    # Its first three went out before this bridge listened: not a loss, but what it received
    # before then is not vouched for here.
    assert first.missed == 0 and first.trusted_from_ns is not None
    assert exchange._numbered(PeerBatch("b", ()), "5") == PeerBatch("b", (), missed=0,
                                                                   trusted_from_ns=first.trusted_from_ns)
    assert exchange._numbered(PeerBatch("a", ()), "8").trusted_from_ns is None  # heard of from its first


def test_unnumbered_or_repeated_batches_are_doubted():
    exchange = _exchange()
    assert exchange._numbered(PeerBatch("a", ()), "1").missed == 0
    assert exchange._numbered(PeerBatch("a", ()), "1").missed == 1  # again: a replay, out of order
    assert exchange._numbered(PeerBatch("a", ()), None).missed == 2
    assert exchange._numbered(PeerBatch("a", ()), "x").missed == 3
    assert exchange._numbered(PeerBatch("a", ()), "2").missed == 3
