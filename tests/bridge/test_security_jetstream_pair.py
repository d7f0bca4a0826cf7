"""docs/security.md's least-privilege user of JetStream bridges on one durable: the stream's
permissions (as for a bridge alone) plus the link exchange's subjects and the kept-evidence
stream's API. Two bridges with exactly these permissions share the traces (forwards
answered, acks on the answers), keep their evidence and replay it, and the server reports
no permissions violation for them; an administrator creates both streams."""

from __future__ import annotations

from pathlib import Path

import nats
import pytest

from nats_otel.bridge.settings import load_settings
from nats_otel.devkit.receivers import OTLPGrpcReceiver
from tests.bridge.bridge_helpers import bridge_counts, publish_traced, start_bridge, stop_bridge, wait_until
from tests.bridge.test_security_bridge import (
    APP_PASSWORD,
    JS_PERMISSIONS,
    denied,
    nats_server,
    new_nkey_user,
    trace_ids,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

LINKS = "NATS_OTEL_LINKS_nats-otel"
# docs/security.md, "JetStream bridges on one durable": added to JS_PERMISSIONS' lists.
PAIR_PUBLISH = [
    "nats-otel.links.nats-otel", "nats-otel.links.nats-otel.>",
    f"$JS.API.STREAM.INFO.{LINKS}", f"$JS.API.CONSUMER.CREATE.{LINKS}.>", f"$JS.API.CONSUMER.MSG.NEXT.{LINKS}.*",
]
PAIR_SUBSCRIBE = ["nats-otel.links.nats-otel", "nats-otel.links.nats-otel.>"]


def _pair_permissions() -> str:
    publish = ", ".join(f'"{subject}"' for subject in PAIR_PUBLISH)
    subscribe = ", ".join(f'"{subject}"' for subject in PAIR_SUBSCRIBE)
    return (JS_PERMISSIONS.replace('"$JS.ACK.NATS_TRACES.nats-otel.>"', f'"$JS.ACK.NATS_TRACES.nats-otel.>", {publish}')
            .replace('subscribe: { allow: ["_INBOX.>"] }', f'subscribe: {{ allow: ["_INBOX.>", {subscribe}] }}'))


async def test_jetstream_bridges_on_one_durable_with_the_documented_permissions(tmp_path: Path) -> None:
    public, seed = new_nkey_user(tmp_path, "bridge")
    users = f"      {{ nkey: {public}, permissions: {_pair_permissions()} }}"
    with nats_server(tmp_path, users, jetstream=True) as hostport, OTLPGrpcReceiver() as rx:
        url = f"nats://{hostport}"
        app_url = f"nats://app:{APP_PASSWORD}@{hostport}"
        admin = await nats.connect(app_url)
        await admin.jetstream().add_stream(name="NATS_TRACES", subjects=["trace.a"])
        await admin.jetstream().add_stream(name=LINKS, subjects=["nats-otel.links.nats-otel",
                                                                 "nats-otel.links.nats-otel.kept"], max_age=120)
        await admin.close()
        # Still denied: deleting either stream, pulling another durable.
        for subject in ("$JS.API.STREAM.DELETE.NATS_TRACES", f"$JS.API.STREAM.DELETE.{LINKS}",
                        "$JS.API.CONSUMER.MSG.NEXT.NATS_TRACES.other"):
            assert "permissions violation" in await denied(url, lambda nc, s=subject: nc.publish(s, b""),
                                                           nkeys_seed=str(seed))
        settings = load_settings(env={}, overrides={
            "mode": "jetstream",
            "sources": [{"urls": [url], "subjects": ["trace.a"], "nkey_seed": str(seed)}],
            "otlp": {"endpoint": rx.endpoint},
        })
        pair = [await start_bridge(settings), await start_bridge(settings)]
        try:
            await wait_until(lambda: all(len(b.router.ring) == 2 for b, _ in pair), 10, "each hears the other")
            ids = await publish_traced(app_url, 60)

            def total(name: str, **labels: str) -> float:
                return sum(b.metrics.value(name, labels) or 0.0 for b, _ in pair)

            def state() -> str:  # what explains a timeout: each bridge's account, the routing's, the holds
                routed = {r: total("nats_otel_routed_total", result=r)
                          for r in ("forwarded", "received", "answered", "unanswered", "refused", "rerouted")}
                return (f"{len(set(ids) - trace_ids(rx))} of {len(ids)} traces missing; "
                        + " | ".join(bridge_counts(b) for b, _ in pair)
                        + f"; routed {routed}; held {total('nats_otel_link_held_total')}; acks "
                        + str({k: total("nats_otel_jetstream_acks_total", kind=k) for k in ("ack", "nak", "term")}))

            await wait_until(lambda: trace_ids(rx) >= set(ids), 30, "spans with the least-privilege users",
                             detail=state)

            await wait_until(lambda: total("nats_otel_jetstream_acks_total", kind="ack") >= 60, 20, "acks allowed")
            forwarded = total("nats_otel_routed_total", result="forwarded")
            assert forwarded > 0 and total("nats_otel_routed_total", result="answered") == forwarded
            for result in ("unkept", "unpublished", "unheard"):
                assert total("nats_otel_link_evidence_total", result=result) == 0, result
        finally:
            codes = [await stop_bridge(b, task) for b, task in pair]
        assert codes == [0, 0]
        violations = [line for line in (tmp_path / "server.log").read_text().splitlines()
                      if "nats-otel-bridge" in line and "violation" in line.lower()]
        assert violations == []  # the server's own word: nothing the bridges did was refused
        admin = await nats.connect(app_url)
        kept = await admin.jetstream().stream_info(LINKS)
        info = await admin.jetstream().consumer_info("NATS_TRACES", "nats-otel")
        await admin.close()
        assert kept.state.messages > 0  # the evidence was kept, on `.kept`
        assert info.num_ack_pending == 0 and info.num_pending == 0
