"""A bridge in a queue group counts on hearing its peers on the link exchange: their streams
are members of its report ledger, and a member never heard of would let it call a stretch of
a server's reports complete that was routed to that member (docs/span-model.md, "Completeness
the bridge proves"). One whose user may not publish there (docs/security.md's least-privilege
user of a bridge alone, given a queue group) hears nobody, not even itself: it must say so
(`nats_otel_link_evidence_total{result="unheard"}`, logged) and vouch for nothing, so that
alike messages link by their numbers alone and never wrong. With the permission it hears its
own heartbeat and vouches as before. Real nats-server, real permissions."""

from __future__ import annotations

from pathlib import Path

import pytest

from nats_otel.bridge.settings import load_settings
from tests.bridge.bridge_helpers import start_bridge, stop_bridge, wait_until
from tests.bridge.test_security_bridge import nats_server

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

PASSWORD = "bridge-Pa55word-QX7"
# docs/security.md's "Core mode in a queue group" user (queue `g`), and the same denied publishing.
EXCHANGE = '"nats-otel.links.g", "nats-otel.links.g.>"'
SUBSCRIBE = f'subscribe: {{ allow: ["trace.a", {EXCHANGE}] }}'
DENIED = f'{{ publish: {{ deny: [">"] }}, {SUBSCRIBE} }}'
ALLOWED = f'{{ publish: {{ allow: [{EXCHANGE}] }}, {SUBSCRIBE} }}'


def _unheard(bridge) -> float:
    return bridge.metrics.value("nats_otel_link_evidence_total", {"result": "unheard"})


@pytest.mark.parametrize(("permissions", "hears"), [(DENIED, False), (ALLOWED, True)], ids=["denied", "allowed"])
async def test_a_queue_group_bridge_vouches_only_once_it_hears_itself_on_the_exchange(
        tmp_path: Path, permissions: str, hears: bool) -> None:
    users = f'      {{ user: bridge, password: "{PASSWORD}", permissions: {permissions} }}'
    with nats_server(tmp_path, users) as hostport:
        settings = load_settings(env={}, overrides={
            "sources": [{"urls": [f"nats://{hostport}"], "subjects": ["trace.a"], "queue": "g",
                         "user": "bridge", "password": PASSWORD}],
            "export_otlp": False, "output": str(tmp_path / "spans.otlp.jsonl"),
        })
        bridge, task = await start_bridge(settings)
        try:
            assert bridge.exchange is not None
            if hears:
                await wait_until(lambda: bridge.exchange.heard_itself, 10, "its own heartbeat")
                assert bridge.vouching
            else:
                # Three heartbeats unheard (a second apart) before it says so.
                await wait_until(lambda: _unheard(bridge) >= 1, 20, "the exchange counted unheard")
                assert not bridge.exchange.heard_itself
                assert not bridge.vouching
        finally:
            assert await stop_bridge(bridge, task) == 0
        assert (_unheard(bridge) == 0) is hears


async def test_a_bridge_that_owns_no_traces_is_no_member_of_the_ring(tmp_path: Path) -> None:
    """Two bridges in queue group `g`, one with trace ownership (the default), one without
    (`link.ownership` off, as a build from before it): the second's heartbeats carry no view,
    so the first never takes it for an owner (it would forward it a share, answered 503, and
    take it back at its next heartbeat: the ring changing every second)."""
    users = f'      {{ user: bridge, password: "{PASSWORD}", permissions: {ALLOWED} }}'
    with nats_server(tmp_path, users) as hostport:
        def settings(name: str, ownership: bool):
            return load_settings(env={}, overrides={
                "sources": [{"urls": [f"nats://{hostport}"], "subjects": ["trace.a"], "queue": "g",
                             "user": "bridge", "password": PASSWORD}],
                "export_otlp": False, "output": str(tmp_path / f"{name}.otlp.jsonl"),
                "link": {"ownership": ownership},
            })
        owner, owner_task = await start_bridge(settings("owner", True))
        other, other_task = await start_bridge(settings("other", False))
        try:
            assert owner.router is not None and other.router is None
            # The owner hears the other's heartbeats (it heard its own: the exchange works)...
            await wait_until(lambda: owner.exchange.heard_itself and other.exchange.heard_itself, 10, "heartbeats")
            heard = owner.exchange._numbers  # every sender's batches followed, heartbeats too
            await wait_until(lambda: heard.get(other.exchange.sender, (0,))[0] >= 2, 10, "the other's heartbeats")
            # ... and keeps owning alone.
            assert owner.metrics.value("nats_otel_route_members") == 1
            assert list(owner.router.ring.members) == [owner.exchange.sender]
        finally:
            assert await stop_bridge(other, other_task) == 0
            assert await stop_bridge(owner, owner_task) == 0
