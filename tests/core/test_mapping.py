"""map: one table row per event type, plus parenting, status and privacy rules."""

from __future__ import annotations

import pytest

from nats_otel.core.decode import decode
from nats_otel.core.ids import event_span_id, identity, server_span_id, trace_context
from nats_otel.core.mapping import MappingOptions, Placement, map_message
from nats_otel.core.records import SpanKind, StatusCode
from tests.core.factories import PARENT_ID, TRACE_ID, TRACEPARENT, egress, ingress, message, raw, ts


def spans_of(doc, subject="trace.a", options=MappingOptions(), placement=None):
    msg = decode(raw(doc))
    ctx = trace_context(msg, subject)
    placement = placement or Placement(identity(msg), ctx.trace_id, ctx.parent_span_id)
    return map_message(msg, ctx, placement, options).spans


@pytest.mark.parametrize(
    "event, name, kind, attributes",
    [
        (egress(kind=0, name="worker", sub="orders.*", queue="q1"), "send orders.new", SpanKind.PRODUCER,
         {"messaging.nats.connection.kind": "client", "messaging.nats.connection.name": "worker",
          "messaging.nats.subscription.subject": "orders.*", "messaging.consumer.group.name": "q1",
          "messaging.nats.account": "A", "messaging.operation.type": "send", "messaging.client.id": "7"}),
        (egress(kind=1, name="s2", hop="1"), "send orders.new", SpanKind.PRODUCER,
         {"messaging.nats.connection.kind": "router", "messaging.nats.trace.hop": "1",
          "messaging.nats.peer.server.name": "s2", "messaging.client.id": None}),
        (egress(kind=2, name="w1", hop="2"), "send orders.new", SpanKind.PRODUCER,
         {"messaging.nats.connection.kind": "gateway"}),
        (egress(kind=4, name="leaf", hop="3"), "send orders.new", SpanKind.PRODUCER,
         {"messaging.nats.connection.kind": "leaf"}),
        ({"type": "sm", "ts": ts(150), "to": "orders.mapped"}, "map orders.mapped", SpanKind.INTERNAL,
         {"messaging.nats.mapping.from": "orders.new", "messaging.nats.mapping.to": "orders.mapped"}),
        ({"type": "se", "ts": ts(150), "acc": "B", "to": "froma.orders.new"}, "stream export B", SpanKind.INTERNAL,
         {"messaging.nats.export.account": "B", "messaging.nats.export.subject": "froma.orders.new"}),
        ({"type": "si", "ts": ts(150), "acc": "A", "from": "asvc.x", "to": "svc.x"}, "service import A",
         SpanKind.INTERNAL, {"messaging.nats.import.account": "A", "messaging.nats.import.from": "asvc.x",
                             "messaging.nats.import.to": "svc.x"}),
        ({"type": "js", "ts": ts(150), "stream": "ORDERS", "subject": "orders.new"}, "store ORDERS", SpanKind.INTERNAL,
         {"messaging.nats.jetstream.stream": "ORDERS", "messaging.nats.jetstream.no_interest": False,
          "messaging.operation.type": "process", "messaging.operation.name": "store"}),
        ({"type": "js", "ts": ts(150), "stream": "INTEREST", "nointerest": True}, "store INTEREST", SpanKind.INTERNAL,
         {"messaging.nats.jetstream.no_interest": True, "messaging.destination.name": "orders.new"}),
    ],
)
def test_event_mappers(event, name, kind, attributes):
    server, child = spans_of(message(ingress(t=100), event))
    assert (child.name, child.kind) == (name, kind)
    assert child.parent_span_id == server.span_id
    assert child.start_ns == server.start_ns and child.end_ns == server.end_ns
    assert child.status_code == StatusCode.UNSET
    for key, value in attributes.items():
        assert child.attribute(key) == value, key


def test_server_span():
    doc = message(ingress(t=100), egress(t=300), egress(t=250, name="other"), hops=0)
    server = spans_of(doc)[0]
    assert server.name == "receive orders.new" and server.kind == SpanKind.CONSUMER
    assert server.trace_id.hex() == TRACE_ID and server.parent_span_id.hex() == PARENT_ID
    assert server.end_ns - server.start_ns == 200
    assert server.resource.get("service.name") == "nats-server"
    assert server.resource.get("messaging.nats.server.name") == "s1"
    assert server.resource.get("messaging.nats.server.cluster") == "c1"
    assert server.attribute("messaging.system") == "nats"
    assert server.attribute("messaging.nats.header.traceparent") == (TRACEPARENT,)
    assert server.attribute("messaging.client.id") == "5"  # the publishing client's cid


def test_subject_follows_mapping_and_service_import():
    doc = message(
        ingress(subj="a.b"),
        {"type": "sm", "ts": ts(110), "to": "c.d"},
        {"type": "si", "ts": ts(120), "acc": "B", "from": "c.d", "to": "svc.d"},
        egress(t=130),
    )
    assert spans_of(doc)[-1].name == "send svc.d"
    assert spans_of(doc)[-1].attribute("messaging.nats.account") == "B"


def test_downstream_server_parent_is_upstream_egress_with_same_hop(core):
    origin = message(ingress(), egress(kind=2, name="w1", hop="1"), server="e1")
    down = message(
        ingress(kind=2, name="e1", t=400),
        egress(t=500),
        server="w1",
        headers={"traceparent": [TRACEPARENT], "Nats-Trace-Hop": ["1"]},
    )
    up, down_result = core.convert_batch([raw(origin), raw(down)])
    up_spans, down_spans = up.spans, down_result.spans
    assert down_spans[0].parent_span_id == up_spans[1].span_id
    assert down_result.link == "matched" and down_spans[0].attribute("messaging.nats.trace.link") is None
    assert up_spans[1].attribute("messaging.nats.trace.hop") == "1"


def test_client_republish_with_stale_hop_header_is_an_origin():
    doc = message(ingress(kind=0), egress(), headers={"traceparent": [TRACEPARENT], "Nats-Trace-Hop": ["1"]})
    server = spans_of(doc)[0]
    assert server.parent_span_id.hex() == PARENT_ID and server.attribute("messaging.nats.trace.hop") is None


@pytest.mark.parametrize(
    "error, code",
    [
        ("Not delivered because subscription is closed", StatusCode.ERROR),
        ("Not delivered because remote does not support message tracing", StatusCode.ERROR),
        ("Message delivered but remote does not support message tracing so no trace event generated from there",
         StatusCode.UNSET),
    ],
)
def test_egress_errors(error, code):
    child = spans_of(message(ingress(), egress(kind=1, name="s2", hop="1", error=error)))[1]
    assert child.status_code == code
    if code == StatusCode.ERROR:
        assert child.status_message == error
    else:
        assert child.attribute("messaging.nats.trace.note") == error


def test_ingress_and_jetstream_errors():
    server = spans_of(message(ingress(error='Permissions Violation for Publish to "x"')))[0]
    assert server.status_code == StatusCode.ERROR and server.status_message.startswith("Permissions")
    js_event = {"type": "js", "ts": ts(150), "stream": "S", "error": "insufficient resources"}
    js = spans_of(message(ingress(), js_event))[1]
    assert js.status_code == StatusCode.ERROR and js.status_message == "insufficient resources"


def test_header_allow_list_keeps_application_headers_out():
    headers = {"traceparent": [TRACEPARENT], "Authorization": ["Bearer secret"], "Nats-Msg-Id": ["m1"]}
    server = spans_of(message(ingress(), headers=headers))[0]
    keys = [k for k, _ in server.attributes]
    assert "messaging.nats.header.authorization" not in keys
    assert not any("secret" in str(v) for _, v in server.attributes)
    assert server.attribute("messaging.nats.header.nats-msg-id") == ("m1",)
    options = MappingOptions(header_allowlist=frozenset({"authorization"}))
    allowed = spans_of(message(ingress(), headers=headers), options=options)[0]
    assert allowed.attribute("messaging.nats.header.authorization") == ("Bearer secret",)


def test_two_messages_under_one_traceparent_share_no_span_id():
    # Same traceparent, same server, same hop: only the ingress time differs (a batch
    # published under one producer span). Nothing may be shared but the trace and parent.
    first = spans_of(message(ingress(), egress(kind=1, name="s2", hop="1"), egress()))
    again = spans_of(message(ingress(t=101), egress(kind=1, name="s2", hop="1"), egress()))
    assert not {s.span_id for s in first} & {s.span_id for s in again}
    assert {s.trace_id for s in first + again} == {bytes.fromhex(TRACE_ID)}
    assert first[0].parent_span_id == again[0].parent_span_id == bytes.fromhex(PARENT_ID)


def test_a_restarted_server_gives_new_ids_for_the_same_times():
    # A restart changes the server id and keeps its name; even an identical report differs.
    before = spans_of(message(ingress(), egress(kind=1, name="s2", hop="1")))
    after = spans_of(message(ingress(), egress(kind=1, name="s2", hop="1"), server_id="NRESTARTED"))
    assert not {s.span_id for s in before} & {s.span_id for s in after}


def test_span_ids_depend_on_identity_and_position():
    msg = decode(raw(message(ingress())))
    ctx = trace_context(msg, "t")
    ident = identity(msg)
    other = identity(decode(raw(message(ingress(cid=99)))))
    ids = {server_span_id(ctx, ident), server_span_id(ctx, other), event_span_id(ctx, ident, 1),
           event_span_id(ctx, ident, 2), event_span_id(ctx, other, 1), event_span_id(ctx, ident, 300)}
    assert len(ids) == 6


def test_placement_sets_parent_trace_and_link_attributes():
    doc = message(ingress(kind=1, name="s1"), headers={"traceparent": [TRACEPARENT], "Nats-Trace-Hop": ["1"]})
    msg = decode(raw(doc))
    placement = Placement(identity(msg), b"\x07" * 16, b"\x05" * 8, "ambiguous", 3)
    server = spans_of(doc, placement=placement)[0]
    assert (server.trace_id, server.parent_span_id) == (b"\x07" * 16, b"\x05" * 8)
    assert server.attribute("messaging.nats.trace.link") == "ambiguous"
    assert server.attribute("messaging.nats.trace.link.candidates") == 3
    matched = spans_of(doc, placement=placement._replace(link="matched", candidates=0))[0]
    assert matched.attribute("messaging.nats.trace.link") is None


@pytest.mark.parametrize(
    "headers, expected",
    [
        ({"Nats-Trace-Dest": ["t.x"], "Nats-Trace-Only": ["true"]}, True),
        ({"Nats-Trace-Dest": ["t.x"], "Nats-Trace-Only": ["1"]}, True),
        ({"Nats-Trace-Dest": ["t.x"]}, None),
        # traced for its traceparent: the server ignores Nats-Trace-Only and delivers
        ({"traceparent": [TRACEPARENT], "Nats-Trace-Only": ["true"]}, None),
    ],
)
def test_trace_only_only_where_the_server_honours_it(headers, expected):
    server = spans_of(message(ingress(), egress(), headers=headers))[0]
    assert server.attribute("messaging.nats.trace.only") is expected


@pytest.mark.parametrize(
    "template, cluster, expected",
    [
        ("nats-server", "c1", "nats-server"),
        ("nats/{cluster}", "c1", "nats/c1"),
        ("nats/{cluster}", "", "nats/s1"),  # no cluster (standalone, leafnode): a cluster of its own
        ("nats/{server}", "c1", "nats/s1"),
        ("{cluster}:{server}", "c1", "c1:s1"),
    ],
)
def test_service_name_template_names_each_server(template, cluster, expected):
    server = spans_of(message(ingress(), cluster=cluster), options=MappingOptions(service_name=template))[0]
    assert server.resource.get("service.name") == expected


@pytest.mark.parametrize("template", ["nats/{zone}", "nats/{0}", "nats/{cluster", "  "])
def test_service_name_template_with_unknown_fields_is_refused(template):
    with pytest.raises(ValueError, match="service name"):
        MappingOptions(service_name=template)
