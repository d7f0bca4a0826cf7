"""Never wrong, over many random loss patterns of real archives: each rule that decides a
link (docs/span-model.md, "what decides a link") is tried where its assumptions hold, on
the crowded hops of tests/data/hop_batches (batches of 100 under one traceparent from real
servers, 2 ms apart and back to back), with their per-message header taken out (messages
alike but for their time) and kept (each message's own header: exact evidence).

The loss patterns: a random share of the trace messages (0-30%) lost independently, or in
runs (a slow consumer drops what is in its buffer). The truth is the whole archive's, by
order on each connection (`devkit.hop_truth`); a link is wrong when its egress is not the
truth's. The share of each rule in the decisions is printed (`pytest -s`).
"""

from __future__ import annotations

import gzip
import os
import random
from collections import Counter
from pathlib import Path

import pytest

from nats_otel.core.decode import RawTraceMessage, parse_archive_line
from nats_otel.core.linking import MATCHED
from nats_otel.devkit.hop_truth import compute_truth
from tests.archives import without_header

ARCHIVES = sorted((Path(__file__).parent.parent / "data" / "hop_batches").glob("*.jsonl.gz"))
# Per archive and header choice, on each core; LINK_PATTERNS=5000 for a longer search.
PATTERNS = int(os.environ.get("LINK_PATTERNS", "150"))


def _archive(path: Path, header: bool):
    lines = [line for line in gzip.decompress(path.read_bytes()).splitlines() if line.strip()]
    if not header:
        lines = [without_header(line, "Hop-Check-Seq") for line in lines]
    raws = [raw for raw in map(parse_archive_line, lines) if isinstance(raw, RawTraceMessage)]
    return raws, compute_truth(raws)


def _lost(rnd: random.Random, count: int) -> set[int]:
    """Positions of the trace messages lost: independently, or in runs."""
    share = rnd.uniform(0.0, 0.3)
    if rnd.random() < 0.5:
        return {at for at in range(count) if rnd.random() < share}
    lost: set[int] = set()
    while len(lost) < share * count:
        start = rnd.randrange(count)
        lost.update(range(start, min(count, start + rnd.randint(1, 20))))
    return lost


@pytest.mark.parametrize("header", [False, True], ids=["alike", "own-header"])
@pytest.mark.parametrize("path", ARCHIVES, ids=[p.name.split(".")[0] for p in ARCHIVES])
def test_no_loss_pattern_makes_a_wrong_link(core, path, header):
    raws, truth = _archive(path, header)
    assert truth.hops and not truth.problems
    prepared = [core.prepare(raw) for raw in raws]
    rnd = random.Random(f"{path.name}-{header}")
    rules: Counter[str] = Counter()
    linkable = right = 0
    for _ in range(PATTERNS):
        lost = _lost(rnd, len(prepared))
        kept = [p for at, p in enumerate(prepared) if at not in lost]
        remaining = {p.ident for p in kept}
        linker = core.Linker(bounded=False)
        for p in kept:
            linker.observe(p)
        matched = 0
        for p in kept:
            hop = truth.hops.get(p.ident)
            if hop is None or p.arrival is None:
                continue
            _, link = linker.locate(p)
            if link is None or link.result != MATCHED:
                continue
            matched += 1
            assert link.egress.span_id == hop.parent_span_id, (path.name, header, sorted(lost))
            if hop.upstream in remaining:
                right += 1
        linkable += sum(1 for ident, hop in truth.hops.items() if ident in remaining and hop.upstream in remaining)
        decided = linker.index.sequences.decided_by
        rules.update(decided)
        rules["unique or shape"] += matched - sum(decided.values())
    shares = {rule: f"{count / max(1, sum(rules.values())):.1%}" for rule, count in rules.most_common()}
    print(f"\n{path.name} {'own header' if header else 'alike'}: {right} of {linkable} linkable linked right, "
          f"none wrong, over {PATTERNS} loss patterns; decided by {shares}")
    if header:  # exact evidence: every hop whose two reports remain
        assert right == linkable
