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


def test_senders_long_silent_are_forgotten_when_the_bound_is_reached(monkeypatch):
    """Each start of a bridge is a sender of its own: the bound on senders followed must not
    fill up for good over restarts. One forgotten and heard again is first heard mid-way."""
    import nats_otel.bridge.exchange as exchange_module

    monkeypatch.setattr(exchange_module, "_SENDERS", 2)
    exchange = _exchange()
    exchange._numbered(PeerBatch("old", ()), "1")
    exchange._numbered(PeerBatch("b", ()), "1")
    assert exchange._numbered(PeerBatch("c", ()), "1").missed == 1  # full, all recent: not followed
    last, missed, _ = exchange._numbers["old"]
    exchange._numbers["old"] = (last, missed, -1e9)  # silent for ages
    exchange._pruned = -1e9
    assert exchange._numbered(PeerBatch("c", ()), "1").missed == 0 and "old" not in exchange._numbers
    again = exchange._numbered(PeerBatch("b", ()), "2")
    assert again.missed == 0
