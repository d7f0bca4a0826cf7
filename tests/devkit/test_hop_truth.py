"""The hop-link truth (order per connection) and its score, on the real corpus and built cases."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from nats_otel.core.decode import decode
from nats_otel.core.encode import split_by_trace, to_otlp_json_line
from nats_otel.core.ids import event_span_id, identity, server_span_id, trace_context
from nats_otel.core.model import Egress
from nats_otel.core.pipeline import Converted, convert_batch
from nats_otel.core.records import SpanRecord
from nats_otel.devkit.hop_score import (
    AMBIGUOUS,
    MISSING,
    RIGHT,
    UNMATCHED,
    WRONG,
    read_otlp_json_lines,
    score,
    spans_from_records,
)
from nats_otel.devkit.hop_statistics import QUANTILES, link_statistics
from nats_otel.devkit.hop_truth import SEQUENCE_HEADER, compute_truth
from tests.conftest import CORPUS, corpus_files, read_raws
from tests.core.factories import egress, ingress, message, raw

LINK = "messaging.nats.trace.link"


def converted_spans(raws) -> list[SpanRecord]:
    return [span for result in convert_batch(raws) if isinstance(result, Converted) for span in result.spans]


def egress_span_id(raw_message, hop_id: str) -> bytes:
    """The span id of the forwarding egress with `hop_id` in one report, computed from the report."""
    msg = decode(raw_message)
    ctx = trace_context(msg, raw_message.subject)
    for position, event in enumerate(msg.events, start=1):
        if type(event) is Egress and event.hop == hop_id:
            return event_span_id(ctx, identity(msg), position)
    raise AssertionError(f"no egress with hop {hop_id}")


def test_chain_through_route_gateway_and_leaf():
    raws = read_raws(CORPUS / "05_route_gateway_leaf_chain.jsonl")
    truth = compute_truth(raws)
    assert not truth.problems and not truth.label_mismatches and not truth.unplaced
    by_server = {decode(r).server.name: r for r in raws}
    expected = {"east-1": ("east-2", "1"), "west-1": ("east-2", "2"), "leaf-1": ("east-1", "1.1"),
                "west-2": ("west-1", "2.1")}
    assert len(truth.hops) == len(expected)
    for downstream, (upstream, hop_id) in expected.items():
        msg = decode(by_server[downstream])
        hop = truth.hops[identity(msg)]
        assert hop.parent_span_id == egress_span_id(by_server[upstream], hop_id)
        assert hop.link.upstream_server == upstream and hop.link.downstream_server == downstream
        assert hop.latency_ns > 0


def test_reused_traceparent_is_linked_by_order_not_by_context():
    """22: one traceparent on three messages; only order (and sizes, a check here) tells them apart."""
    raws = read_raws(CORPUS / "22_traceparent_reused_3x.jsonl")
    truth = compute_truth(raws)
    assert len(truth.hops) == 3 and not truth.problems
    assert truth.label_mismatches == []  # the k-th egress and the k-th arrival have the same size
    origins = sorted((decode(r) for r in raws if decode(r).server.name == "east-1"), key=lambda m: m.ingress.ts_ns)
    sizes = [m.msg_size for m in origins]
    for hop in truth.hops.values():
        assert hop.link.label().startswith("east-1#")
    ordered = sorted(truth.hops.values(), key=lambda h: h.index)
    assert [h.upstream for h in ordered] == [identity(m) for m in origins]
    assert sizes == sorted(sizes)  # 92 / 282 / 3082: the order is also the size order here


def test_shuffled_input_gives_the_same_truth(corpus_raws):
    reference = compute_truth(corpus_raws)
    assert len(reference.hops) > 100
    for seed in range(3):
        shuffled = corpus_raws[:]
        random.Random(seed).shuffle(shuffled)
        again = compute_truth(shuffled)
        assert again.hops == reference.hops
        assert again.problems == reference.problems


def test_whole_corpus_every_downstream_report_has_a_truth(corpus_raws):
    truth = compute_truth(corpus_raws)
    downstream = {identity(m) for m in map(decode, corpus_raws) if m.ingress.kind in (1, 2, 4)}
    assert set(truth.hops) == downstream
    assert not truth.problems and not truth.unplaced and truth.duplicates == 0 and truth.time_ties == 0
    # Order and the servers' labels agree everywhere; only the service import (08) adds headers.
    assert Counter(what for what, _ in truth.label_mismatches) == Counter({"size": 1})


def test_pooled_routes_are_paired_by_their_sequences(corpus_raws):
    """east-1 has two pooled routes to east-2 in the corpus (account A: cid 9, account C: cid 10)."""
    truth = compute_truth(corpus_raws)
    pairs = {(link.upstream_cid, link.downstream_cid) for link in truth.links()
             if (link.upstream_server, link.downstream_server) == ("east-1", "east-2")}
    assert pairs == {(9, 12), (10, 13)}
    # The reverse direction of the same TCP connection has the same two cids, swapped.
    back = {(link.upstream_cid, link.downstream_cid) for link in truth.links()
            if (link.upstream_server, link.downstream_server) == ("east-2", "east-1")}
    assert back == {(12, 9)}


def test_a_lost_report_is_reported_not_guessed():
    raws = read_raws(CORPUS / "21_sampling_50pct_account_c.jsonl")
    downstream = [r for r in raws if decode(r).server.name == "east-2"]
    lost = downstream[40]
    truth = compute_truth([r for r in raws if r is not lost])
    assert truth.hops == {}
    assert len(truth.problems) == 1 and "lost report" in truth.problems[0].describe()
    assert len(truth.unplaced) == len(downstream) - 1


def test_duplicates_and_undecodable_messages_are_counted():
    raws = read_raws(CORPUS / "02_route_hop.jsonl")
    truth = compute_truth([*raws, raws[0], raw(b"not json")])
    assert truth.duplicates == 1 and truth.rejected == 1 and len(truth.hops) == 1


def _pooled_pair(up_cid: int, down_cid: int, t_out: int, latency: int, tag: str) -> list:
    """One message from s1 to s2 over s1's connection `up_cid` (s2's `down_cid`)."""
    headers = {"traceparent": [f"00-{tag * 32}-{tag * 16}-01"]}
    origin = message(ingress(t_out - 50), egress(t_out, kind=1, name="s2", hop="1", cid=up_cid),
                     server="s1", headers=headers)
    down = message(ingress(t_out + latency, kind=1, name="s1", cid=down_cid), egress(t_out + latency + 10),
                   server="s2", headers={**headers, "Nats-Trace-Hop": ["1"]})
    down["request"]["msgsize"] += len("Nats-Trace-Hop: 1\r\n")  # what the forwarding server adds
    return [raw(origin), raw(down)]


def test_two_pooled_connections_that_fit_alike_are_not_guessed():
    raws = [*_pooled_pair(9, 12, 1_000_000, 300_000, "a"), *_pooled_pair(10, 13, 1_100_000, 300_000, "b")]
    truth = compute_truth(raws)
    assert truth.hops == {} and "fit alike" in truth.problems[0].reason
    assert len(truth.unplaced) == 2


def test_pooled_connections_are_paired_by_the_latency_that_fits():
    # Two messages per connection; the arrivals fit either pairing in time, but only one
    # gives both messages of a connection the same latency.
    raws = [*_pooled_pair(9, 12, 1_000_000, 300_000, "a"), *_pooled_pair(9, 12, 2_000_000, 300_000, "b"),
            *_pooled_pair(10, 13, 1_050_000, 500_000, "c"), *_pooled_pair(10, 13, 2_300_000, 500_000, "d")]
    truth = compute_truth(raws)
    assert not truth.problems and not truth.label_mismatches
    assert {(link.upstream_cid, link.downstream_cid) for link in truth.links()} == {(9, 12), (10, 13)}


def test_score_classifies_right_wrong_unlinked_and_missing():
    raws = read_raws(CORPUS / "22_traceparent_reused_3x.jsonl")
    truth = compute_truth(raws)
    spans = converted_spans(raws)
    assert score(truth, spans_from_records(spans)).counts == Counter({RIGHT: 3})
    hops = sorted(truth.hops.values(), key=lambda h: h.index)
    by_id = {s.span_id: s for s in spans}
    first, second, third = (by_id[h.downstream_span_id] for h in hops)
    edited = [s for s in spans if s.span_id not in {first.span_id, second.span_id, third.span_id}]
    # first: under the second message's egress; second: left unmatched; third: missing.
    edited.append(first._replace(parent_span_id=hops[1].parent_span_id))
    edited.append(second._replace(parent_span_id=b"\x01" * 8, attributes=(*second.attributes, (LINK, UNMATCHED))))
    result = score(truth, spans_from_records(edited))
    assert result.counts == Counter({WRONG: 1, UNMATCHED: 1, MISSING: 1})
    assert result.wrong_offsets == Counter({1: 1})
    assert result.present == 2 and result.fraction(WRONG) == 0.5


def test_score_reads_otlp_json_lines_and_filters_hops():
    raws = [r for path in corpus_files() for r in read_raws(path)]
    truth = compute_truth(raws)
    spans = converted_spans(raws)
    lines = [to_otlp_json_line(trace) for trace in split_by_trace(spans)]
    assert score(truth, read_otlp_json_lines(lines)).counts == Counter({RIGHT: len(truth.hops)})
    some = set(list(truth.hops)[:5])
    assert score(truth, read_otlp_json_lines(lines), only=some).counts == Counter({RIGHT: 5})


def test_conflicting_copies_keep_the_worse_one():
    raws = read_raws(CORPUS / "02_route_hop.jsonl")
    truth = compute_truth(raws)
    spans = converted_spans(raws)
    (hop,) = truth.hops.values()
    server = next(s for s in spans if s.span_id == hop.downstream_span_id)
    ambiguous = server._replace(parent_span_id=b"\x02" * 8, attributes=(*server.attributes, (LINK, AMBIGUOUS)))
    result = score(truth, spans_from_records([*spans, ambiguous]))
    assert result.counts == Counter({AMBIGUOUS: 1}) and result.conflicting_duplicates == 1


@pytest.mark.parametrize("name", ["16_adhoc_trace_dest.jsonl", "17_adhoc_trace_only.jsonl"])
def test_adhoc_span_ids_do_not_depend_on_the_per_message_trace_id(name):
    raws = read_raws(CORPUS / name)
    truth = compute_truth(raws)
    spans = converted_spans(raws)
    (hop,) = truth.hops.values()
    server = next(s for s in spans if s.span_id == hop.downstream_span_id)
    origin = next(s for s in spans if s.kind == 5 and s.span_id != server.span_id)
    # Its own trace (derived from the origin report), span ids from the ad-hoc group's context.
    assert server.trace_id == origin.trace_id
    msg = decode(raws[1])
    assert server.span_id == server_span_id(trace_context(msg, raws[1].subject), identity(msg))
    assert score(truth, spans_from_records(spans)).counts == Counter({RIGHT: 1})


def test_link_statistics_of_the_sampling_scenario():
    truth = compute_truth(read_raws(CORPUS / "21_sampling_50pct_account_c.jsonl"))
    (stats,) = link_statistics(truth)
    assert stats.messages == 110
    low, median, high = stats.latency[0], stats.latency[QUANTILES.index(0.5)], stats.latency[-1]
    assert 0 < low <= median <= high < 10_000_000
    # Messages left microseconds apart: several were in flight at once on this route.
    assert stats.spacing[0] < stats.latency[0] and stats.in_flight[-1] > 1
    assert stats.same_context_spacing == ()  # every sampled message had its own traceparent


def test_link_statistics_of_messages_sharing_a_context():
    (stats,) = link_statistics(compute_truth(read_raws(CORPUS / "22_traceparent_reused_3x.jsonl")))
    assert stats.messages == 3 and len(stats.same_context_spacing) == len(QUANTILES)
    assert stats.same_context_spacing == stats.spacing


def test_a_sequence_header_checks_the_order_where_other_labels_are_alike():
    """Two messages under one context: the truth pairs by order; the numbering header checks it."""
    headers = {"traceparent": ["00-" + "a" * 32 + "-" + "b" * 16 + "-01"]}

    def pair(t_out: int, sent: str, arrived: str) -> list:
        origin = message(ingress(t_out - 50), egress(t_out, kind=1, name="s2", hop="1", cid=9),
                         server="s1", headers={**headers, SEQUENCE_HEADER: [sent]})
        down = message(ingress(t_out + 300_000, kind=1, name="s1", cid=12), egress(t_out + 300_010),
                       server="s2", headers={**headers, SEQUENCE_HEADER: [arrived], "Nats-Trace-Hop": ["1"]})
        down["request"]["msgsize"] += len("Nats-Trace-Hop: 1\r\n")
        return [raw(origin), raw(down)]

    assert compute_truth([*pair(1_000_000, "01", "01"), *pair(1_010_000, "02", "02")]).label_mismatches == []
    crossed = compute_truth([*pair(1_000_000, "01", "02"), *pair(1_010_000, "02", "01")])
    assert [what for what, _ in crossed.label_mismatches] == ["sequence", "sequence"]
