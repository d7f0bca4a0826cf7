"""The report's network picture, laid out by Graphviz: checked on the layout `dot` drew.

No Spark here: the edges come from the corpus through `convert_batch` (the report test
checks the Spark path gives the same edges), and from a denser made-up network.
"""

from __future__ import annotations

import itertools
import statistics
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

import pytest

from nats_otel.archive import read_archive
from nats_otel.core.pipeline import Converted, convert_batch
from nats_otel.core.records import SpanKind
from spark_backfill.edges import Edge
from spark_backfill.network import Layout, edge_id, render, roles
from tests.backfill.conftest import corpus_files, needs_dot

pytestmark = needs_dot

SVG = "{http://www.w3.org/2000/svg}"


def corpus_network() -> tuple[list[Edge], dict[str, str]]:
    """Edges (with hop latencies) and clusters of the corpus, computed without Spark."""
    spans = [s for r in convert_batch(read_archive(corpus_files())) if isinstance(r, Converted) for s in r.spans]
    by_id = {(s.trace_id, s.span_id): s for s in spans}
    latencies: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    clusters = {}
    for s in spans:
        name = str(s.resource.get("messaging.nats.server.name"))
        clusters[name] = str(s.resource.get("messaging.nats.server.cluster") or "")
        parent = by_id.get((s.trace_id, s.parent_span_id))
        if s.kind == SpanKind.CONSUMER and parent is not None and parent.attribute("messaging.nats.trace.hop"):
            key = (str(parent.resource.get("messaging.nats.server.name")), name,
                   str(parent.attribute("messaging.nats.connection.kind")))
            latencies[key].append((s.start_ns - parent.end_ns) / 1e6)
    edges = [Edge(a, b, k, len(v), statistics.median(v), max(v), max(v), max(v))
             for (a, b, k), v in sorted(latencies.items())]
    return edges, clusters


def dense_network() -> tuple[list[Edge], dict[str, str]]:
    """Three full-mesh clusters, gateways both ways between them, three leafnodes on two hubs."""
    clusters, edges = {}, []
    for cluster in ("east", "west", "south"):
        names = [f"{cluster}-{i}" for i in (1, 2, 3)]
        clusters.update(dict.fromkeys(names, cluster))
        for a, b in itertools.permutations(names, 2):
            edges.append(Edge(a, b, "router", 40 + len(edges), 0.1 * len(edges), 0.4 * len(edges), 9.0, 9.0))
    for a, b in itertools.permutations(("east-1", "west-1", "south-2"), 2):
        edges.append(Edge(a, b, "gateway", 3, 12.5, 40.25, 50.0, 50.0))
    for leaf, hub in (("leaf-a", "east-2"), ("leaf-b", "west-3"), ("leaf-c", "west-3")):
        clusters[leaf] = leaf  # what a leafnode server reports as its cluster
        edges += [Edge(hub, leaf, "leaf", 5, 0.3, 0.9, 1.0, 1.0), Edge(leaf, hub, "leaf", 9, 0.35, 1.2, 2.0, 2.0)]
    return edges, clusters


NETWORKS = {"corpus": corpus_network, "dense": dense_network}


def _rank(layout: Layout, name: str, ranks: list[float]) -> int:
    x = layout.nodes[name].centre[0]
    return min(range(len(ranks)), key=lambda i: abs(ranks[i] - x))


@pytest.mark.parametrize("network", sorted(NETWORKS))
def test_picture_layout(network, tmp_path: Path):
    edges, clusters = NETWORKS[network]()
    layout = render(edges, clusters, tmp_path)
    grouped, hubs = roles(edges, clusters)
    assert hubs  # both networks have leafnodes

    # Every edge drawn once, each with its own label: kind, count, p50 and p99.
    assert sorted(layout.edges) == sorted(edge_id(e.source, e.target, e.kind) for e in edges)
    for e in edges:
        text = layout.label_texts[edge_id(e.source, e.target, e.kind)]
        assert f"{e.kind} n={e.count}" in text and "p50 " in text and " p99 " in text
    # No label covers another label, or a server.
    labels = list(layout.labels.items())
    assert [(a, b) for (a, box_a), (b, box_b) in itertools.combinations(labels, 2) if box_a.overlaps(box_b)] == []
    assert [(a, n) for a, box in labels for n, node in layout.nodes.items() if box.overlaps(node)] == []

    # Servers in their cluster's box and in no other; leafnodes outside every box.
    assert set(layout.clusters) == set(grouped)
    for cluster, servers in grouped.items():
        box = layout.clusters[cluster]
        for name, node in layout.nodes.items():
            if name in servers:
                assert box.x0 <= node.x0 and node.x1 <= box.x1 and box.y0 <= node.y0 and node.y1 <= box.y1
            else:
                assert not node.overlaps(box), (name, cluster)
    # A leafnode sits beside its hub: in the rank next to it (or the same one).
    ranks = sorted({round(box.centre[0]) for box in layout.nodes.values()})
    for leaf, hub in hubs.items():
        assert abs(_rank(layout, leaf, ranks) - _rank(layout, hub, ranks)) <= 1, (leaf, hub)

    # Both pictures written; a leafnode's subtitle names its hub, not itself again.
    assert (tmp_path / "network.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    svg = ET.parse(tmp_path / "network.svg").getroot()
    node_texts = {g.find(f"{SVG}title").text: [t.text for t in g.iter(f"{SVG}text")]
                  for g in svg.iter(f"{SVG}g") if g.get("class") == "node"}
    for leaf, hub in hubs.items():
        assert node_texts[leaf] == [leaf, f"leafnode of {hub}"]
    for servers in grouped.values():
        for name in servers:
            assert node_texts[name] == [name]


def test_roles_group_by_cluster_and_find_each_leafnodes_hub():
    edges, clusters = dense_network()
    grouped, hubs = roles(edges, clusters)
    assert grouped == {"east": ["east-1", "east-2", "east-3"], "south": ["south-1", "south-2", "south-3"],
                       "west": ["west-1", "west-2", "west-3"]}
    assert hubs == {"leaf-a": "east-2", "leaf-b": "west-3", "leaf-c": "west-3"}
    # A one-server "cluster" named after a server that is no leafnode stays on its own.
    grouped, hubs = roles([Edge("a", "b", "router", 1, 1, 1, 1, 1)], {"a": "a", "b": ""})
    assert grouped == {} and hubs == {}
