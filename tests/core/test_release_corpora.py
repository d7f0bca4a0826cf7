"""Every supported nats-server release, every crossing (issue 45): the corpus captured from
each release (`tests/data/corpus-<release>/`, `scripts/capture_corpus.py`) converts with no
failure, every hop linked under its true upstream egress, and each row of the shape rule's
table by release (`core/shapes.RELEASE_HEADERS`, docs/span-model.md) holds on the records of
that release: what it adds on a forward is exactly what the row names.

The truth of each hop comes from order per connection (`devkit.hop_truth`), never from the
linker under test."""

from __future__ import annotations

import base64
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from nats_otel.core.decode import decode
from nats_otel.core.encode import split_by_trace, to_otlp_json_line
from nats_otel.core.ids import identity
from nats_otel.core.pipeline import Converted
from nats_otel.core.shapes import RELEASE_HEADERS, SERVER_HEADERS, message_shape
from nats_otel.devkit.hop_score import score, spans_from_records
from nats_otel.devkit.hop_truth import compute_truth
from nats_otel.devkit.server_releases import RELEASES
from tests.checks import check_span_model, parse_otlp_json_lines
from tests.conftest import read_raws

DATA = Path(__file__).resolve().parents[1] / "data"
CORPORA = {release: DATA / f"corpus-{release}" for release in RELEASES}


def release_raws(release: str) -> list:
    return [raw for path in sorted(CORPORA[release].glob("*.jsonl")) for raw in read_raws(path)]


def line(release: str) -> str:
    return ".".join(release.split(".")[:2])


def test_every_supported_release_has_its_corpus():
    for release, folder in CORPORA.items():
        assert (folder / "manifest.json").is_file(), f"no corpus for {release}: scripts/capture_corpus.py"
        manifest = orjson.loads((folder / "manifest.json").read_bytes())
        assert manifest["nats_server_version"] == release
        assert len(list(folder.glob("*.jsonl"))) == len(manifest["scenarios"]) >= 38
    assert {line(release) for release in RELEASES} == set(RELEASE_HEADERS)


@pytest.mark.parametrize("release", RELEASES)
def test_every_hop_of_every_scenario_links_to_its_true_egress(core, release):
    raws = release_raws(release)
    results = core.convert_batch(raws)
    assert all(isinstance(r, Converted) for r in results), [r for r in results if not isinstance(r, Converted)]
    # Every report of every scenario was captured: no hop may be left unlinked.
    assert sorted({r.link for r in results}) == ["", "matched"], [r.link for r in results]
    truth = compute_truth(raws)
    assert not truth.problems, [p.describe() for p in truth.problems]
    result = score(truth, spans_from_records(s for r in results for s in r.spans))
    assert result.hops >= 400 and result.counts["right"] == result.hops, result.counts


@pytest.mark.parametrize("release", RELEASES)
def test_span_model_holds_on_every_release(core, release):
    raws = release_raws(release)
    spans = [s for r in core.convert_batch(raws) for s in r.spans]
    spans_bytes = b"".join(to_otlp_json_line(trace) for trace in split_by_trace(spans))
    check_span_model(parse_otlp_json_lines(spans_bytes), raws)


@pytest.mark.parametrize("release", RELEASES)
def test_the_release_row_names_exactly_what_the_release_adds(release):
    """Over every hop of the release's corpus, the headers the downstream report has that the
    upstream's has not (or with another value) are exactly the row of its release line; with
    them taken out, the two sides' shapes are equal."""
    raws = release_raws(release)
    messages = {identity(m): m for m in map(decode, raws)}
    added: set[str] = set()
    for hop in compute_truth(raws).hops.values():
        up, down = messages[hop.upstream], messages[hop.downstream]
        upstream = {name.lower(): values for name, values in up.headers.items()}
        added |= {name.lower() for name, values in down.headers.items() if upstream.get(name.lower()) != values}
        assert message_shape(up.msg_size, up.headers) == message_shape(down.msg_size, down.headers), \
            (up.headers, down.headers)
    assert added == RELEASE_HEADERS[line(release)]


def _service_hop(release: str):
    raws = read_raws(CORPORA[release] / "08_service_import.jsonl")
    messages = {identity(m): (raw, m) for raw, m in zip(raws, map(decode, raws), strict=True)}
    (hop,) = [h for h in compute_truth(raws).hops.values()
              if any(name.lower() == "nats-request-info" for name in messages[h.downstream][1].headers)]
    return raws, messages[hop.upstream][1], messages[hop.downstream][0]


@pytest.mark.parametrize("release", RELEASES)
def test_a_service_import_adds_what_the_release_row_says(release):
    _, _, downstream = _service_hop(release)
    names = {name.lower() for name in decode(downstream).headers}
    assert names - {"traceparent"} == RELEASE_HEADERS[line(release)]


@pytest.mark.parametrize("release", ["2.11.0", "2.15.1"])
def test_a_header_no_release_row_names_declines_the_link_never_makes_a_wrong_one(core, release):
    """A release outside the table adding a header of its own on a service import: the
    downstream report's shape is a digest the upstream's plain size cannot equal, so the hop is
    left `unmatched` (under the producer's span), never hung under another egress."""
    raws, _, downstream = _service_hop(release)
    document = orjson.loads(downstream.payload)
    document["request"]["header"]["Nats-Trace-Future"] = ["x"]
    document["request"]["msgsize"] += len("Nats-Trace-Future: x\r\n")
    changed = type(downstream)(downstream.subject, downstream.headers, orjson.dumps(document))
    results = core.convert_batch([changed if raw is downstream else raw for raw in raws])
    assert "nats-trace-future" not in SERVER_HEADERS
    assert sorted(r.link for r in results) == ["", "", "matched", "unmatched"]


@pytest.mark.parametrize("release", ["2.11.0", "2.12.8"])
def test_before_the_release_table_the_service_hop_of_2_11_and_2_12_was_vetoed(release):
    """What main af7f6a7 took out (no `Nats-Trace-Origin-Account`): the two sides' shapes of
    the service import hop differ on 2.11 and 2.12, the failure of issue 45."""
    _, up, down_raw = _service_hop(release)
    down = decode(down_raw)
    old = {"nats-trace-hop", "nats-request-info", "nats-trace-dest"}

    def old_shape(msg) -> tuple:
        size = msg.msg_size - sum(len(n) + len(v) + 4 for n, vs in msg.headers.items() if n.lower() in old for v in vs)
        own = sorted(n.lower() for n in msg.headers if n.lower() not in old | {"traceparent", "tracestate"})
        return size, own

    assert old_shape(up) != old_shape(down)
    assert message_shape(up.msg_size, up.headers) == message_shape(down.msg_size, down.headers)


@pytest.mark.parametrize("release", RELEASES)
def test_cli_convert_of_the_release_corpus(core, release, tmp_path):
    out = tmp_path / "out.jsonl"
    done = subprocess.run([sys.executable, "-m", "nats_otel.cli", "convert", str(CORPORA[release]), "-o", str(out)],
                          capture_output=True, text=True, check=True)
    count = len(release_raws(release))
    assert f"{count} trace messages converted" in done.stderr and "0 rejected" in done.stderr, done.stderr
    spans = [span for row in out.read_bytes().splitlines() for rs in orjson.loads(row)["resourceSpans"]
             for ss in rs["scopeSpans"] for span in ss["spans"]]
    links = [a["value"] for span in spans for a in span["attributes"] if a["key"] == "messaging.nats.trace.link"]
    assert links == [] and len(spans) > count


def test_payloads_are_the_servers_bytes():
    """The corpus keeps what the servers sent (compressed where asked), not a re-encoding."""
    for release in RELEASES:
        path = CORPORA[release] / "18_accept_encoding_gzip.jsonl"
        rows = [orjson.loads(row) for row in path.read_bytes().splitlines()]
        assert rows and all(base64.b64decode(row["payload_b64"])[:2] == b"\x1f\x8b" for row in rows), release


@pytest.mark.parametrize("release", RELEASES)
def test_every_release_prepares_alike_on_both_twins(kernel, release):
    """The compiled kernel takes out the same headers (it imports `SERVER_HEADERS`): its
    `prepare` equals the reference's on every record of every release, shapes included."""
    from nats_otel.core import pipeline

    raws = release_raws(release)
    assert [kernel.prepare(raw) for raw in raws] == [pipeline.python_prepare(raw) for raw in raws]
