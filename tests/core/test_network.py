"""The network facts of each trace message: hop latency from matched pairs only, counted once,
time in server, failures; the link index counts the sides that expired unmatched."""

from __future__ import annotations

from collections import defaultdict

import orjson

from nats_otel.core.linking import MATCHED, Arrival, Egress, LinkSettings
from nats_otel.core.model import ConnectionKind
from nats_otel.core.pipeline import Converted
from nats_otel.core.timestamps import parse_rfc3339_ns
from tests.conftest import CORPUS, read_raws

FORWARDING = {1: "router", 2: "gateway", 4: "leaf"}


def context(doc: dict) -> str:
    """The traceparent, else the ad-hoc destination (a service import may add the latter)."""
    header = doc["request"]["header"]
    return (header.get("traceparent") or header.get("Nats-Trace-Dest") or [""])[0]


def test_every_corpus_hop_has_its_latency_from_the_raw_reports(core, corpus_raws):
    """Against the raw JSON: downstream ingress minus the upstream egress of the same hop."""
    raws = [raw for raw in corpus_raws if raw.payload.startswith(b"{")]  # not the compressed ones
    docs = [orjson.loads(raw.payload) for raw in raws]
    egress_at = defaultdict(list)  # the corpus reuses contexts: several egresses per key
    for doc in docs:
        for event in doc["events"]:
            if event["type"] == "eg" and event.get("hop") and event["kind"] in FORWARDING:
                key = (context(doc), event["hop"], doc["server"]["name"], event["name"])
                egress_at[key].append(parse_rfc3339_ns(event["ts"]))
    results = core.convert_batch(raws)
    hops = exact = 0
    for doc, result in zip(docs, results, strict=True):
        if not isinstance(result, Converted):
            continue
        sample = result.network
        assert sample is not None
        ingress = doc["events"][0]
        assert sample.server == doc["server"]["name"]
        last = max(parse_rfc3339_ns(e["ts"]) for e in doc["events"])
        assert sample.in_server_ns == last - parse_rfc3339_ns(ingress["ts"])
        if result.link != MATCHED:
            assert sample.hop is None
            continue
        hops += 1
        key = (context(doc), doc["request"]["header"]["Nats-Trace-Hop"][0], ingress["name"], doc["server"]["name"])
        arrived = parse_rfc3339_ns(ingress["ts"])
        # An egress of that hop within the window (0.5 s before to 0.1 s after); when the context
        # is reused there are several, and the linker chose by size.
        in_window = [arrived - t for t in egress_at[key] if -100_000_000 <= arrived - t <= 500_000_000]
        assert sample.hop is not None and sample.hop.latency_ns in in_window
        assert sample.hop[:3] == (ingress["name"], doc["server"]["name"], FORWARDING[ingress["kind"]])
        exact += len(in_window) == 1
    assert hops >= 10 and exact >= hops - 6  # routes, gateways, leafnodes; scenario 22 reuses a context


def test_failures_are_the_spans_with_status_error(core):
    results = core.convert_batch(read_raws(CORPUS / "12_publish_permission_denied.jsonl")
                            + read_raws(CORPUS / "02_route_hop.jsonl"))
    for result in results:
        assert isinstance(result, Converted) and result.network is not None
        assert result.network.failed == any(span.status_code == 2 for span in result.spans)
    assert any(r.network.failed for r in results) and not all(r.network.failed for r in results)


def test_a_redelivered_report_counts_its_hop_once(core):
    raws = read_raws(CORPUS / "02_route_hop.jsonl")
    converter = core.Converter()
    for raw in raws:
        converter.observe(raw)
    first = [r.network.hop for r in map(converter.convert, raws) if isinstance(r, Converted) and r.network]
    again = [r.network.hop for r in map(converter.convert, raws) if isinstance(r, Converted) and r.network]
    assert sum(hop is not None for hop in first) == 1
    assert all(hop is None for hop in again)  # same spans, but the hop was counted already


def test_sides_that_expire_unmatched_are_counted_by_side(core):
    index = core.LinkIndex(LinkSettings(retention_s=10.0))
    key = (b"ctx", "1", "up", "down")
    index.add_egress(key, Egress(1_000, 50, b"u1", b"s1"), now=0.0)  # matched below
    index.add_arrival(key, Arrival(1_200, 50, b"d1"), now=0.0)
    # Another message of the context (another size: an alike one would leave the pair above
    # undecided, `linking`), whose downstream report never came.
    index.add_egress(key, Egress(9_000_000_000, 60, b"u2", b"s2"), now=0.0)
    lonely = (b"ctx", "2", "up", "other")
    index.add_arrival(lonely, Arrival(5_000, 50, b"d2"), now=0.0)  # its upstream never came
    assert index.resolve(key, Arrival(1_200, 50, b"d1")).result == MATCHED
    index.expire(now=5.0)
    assert index.expired_unmatched == {"upstream": 0, "downstream": 0}
    index.expire(now=11.0)
    assert index.expired_unmatched == {"upstream": 1, "downstream": 1}
    assert len(index) == 0 and index.evicted == 0


def test_connection_kind_labels_of_hops():
    assert [ConnectionKind.label(k) for k in FORWARDING] == list(FORWARDING.values())


def test_claims_never_outlive_the_entries_they_mark(core):
    """Claims are only made on MATCHED, which needs both sides in the index (mutual
    uniqueness looks the arrival up): an arrival forgotten before it is resolved (the ad-hoc
    walk resolves old ones) is not matched, so no claim can outlive its entry."""
    index = core.LinkIndex(LinkSettings(retention_s=30.0))
    key = (b"ctx", "1", "up", "down")
    arrival = Arrival(1_200, 50, b"d1")
    index.add_arrival(key, arrival, now=0.0)
    index.add_egress(key, Egress(1_000, 50, b"u1", b"s1"), now=20.0)
    index.expire(now=31.0)  # the arrival goes, the egress stays
    assert index.expired_unmatched == {"upstream": 0, "downstream": 1}
    assert index.resolve(key, arrival).result != MATCHED
    index.expire(now=51.0)
    assert index.expired_unmatched == {"upstream": 1, "downstream": 1}
    assert len(index) == 0 and not index._claimed  # nothing left behind


def test_each_sample_names_its_trace_and_the_server_span_mapped(core, corpus_raws):
    """The exemplars' names: the trace id and span id of the report's server span, as mapped
    (same ids in the encoded path the bridge takes: the span ids are hashes; the sample's is
    hashed from its inputs, `NetworkSample.span_id`)."""
    results = [r for r in core.convert_batch(corpus_raws) if isinstance(r, Converted)]
    assert len(results) > 50
    for result in results:
        sample = result.network
        assert sample is not None and len(sample.trace_id) == 16 and len(sample.span_id) == 8
        server_spans = [s for s in result.spans if s.span_id == sample.span_id]
        assert len(server_spans) == 1
        assert server_spans[0].trace_id == sample.trace_id and server_spans[0].name.startswith("receive")
