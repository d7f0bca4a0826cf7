"""Crowded hops (batches of 100 messages under one traceparent, each hop crossed 100 times
in one trace context) come out of the backfill as out of `nats-otel convert`: byte for
byte, linked under their upstream egress where `convert` links them, also with reports lost.

Order links a crowded hop only where no report of either server was lost, and the backfill
converts one trace context at a time: without the whole input's report runs, every other
context's reports would look lost (`spark_backfill.runs`)."""

from __future__ import annotations

import random
from collections import defaultdict
from pathlib import Path

import pytest

from nats_otel.archive import read_archive
from nats_otel.core.decode import parse_archive_line
from nats_otel.core.linking import MATCHED
from nats_otel.core.pipeline import Converted, convert_batch, prepare
from tests.archives import without_header
from tests.backfill.conftest import HOP_ARCHIVES, archive_lines, hop_spans, nats_otel_convert, read_parts

pytestmark = pytest.mark.spark

def _alike(path: Path, folder: Path, fraction: float, seed: int) -> str:
    """A copy of an archive without its per-message header (the messages of a batch alike but
    for their time: what order, runs and report numbers decide), with `fraction` of its lines
    removed at random."""
    rnd = random.Random(seed)
    copy = folder / path.name.removesuffix(".gz")
    copy.write_bytes(b"".join(without_header(line.encode(), "Hop-Check-Seq") + b"\n"
                              for line in archive_lines(path) if rnd.random() >= fraction))
    return str(copy)


def _matched_per_context(inputs: list[str]) -> int:
    """Hops linked when each trace context is converted alone, with no runs (the backfill
    before it worked the runs out)."""
    contexts = defaultdict(list)
    for path in inputs:
        for line in archive_lines(Path(path)):
            raw = parse_archive_line(line)
            contexts[prepare(raw).ctx.id_fields].append(raw)
    return sum(isinstance(r, Converted) and r.link == MATCHED for raws in contexts.values()
               for r in convert_batch(raws))


# Each archive apart: the two runs of the bench used the same traceparents.
@pytest.mark.parametrize(("name", "drop", "at_least"), [
    # Measured: 1,300 of 1,800 whole (the batches whose start the servers' numbers prove);
    # with a tenth lost, none: nothing proves which alike message is which (issue 36).
    ("batches_2ms", 0.0, 1300), ("batches_2ms", 0.1, 0),
    # Back to back, a batch stays ambiguous in `convert` too (docs/hop-links.md): the same bytes.
    ("back_to_back", 0.0, 0), ("back_to_back", 0.1, 0),
])
def test_crowded_hops_are_linked_as_convert_links_them(spark, tmp_path, name, drop, at_least):
    from spark_backfill.__main__ import run

    archive = next(path for path in HOP_ARCHIVES if path.name == f"{name}.jsonl.gz")
    inputs = [_alike(archive, tmp_path, drop, seed=29)]
    assert run(spark, ["convert", "--input", *inputs, "--otlp-json-out", str(tmp_path / "otlp")]) == 0
    produced = read_parts(tmp_path / "otlp")

    assert produced == nats_otel_convert(inputs, tmp_path / "reference.jsonl")
    downstream, linked = hop_spans(produced)
    results = convert_batch(read_archive(inputs))
    assert linked == sum(isinstance(r, Converted) and r.link == MATCHED for r in results) >= at_least
    assert downstream == sum(isinstance(r, Converted) and r.link != "" for r in results) >= 500
    if name == "batches_2ms" and not drop:
        # The runs of the other contexts' reports link what each context alone cannot
        # (1,699 against 1,598: where nothing was lost, the report numbers alone already
        # carry most of what the runs once did).
        assert linked > _matched_per_context(inputs)
