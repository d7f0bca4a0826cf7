"""Properties of trace identity under reuse: one traceparent (or one ad-hoc destination)
carried by many messages, reports lost at random, any order. No two spans share an id, and
a downstream server span is never linked to another message's egress."""

from __future__ import annotations

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from nats_otel.core.decode import RawTraceMessage
from nats_otel.core.linking import AMBIGUOUS, MATCHED, UNMATCHED, LinkSettings
from nats_otel.core.pipeline import Converted
from nats_otel.core.timestamps import parse_rfc3339_ns
from tests.core.factories import TRACEPARENT
from tests.core.test_properties import _ts, traced_message_trees

# The generated trees forward within ~1 µs: a window of 10 µs covers every real hop, and
# copies published >= 1 ms apart are then told apart by time alone.
WINDOW = LinkSettings(max_hop_latency_s=10e-6, max_clock_skew_s=1e-6)
COPY_CID = 1000  # the ingress cid of every report of copy c is COPY_CID + c: ground truth


def copies_of(raws, offsets, adhoc=False, numbered=False):
    """The same traced message sent again under the same context, `offsets[c]` ns later;
    `numbered`: each server numbers its reports in time order (`server.seq`), nothing
    between them, so its numbers prove none lost."""
    out = []
    rank = {offset: at for at, offset in enumerate(sorted(offsets))}
    for copy, offset in enumerate(offsets):
        for raw in raws:
            doc = orjson.loads(raw.payload)
            if numbered:
                doc["server"]["seq"] = rank[offset] + 1
            for event in doc["events"]:
                event["ts"] = _ts(parse_rfc3339_ns(event["ts"]) + offset)
            doc["events"][0]["cid"] = COPY_CID + copy
            if adhoc:  # one fixed ad-hoc destination instead of a traceparent
                headers = doc["request"]["header"]
                del headers["traceparent"]
                headers["Nats-Trace-Dest"] = ["trace.debug"]
            out.append(RawTraceMessage("trace.debug" if adhoc else raw.subject, {}, orjson.dumps(doc)))
    return out


def copy_of(span, by_id):
    """The copy a span belongs to: its server span's ingress connection id."""
    while span.kind != 5:
        span = by_id[span.parent_span_id]
    return span.attribute("messaging.nats.connection.id") - COPY_CID


def check_no_false_links(results, app_parent, lost=frozenset()):
    """Unique ids; every link joins two reports of one message, unless it cannot be told:
    a wrong link needs *both* the true upstream report of the downstream one and the true
    downstream report of the egress lost (`lost`: (server name, copy) of lost reports),
    which leaves nothing in the reports to tell them apart."""
    spans = [s for r in results for s in r.spans]
    by_id = {s.span_id: s for s in spans}
    assert len(by_id) == len(spans), "two spans share an id"
    for result in results:
        server = result.spans[0]
        if result.link == MATCHED:
            egress = by_id[server.parent_span_id]
            up_copy, down_copy = copy_of(egress, by_id), copy_of(server, by_id)
            if up_copy != down_copy:
                upstream = server.attribute("messaging.nats.connection.name")
                downstream = server.resource.get("messaging.nats.server.name")
                assert (upstream, down_copy) in lost and (downstream, up_copy) in lost, "linked to another message"
            assert egress.end_ns <= server.start_ns + int(WINDOW.max_clock_skew_s * 1e9)
        elif result.link in (UNMATCHED, AMBIGUOUS):
            assert server.parent_span_id == app_parent
            assert server.attribute("messaging.nats.trace.link") == result.link
    return spans


offsets = st.lists(st.integers(0, 3_000), min_size=2, max_size=6, unique=True)


@settings(max_examples=80, deadline=None)
@given(traced_message_trees(), offsets, st.data())
def test_reused_traceparent_any_order_any_loss_never_links_wrong(core, tree, gaps, data):
    raws, parent = tree
    # Offsets in ns, some within one hop's latency (ambiguous), some far apart.
    sent = copies_of(raws, [g * data.draw(st.sampled_from([1, 1_000_000])) for g in gaps])
    keep = [data.draw(st.booleans()) or data.draw(st.booleans()) for _ in sent]  # ~25 % lost
    kept = [r for r, k in zip(sent, keep, strict=True) if k]
    lost = frozenset(_name_and_copy(r) for r, k in zip(sent, keep, strict=True) if not k)
    order = data.draw(st.permutations(kept))
    results = [r for r in core.convert_batch(order, link=WINDOW) if isinstance(r, Converted)]
    check_no_false_links(results, bytes.fromhex(parent), lost)
    # Any order: the same spans.
    in_order = {s for r in core.convert_batch(kept, link=WINDOW) for s in r.spans}
    assert {s for r in results for s in r.spans} == in_order


def _name_and_copy(raw):
    doc = orjson.loads(raw.payload)
    return doc["server"]["name"], doc["events"][0]["cid"] - COPY_CID


@settings(max_examples=60, deadline=None)
@given(traced_message_trees(), st.lists(st.integers(1, 50), min_size=2, max_size=5, unique=True))
def test_copies_far_apart_with_nothing_lost_are_all_linked(core, tree, gaps):
    """Alike copies under one context, far apart: each pair is alone in its window, but
    only the servers' numbers prove that no copy lost a report on each side (`linking`)."""
    raws, parent = tree
    sent = copies_of(raws, [g * 1_000_000 for g in gaps], numbered=True)
    results = core.convert_batch(sent, link=WINDOW)
    spans = check_no_false_links(results, bytes.fromhex(parent))
    assert all(r.link in ("", MATCHED) for r in results)
    # Fan-out reads right: one subtree per message under the producer span, in one trace.
    roots = [s for s in spans if s.parent_span_id == bytes.fromhex(parent)]
    assert len(roots) == len(gaps)
    assert len({s.trace_id for s in spans}) == 1


@settings(max_examples=60, deadline=None)
@given(traced_message_trees(), st.lists(st.integers(1, 50), min_size=2, max_size=5, unique=True),
       st.randoms(use_true_random=False))
def test_one_adhoc_destination_gives_each_message_its_own_trace(core, tree, gaps, rnd):
    raws, _ = tree
    sent = copies_of(raws, [g * 1_000_000 for g in gaps], adhoc=True, numbered=True)
    rnd.shuffle(sent)
    results = core.convert_batch(sent, link=WINDOW)
    spans = check_no_false_links(results, b"")
    by_id = {s.span_id: s for s in spans}
    traces = {}
    for span in spans:
        traces.setdefault(copy_of(span, by_id), set()).add(span.trace_id)
    assert all(len(ids) == 1 for ids in traces.values())  # one trace per message ...
    assert len({next(iter(ids)) for ids in traces.values()}) == len(gaps)  # ... each its own


@settings(max_examples=40, deadline=None)
@given(traced_message_trees(), offsets, st.data())
def test_redelivered_reports_keep_their_ids(core, tree, gaps, data):
    raws, _ = tree
    sent = copies_of(raws, [g * 1_000_000 for g in gaps])
    again = data.draw(st.lists(st.sampled_from(sent), max_size=len(sent)))
    once = {s for r in core.convert_batch(sent, link=WINDOW) for s in r.spans}
    twice = {s for r in core.convert_batch(sent + again, link=WINDOW) for s in r.spans}
    assert once == twice


def test_the_live_window_is_bounded_in_entries_and_counts_what_it_drops(core):
    converter = core.Converter(link=LinkSettings(capacity=100, retention_s=60))
    origin = {"server": {"name": "a", "id": "IDa"}, "request": {"header": {"traceparent": [TRACEPARENT]}, "msgsize": 9},
              "events": [{"type": "in", "ts": _ts(10**18), "kind": 0, "cid": COPY_CID, "name": "app", "acc": "A",
                          "subj": "x"}, {"type": "eg", "ts": _ts(10**18 + 5), "kind": 1, "cid": 3, "name": "b",
                                         "hop": "1"}]}
    sent = copies_of([RawTraceMessage("trace.a", {}, orjson.dumps(origin))], [g * 1_000_000 for g in range(400)])
    for now, raw in enumerate(sent):
        converter.observe(raw, now / 1000)
        converter.convert(raw, now / 1000)
    assert len(converter.linker.index) <= 100
    assert converter.linker.index.evicted == 300  # 400 egresses observed, 100 kept


def test_the_live_window_forgets_by_time(core):
    converter = core.Converter(link=LinkSettings(retention_s=1.0))
    tree_doc = {"server": {"name": "a", "id": "IDa"}, "request": {"header": {"traceparent": [TRACEPARENT]},
                "msgsize": 9}, "events": [{"type": "in", "ts": _ts(10**18), "kind": 0, "cid": COPY_CID,
                "name": "app", "acc": "A", "subj": "x"}, {"type": "eg", "ts": _ts(10**18 + 5), "kind": 1, "cid": 3,
                "name": "b", "hop": "1"}]}
    sent = copies_of([RawTraceMessage("trace.a", {}, orjson.dumps(tree_doc))], [g * 1_000_000 for g in range(50)])
    for now, raw in enumerate(sent):
        converter.observe(raw, float(now))
        converter.convert(raw, float(now))
    assert len(converter.linker.index) <= 2 and converter.linker.index.evicted == 0


def test_two_reports_lost_across_alike_copies_never_make_a_pair(core):
    """Three alike copies under one context, the second 5 us before the first: the origin's
    report of the first and the downstream report of the second lost. What is left of them,
    the second's egress and the first's arrival, is alone in its window, but the key holds
    another copy of that size (the third, far off): the pair is not decided (it would be
    wrong). The third copy's pair, alone in its window too, is decided only by order where
    the numbers prove it (here none): `ambiguous`, never under another copy's egress."""
    origin = (b'{"server":{"name":"origin","id":"IDorigin"},"request":{"header":{"traceparent":'
              b'["00-00000000000000000000000000000001-0000000000000001-01"]},"msgsize":10},"events":'
              b'[{"type":"in","ts":"2026-11-22T02:16:30.000000000Z","kind":0,"cid":1,"name":"app","acc":"A",'
              b'"subj":"x.y"},{"type":"eg","ts":"2026-11-22T02:16:30.000000002Z","kind":1,"cid":3,"name":"srv1",'
              b'"hop":"1"}],"hops":1}')
    downstream = (b'{"server":{"name":"srv1","id":"IDsrv1"},"request":{"header":{"traceparent":'
                  b'["00-00000000000000000000000000000001-0000000000000001-01"],"Nats-Trace-Hop":["1"]},'
                  b'"msgsize":10},"events":[{"type":"in","ts":"2026-11-22T02:16:30.000000003Z","kind":1,"cid":1,'
                  b'"name":"origin","acc":"A","subj":"x.y"}]}')
    raws = [RawTraceMessage("trace.a", {}, origin), RawTraceMessage("trace.a", {}, downstream)]
    sent = copies_of(raws, [5_000, 0, 50_000_000])  # (origin, downstream) per copy
    kept = [raw for at, raw in enumerate(sent) if at not in (0, 3)]  # copy 0's origin, copy 1's downstream
    results = core.convert_batch(kept, link=WINDOW)
    spans = [s for r in results for s in r.spans]
    by_id = {s.span_id: s for s in spans}
    for span in spans:
        if span.kind == 5 and span.parent_span_id in by_id:  # a downstream server span under an egress
            assert copy_of(span, by_id) == copy_of(by_id[by_id[span.parent_span_id].parent_span_id], by_id)
    assert [r.link for r in results if r.link] == ["ambiguous", "ambiguous"]
