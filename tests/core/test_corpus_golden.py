"""Golden files and the span model, on every real trace message of the corpus.

Regenerate the golden files after an intended change with
`NATS_OTEL_REGEN_GOLDEN=1 python -m pytest tests/core/test_corpus_golden.py` and review
the diff.
"""

from __future__ import annotations

import base64
import os
import random
import subprocess
import sys

import orjson
import pytest

from nats_otel.core.encode import split_by_trace, to_otlp_json_line
from nats_otel.core.ids import parse_traceparent
from nats_otel.core.pipeline import Converted
from tests.checks import check_span_model, orphan_parents, parse_otlp_json_lines
from tests.conftest import CORPUS, GOLDEN, corpus_files, read_raws

REGEN = os.environ.get("NATS_OTEL_REGEN_GOLDEN") == "1"


def convert_to_bytes(core, raws) -> bytes:
    results = core.convert_batch(raws)
    assert all(isinstance(r, Converted) for r in results), [r for r in results if not isinstance(r, Converted)]
    spans = [s for r in results for s in r.spans]
    return b"".join(to_otlp_json_line(trace) for trace in split_by_trace(spans))


@pytest.mark.parametrize("path", corpus_files(), ids=lambda p: p.stem)
def test_golden(core, path):
    output = convert_to_bytes(core, read_raws(path))
    golden = GOLDEN / f"{path.stem}.otlp.jsonl"
    if REGEN:
        golden.write_bytes(output)
    assert golden.exists(), f"missing golden file {golden}; regenerate with NATS_OTEL_REGEN_GOLDEN=1"
    assert output == golden.read_bytes()


@pytest.mark.parametrize("path", corpus_files(), ids=lambda p: p.stem)
def test_span_model_per_scenario(core, path):
    raws = read_raws(path)
    spans = parse_otlp_json_lines(convert_to_bytes(core, raws))
    check_span_model(spans, raws)


def test_whole_corpus_has_no_orphans_and_no_shared_ids(core, corpus_raws):
    spans = parse_otlp_json_lines(convert_to_bytes(core, corpus_raws))
    app_parents = set()
    for raw in corpus_raws:
        results = core.convert_batch([raw])
        server_span = next(r for r in results if isinstance(r, Converted)).spans[0]
        msg_tp = server_span.attribute("messaging.nats.header.traceparent")
        if msg_tp:
            app_parents.add(parse_traceparent(msg_tp[0])[1].hex())
    assert len({s.span_id for s in spans}) == len(spans)
    assert orphan_parents(spans, app_parents) == []
    check_span_model(spans, corpus_raws)


def test_manifest_expectations(core, manifest):
    """Each scenario's expected servers and hops appear as server spans with their events."""
    checked = 0
    for scenario in manifest["scenarios"]:
        expected = (scenario.get("expected") or {}).get("events")
        path = CORPUS / scenario["file"]
        if not expected or not path.exists():
            continue
        spans = [s for r in core.convert_batch(read_raws(path)) for s in r.spans]
        servers = [s for s in spans if s.kind == 5]
        for event in expected:
            hop = event.get("hop") or None
            # the manifest lists alternatives where the server may choose (queue groups)
            names = event["server"] if isinstance(event["server"], list) else [event["server"]]
            match = [
                s
                for s in servers
                if s.resource.get("messaging.nats.server.name") in names
                and s.attribute("messaging.nats.trace.hop") == hop
            ]
            assert match, f"{scenario['name']}: no server span for {event['server']} hop {hop}"
            if event.get("types"):
                children = [c for c in spans if c.parent_span_id == match[0].span_id and c.kind != 5]
                assert len(children) == len(event["types"]) - 1, scenario["name"]
            checked += 1
    assert checked >= 30


def test_reused_traceparent_gets_distinct_ids_and_linked_hops(core):
    raws = read_raws(CORPUS / "22_traceparent_reused_3x.jsonl")
    results = core.convert_batch(raws)
    spans = [s for r in results for s in r.spans]
    assert len({s.span_id for s in spans}) == len(spans) == 12
    # Three origins (under the producer span), three downstream reports each linked by evidence.
    assert sorted(r.link for r in results) == ["", "", "", "matched", "matched", "matched"]
    by_id = {s.span_id: s for s in spans}
    downstream = [s for s in spans if s.kind == 5 and s.attribute("messaging.nats.trace.hop") == "1"]
    # The message sizes differ in this capture: the size check proves each child hangs
    # under the egress of its own message.
    for child in downstream:
        egress = by_id[child.parent_span_id]
        origin = by_id[egress.parent_span_id]
        size = "messaging.message.envelope.size"
        assert child.attribute(size) - origin.attribute(size) == 19


def test_shuffled_input_gives_identical_bytes(core, corpus_raws):
    reference = convert_to_bytes(core, corpus_raws)
    for seed in range(3):
        shuffled = corpus_raws[:]
        random.Random(seed).shuffle(shuffled)
        assert convert_to_bytes(core, shuffled) == reference


def test_cli_convert_twice_and_shuffled(core, tmp_path):
    lines = [line for path in corpus_files() for line in path.read_bytes().splitlines() if line.strip()]
    random.Random(7).shuffle(lines)
    shuffled = tmp_path / "shuffled.jsonl"
    shuffled.write_bytes(b"\n".join(lines) + b"\n")
    outputs = []
    for source in (str(CORPUS), str(shuffled)):
        out = tmp_path / "out.jsonl"
        done = subprocess.run(
            [sys.executable, "-m", "nats_otel.cli", "convert", source, "-o", str(out)],
            capture_output=True,
            text=True,
            check=True,
        )
        assert "268 trace messages converted" in done.stderr and "0 rejected" in done.stderr
        outputs.append(out.read_bytes())
    assert outputs[0] == outputs[1]
    assert outputs[0] == convert_to_bytes(core, [r for p in corpus_files() for r in read_raws(p)])


def test_cli_convert_from_stdin_streams_the_same_bytes(core, tmp_path):
    """`convert` streams (two passes, spans spilled to disk): standard input is read once
    and kept for the second pass; the output is `convert_batch`'s, byte for byte."""
    lines = b"".join(path.read_bytes() for path in corpus_files())
    out = tmp_path / "out.jsonl"
    done = subprocess.run([sys.executable, "-m", "nats_otel.cli", "convert", "-", "-o", str(out)],
                          input=lines, capture_output=True, check=True)
    assert b"268 trace messages converted" in done.stderr
    assert out.read_bytes() == convert_to_bytes(core, [r for p in corpus_files() for r in read_raws(p)])


def test_a_long_trace_is_written_in_bounded_requests(core, tmp_path):
    """Thousands of messages under one traceparent: requests of at most MAX_SPANS_PER_REQUEST
    spans, in order, the same bytes from the streaming CLI as from `split_by_trace`."""
    from nats_otel.core.encode import MAX_SPANS_PER_REQUEST

    template = read_raws(CORPUS / "02_route_hop.jsonl")
    raws = []
    for copy in range(1200):  # 2 reports and 4 spans a copy: 4,800 spans in one trace
        for raw in template:
            doc = orjson.loads(raw.payload)
            for event in doc["events"]:
                event["ts"] = event["ts"][:20] + f"{copy:06d}" + event["ts"][26:]
            raws.append(type(raw)(raw.subject, raw.headers, orjson.dumps(doc)))
    lines = convert_to_bytes(core, raws).splitlines()
    assert len(lines) == 3 and all(len(orjson.loads(line)["resourceSpans"]) for line in lines)
    counts = [sum(len(ss["spans"]) for rs in orjson.loads(line)["resourceSpans"] for ss in rs["scopeSpans"])
              for line in lines]
    assert counts == [MAX_SPANS_PER_REQUEST, MAX_SPANS_PER_REQUEST, 800]
    archive = tmp_path / "long.jsonl"
    archive.write_bytes(b"".join(orjson.dumps({"subject": r.subject, "headers": r.headers,
                                               "payload_b64": base64.b64encode(r.payload).decode()}) + b"\n"
                                 for r in raws))
    out = tmp_path / "out.jsonl"
    subprocess.run([sys.executable, "-m", "nats_otel.cli", "convert", str(archive), "-o", str(out)], check=True,
                   capture_output=True)
    assert out.read_bytes().splitlines() == lines
