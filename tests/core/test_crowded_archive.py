"""Crowded hops from real servers with reports lost: `convert_batch` on the archive of
batches of 100 messages under one traceparent, 2 ms apart (tests/data/hop_batches, written
by bench/hop_links.py on nats-server 2.15.1), with a tenth of its trace messages removed
at random. The truth comes from the whole archive, by order on each connection
(`devkit.hop_truth`), never from the linker.

The archive's messages each carry their own header (`Hop-Check-Seq`): as recorded, the
shapes (`core/shapes.py`) tell every message apart, exact whatever was lost; with that
header taken out (`tests.archives.without_header`), they are alike and only the servers'
order, report numbers and times can decide.

Seed 7 once gave one wrong link: the egress of a message was lost, and its arrival, late by
a latency spike on the east-2 -> east-3 route, came 14 µs after the next message's egress;
time alone took that one. The report numbers say the distance between the two reports of a
message moved there, and no neighbour confirms it (`HopSequences._distance_holds`).
"""

from __future__ import annotations

import gzip
import random
from pathlib import Path

import pytest

from nats_otel.core.decode import RawTraceMessage, decode, parse_archive_line
from nats_otel.core.ids import identity
from nats_otel.core.pipeline import Converted
from nats_otel.devkit.hop_score import RIGHT, WRONG, score, spans_from_records
from nats_otel.devkit.hop_truth import compute_truth
from tests.archives import without_header

ARCHIVE = Path(__file__).parent.parent / "data" / "hop_batches" / "batches_2ms.jsonl.gz"


def _raws(lines: list[bytes]) -> list[RawTraceMessage]:
    parsed = (parse_archive_line(line) for line in lines)
    return [raw for raw in parsed if isinstance(raw, RawTraceMessage)]


@pytest.fixture(scope="module")
def recorded() -> tuple[list[bytes], object]:
    """The archive as recorded: a header per message."""
    lines = [line for line in gzip.decompress(ARCHIVE.read_bytes()).splitlines() if line.strip()]
    return lines, compute_truth(_raws(lines))


@pytest.fixture(scope="module")
def archive(recorded) -> tuple[list[bytes], object]:
    """The same messages without their header: alike but for their time and order."""
    lines = [without_header(line, "Hop-Check-Seq") for line in recorded[0]]
    return lines, compute_truth(_raws(lines))


def _convert_scored(core, lines: list[bytes], truth, drop: float, seed: int) -> tuple[int, int, int]:
    """(hops whose two reports remain, linked right, linked wrong)."""
    rnd = random.Random(seed)
    raws = _raws([line for line in lines if rnd.random() >= drop])
    remaining = {identity(decode(raw)) for raw in raws}
    linkable = {ident for ident, hop in truth.hops.items() if ident in remaining and hop.upstream in remaining}
    spans = [span for result in core.convert_batch(raws) if isinstance(result, Converted) for span in result.spans]
    counts = score(truth, spans_from_records(spans), only=linkable).counts
    return len(linkable), counts[RIGHT], counts[WRONG]


def test_lost_reports_of_real_batches_never_make_a_wrong_link(core, archive):
    lines, truth = archive
    assert len(truth.hops) == 1800 and not truth.problems
    linkable = right = 0
    for seed in range(1, 13):
        kept, linked, wrong = _convert_scored(core, lines, truth, 0.1, seed)
        assert wrong == 0, f"seed {seed}"
        linkable, right = linkable + kept, right + linked
    # Where a report was lost, nothing proves which alike message is which: they stay
    # `ambiguous` (the rules that linked 80% here by what is likely went in issue 36, after
    # they linked spans under a neighbour's egress on archives from sidecars).
    assert linkable > 1000


def test_nothing_lost_every_batch_after_the_first_links_whole(core, archive):
    lines, truth = archive
    linkable, right, wrong = _convert_scored(core, lines, truth, 0.0, 0)
    assert (linkable, wrong) == (1800, 0)
    # Measured 1,300: the batches whose cluster start the servers' numbers prove whole (the
    # first has nothing before it; statsz and advisories break the runs before another).
    assert right >= 1300


def test_a_header_per_message_links_every_hop_whose_reports_remain(core, recorded):
    lines, truth = recorded
    assert len(truth.hops) == 1800 and not truth.problems
    assert _convert_scored(core, lines, truth, 0.0, 0) == (1800, 1800, 0)
    for seed in range(1, 13):
        kept, linked, wrong = _convert_scored(core, lines, truth, 0.1, seed)
        assert (linked, wrong) == (kept, 0), f"seed {seed}"


def test_without_the_header_the_shapes_are_alike(archive, recorded):
    from nats_otel.core.pipeline import python_prepare

    shapes = {python_prepare(raw).size for raw in _raws(archive[0])}
    recorded_shapes = {python_prepare(raw).size for raw in _raws(recorded[0])}
    assert len(shapes) <= 2 < 600 <= len(recorded_shapes)
