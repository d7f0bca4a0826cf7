"""Who owns the traces, as one bridge hears its peers (`bridge/routing.Router`'s membership):
a peer that fell silent, or whose connection went (a 503 to a forward), and is heard again
is a member again; one that said goodbye never is. Left out, such a peer would go on owning
its share by its own view while this bridge forwarded that share elsewhere: every hop across
the two unlinked until one of them restarted. The real processes' case (a bridge stalled
past the silence, then resumed) is in `test_hop_links.py`."""

from __future__ import annotations

import time

import pytest

from nats_otel.bridge import routing
from nats_otel.bridge.intake import Intake
from nats_otel.bridge.routing import MEMBER_SILENCE_S, Leaving, Router
from nats_otel.bridge.telemetry import Metrics

ME, PEER = "bridge-a", "bridge-b"


def _router() -> tuple[Router, Metrics]:
    metrics = Metrics()
    router = Router("nats-otel.links.test", ME, Intake(1 << 20), metrics, lambda: None)
    assert router.heard(PEER, bye=False)  # new: answered at once
    return router, metrics


def _members(router: Router, metrics: Metrics) -> list[str]:
    assert metrics.registry.get_sample_value("nats_otel_route_members") == len(router.ring)
    return sorted(router.ring.members)


def _fall_silent(router: Router, sender: str) -> None:
    """The peer was last heard `MEMBER_SILENCE_S` and more ago; the tick finds it so."""
    router._peers[sender] = time.monotonic() - MEMBER_SILENCE_S - 0.1
    router.tick()


def test_a_peer_that_fell_silent_is_a_member_again_when_heard():
    router, metrics = _router()
    assert _members(router, metrics) == [ME, PEER]
    _fall_silent(router, PEER)
    assert _members(router, metrics) == [ME]
    assert router.heard(PEER, bye=False)  # back: a newcomer again, answered at once
    assert _members(router, metrics) == [ME, PEER]
    assert not router.heard(PEER, bye=False)  # and heard as any member after


def test_a_peer_whose_connection_went_is_heard_again_only_after_its_late_heartbeats(monkeypatch):
    """A 503 to a forward: a heartbeat the peer sent before its connection went may come
    after the answer (ignored); one later is from its new connection (it reconnected)."""
    monkeypatch.setattr(routing, "REJOIN_AFTER_S", 0.2)
    router, metrics = _router()
    router._leave(PEER, Leaving.NO_RESPONDERS)
    assert not router.heard(PEER, bye=False)
    assert _members(router, metrics) == [ME]
    time.sleep(0.25)
    assert router.heard(PEER, bye=False)
    assert _members(router, metrics) == [ME, PEER]


def test_a_peer_that_said_goodbye_stays_gone():
    router, metrics = _router()
    assert not router.heard(PEER, bye=True)
    assert _members(router, metrics) == [ME]
    for _ in range(3):
        assert not router.heard(PEER, bye=False)
    assert _members(router, metrics) == [ME]


@pytest.mark.parametrize("why", list(Leaving))
def test_every_leave_and_return_changes_the_view_once(why, monkeypatch):
    monkeypatch.setattr(routing, "REJOIN_AFTER_S", 0.0)
    router, metrics = _router()
    views = metrics.registry.get_sample_value("nats_otel_route_views_total")
    if why is Leaving.SILENT:
        _fall_silent(router, PEER)
    else:
        router._leave(PEER, why)
    router.heard(PEER, bye=False)
    router.heard(PEER, bye=False)
    changes = metrics.registry.get_sample_value("nats_otel_route_views_total") - views
    assert changes == (1 if why is Leaving.GOODBYE else 2), changes


def test_this_bridges_own_stall_is_not_its_peers_silence():
    """A tick long after the one before (this bridge's loop stalled: what its peers said waits
    unread) does not count the stall against them; a peer silent while it listened leaves."""
    router, metrics = _router()
    router.tick()
    router._ticked_at -= MEMBER_SILENCE_S + 2  # the loop stalled that long since the last tick
    router._peers[PEER] = time.monotonic() - MEMBER_SILENCE_S - 1  # last heard just before it
    router.tick()
    assert _members(router, metrics) == [ME, PEER]
    _fall_silent(router, PEER)  # silent while it listened (ticks on time)
    assert _members(router, metrics) == [ME]
