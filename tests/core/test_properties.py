"""Property tests (hypothesis) over generated trace trees: determinism, order, ids, parents."""

from __future__ import annotations

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from nats_otel.core.decode import RawTraceMessage
from nats_otel.core.encode import split_by_trace, to_otlp_json_line
from nats_otel.core.pipeline import Converted

BASE_NS = 1_795_313_790_000_000_000


def _ts(ns: int) -> str:
    seconds, nanos = divmod(ns, 1_000_000_000)
    import time

    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{nanos:09d}Z"


@st.composite
def traced_message_trees(draw):
    """The trace messages of one traced message crossing a random tree of servers."""
    trace_id = draw(st.binary(min_size=16, max_size=16).filter(any)).hex()
    parent_id = draw(st.binary(min_size=8, max_size=8).filter(any)).hex()
    traceparent = f"00-{trace_id}-{parent_id}-01"
    docs = []
    counter = iter(range(1, 10_000))

    def visit(name, hop, upstream, t, depth):
        n_forward = draw(st.integers(0, 3 if depth < 3 else 0))
        n_clients = draw(st.integers(0, 2))
        kind = 0 if upstream is None else draw(st.sampled_from([1, 2, 4]))
        events = [{"type": "in", "ts": _ts(t), "kind": kind, "cid": 1, "name": upstream or "app", "acc": "A",
                   "subj": "x.y"}]
        if draw(st.booleans()):
            events.append({"type": "sm", "ts": _ts(t + 1), "to": "x.z"})
        t_event = t + 2
        for _ in range(n_clients):
            events.append({"type": "eg", "ts": _ts(t_event), "kind": 0, "cid": 9, "name": "c", "sub": "x.>"})
            t_event += draw(st.integers(0, 50))
        children = []
        for index in range(1, n_forward + 1):
            child_hop = f"{hop}.{index}" if hop else str(index)
            child = f"srv{next(counter)}"
            events.append({"type": "eg", "ts": _ts(t_event), "kind": 1, "cid": 3, "name": child, "hop": child_hop})
            children.append((child, child_hop, t_event))
            t_event += draw(st.integers(0, 50))
        headers = {"traceparent": [traceparent]}
        if hop:
            headers["Nats-Trace-Hop"] = [hop]
        doc = {"server": {"name": name, "id": f"ID{name}"}, "request": {"header": headers, "msgsize": 10},
               "events": events}
        if n_forward:
            doc["hops"] = n_forward
        docs.append(doc)
        for child, child_hop, t_sent in children:
            visit(child, child_hop, name, t_sent + draw(st.integers(1, 1000)), depth + 1)

    visit("origin", "", None, BASE_NS + draw(st.integers(0, 10**9)), 0)
    return [RawTraceMessage("trace.a", {}, orjson.dumps(d)) for d in docs], parent_id


def _bytes(core, raws):
    spans = [s for r in core.convert_batch(raws) for s in r.spans]
    return b"".join(to_otlp_json_line(t) for t in split_by_trace(spans))


@settings(max_examples=60, deadline=None)
@given(traced_message_trees(), st.randoms(use_true_random=False))
def test_same_input_same_bytes_in_any_order(core, tree, rnd):
    raws, _ = tree
    reference = _bytes(core, raws)
    assert _bytes(core, raws) == reference
    shuffled = raws[:]
    rnd.shuffle(shuffled)
    assert _bytes(core, shuffled) == reference


@settings(max_examples=60, deadline=None)
@given(traced_message_trees(), st.randoms(use_true_random=False))
def test_streaming_converter_agrees_with_batch_in_any_arrival_order(core, tree, rnd):
    """The live bridge observes on arrival and converts later: once every report of a
    message was observed, the order of arrival and of conversion does not matter."""
    raws, _ = tree
    arrived, converted = raws[:], raws[:]
    rnd.shuffle(arrived)
    rnd.shuffle(converted)
    converter = core.Converter()
    for raw in arrived:
        converter.observe(raw)
    streamed = {s for raw in converted for s in converter.convert(raw).spans}
    batch = {s for r in core.convert_batch(raws) for s in r.spans}
    assert streamed == batch


@settings(max_examples=40, deadline=None)
@given(traced_message_trees(), st.randoms(use_true_random=False))
def test_batch_calls_agree_with_message_calls(core, tree, rnd):
    """`observe_many`/`convert_many` (one call per batch) give what `observe`/`convert` give,
    with part of the batch never observed, a redelivered copy, and one object observed twice."""
    raws, _ = tree
    arrived = raws[:]
    rnd.shuffle(arrived)
    observed = arrived[: max(1, len(arrived) - 1)]  # the last one is never observed
    copy = RawTraceMessage(observed[0].subject, observed[0].headers, observed[0].payload)
    batch_converter, message_converter = core.Converter(), core.Converter()
    batch_converter.observe_many([*observed, observed[0], copy])
    for raw in [*observed, observed[0], copy]:
        message_converter.observe(raw)
    assert len(batch_converter._pending) == len(message_converter._pending) == len(observed) + 1
    converted = [*arrived, copy]
    by_batch = batch_converter.convert_many(converted, encoded=True)
    by_message = [message_converter.convert(raw, encoded=True) for raw in converted]
    assert by_batch == by_message
    assert not batch_converter._pending and not message_converter._pending
    assert all(isinstance(r, Converted) and r.encoded is not None and r.encoded.span_count for r in by_batch)


def test_batch_calls_keep_the_pending_bound(core):
    """Past `pending_capacity` the oldest observed messages are forgotten (decoded again)."""
    raws = [RawTraceMessage("t", {}, b"{}") for _ in range(10)]
    converter = core.Converter(pending_capacity=4)
    converter.observe_many(raws)
    assert [entry[0] for entry in converter._pending.values()] == raws[6:]
    assert [r.reason for r in converter.convert_many(raws)] == ["bad_schema"] * 10  # type: ignore[union-attr]


@settings(max_examples=60, deadline=None)
@given(st.lists(traced_message_trees(), min_size=1, max_size=4, unique_by=lambda tree: tree[1]))
def test_no_id_collisions_and_no_orphans(core, trees):
    """Distinct traced messages (distinct traceparents): unique ids, every parent present."""
    raws = [raw for tree, _ in trees for raw in tree]
    app_parents = {bytes.fromhex(parent) for _, parent in trees}
    results = core.convert_batch(raws)
    assert all(isinstance(r, Converted) for r in results)
    spans = [s for r in results for s in r.spans]
    ids = {s.span_id for s in spans}
    assert len(ids) == len(spans)
    orphans = [s for s in spans if s.parent_span_id not in ids and s.parent_span_id not in app_parents]
    assert orphans == []
