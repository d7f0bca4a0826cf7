"""The backfill's report runs (worked out by Spark, `spark_backfill.runs`) are the core's
`report_ledger.report_runs` of the same reports: lost, redelivered, undecodable and odd ones."""

from __future__ import annotations

import base64
import random
from pathlib import Path

import orjson
import pytest

from nats_otel.core.decode import DecodeError, parse_archive_line
from nats_otel.core.pipeline import prepare
from nats_otel.core.report_ledger import report_runs
from nats_otel.core.timestamps import parse_rfc3339_ns
from spark_backfill import keys, runs
from tests.backfill.conftest import GARBAGE_LINES, HOP_ARCHIVES, archive_lines, corpus_files

pytestmark = pytest.mark.spark


def _reports(lines: list[str]) -> list[tuple[str, int, int]]:
    """(server id, seq, ingress time) of each line's report, as `convert`'s ledger sees it."""
    found = []
    for line in lines:
        try:
            msg = prepare(parse_archive_line(line)).msg
        except DecodeError:
            continue
        found.append((msg.server.id, msg.seq, msg.ingress.ts_ns))
    return found


def _odd_reports(line: str) -> list[str]:
    """A report of one server at the ends of the uint64 range, across 2**63, at seq 0 (not
    numbered) and in the year 2300 (a time over a signed long's range)."""
    record = orjson.loads(line)
    doc = orjson.loads(base64.b64decode(record["payload_b64"]))
    doc["server"]["id"] = "NODD"
    out = []
    for number, seq in enumerate((0, 1, 2, 5, 2**63 - 1, 2**63, 2**63 + 1, 2**64 - 2, 2**64 - 1)):
        doc["server"]["seq"] = seq
        doc["events"][0]["ts"] = f"2300-01-01T00:00:{number:02d}Z" if number % 2 else f"2026-11-22T02:16:{number:02d}Z"
        out.append(orjson.dumps({**record, "payload_b64": base64.b64encode(orjson.dumps(doc)).decode()}).decode())
    return out


def _kept_lines(seed: int) -> list[str]:
    """The corpus and the hop archives with 10 % of the lines lost, 200 redelivered, odd
    reports and garbage, shuffled."""
    rnd = random.Random(seed)
    lines = [line for path in corpus_files() for line in archive_lines(Path(path)) if line.strip()]
    lines += [line for path in HOP_ARCHIVES for line in archive_lines(path)]
    kept = [line for line in lines if rnd.random() >= 0.1]  # lost reports: gaps in the runs
    kept += rnd.sample(kept, 200)  # redelivered
    kept += _odd_reports(lines[0]) + [line.decode() for line in GARBAGE_LINES]
    rnd.shuffle(kept)
    return kept


@pytest.mark.parametrize("bucket_bits", [20, 3])
def test_runs_worked_out_by_spark_are_the_cores(spark, bucket_bits):
    kept = _kept_lines(29)
    frame = spark.createDataFrame([(line, "test") for line in kept], "value string, source string")
    keyed = keys.key_lines(frame, keys.ConvertSettings())

    found = runs.report_runs(keyed.select("server_id", "seq", "ts_ns"), bucket_bits=bucket_bits)

    reports = _reports(kept)
    expected = report_runs(reports)
    assert found == expected
    assert sum(len(server_runs) for server_runs in expected.values()) > 300  # many gaps
    assert [run[:2] for run in found["NODD"]] == [(1, 2), (5, 5), (2**63 - 1, 2**63 + 1), (2**64 - 2, 2**64 - 1)]
    assert found["NODD"][1][2] == parse_rfc3339_ns("2300-01-01T00:00:03Z") > 2**63
    # Undecodable lines and seq 0 (not numbered) are no reports.
    assert keyed.where("seq is null").count() == len(kept) - sum(seq > 0 for _, seq, _ in reports) > len(GARBAGE_LINES)


def test_each_context_gets_the_runs_holding_its_reports():
    index = runs.RunIndex({"A": ((7, 9, 70), (1, 5, 10), (11, 11, 110)), "B": ((2, 3, 20),)})
    assert index.covering([("A", 3), ("A", 8), ("A", 4), ("A", 6), ("C", 1), ("B", 4)]) == {
        "A": ((1, 5, 10), (7, 9, 70))}
    assert index.covering([("B", 2), ("A", 11)]) == {"A": ((11, 11, 110),), "B": ((2, 3, 20),)}
    assert index.covering([]) == {}


@pytest.mark.parametrize("seed", range(20))
def test_runs_of_shares_merged_are_the_runs_of_the_whole(seed):
    """However the reports are shared out among tasks, and whatever a task adds twice (a
    retry), the shares' runs merged are the core's runs of the whole."""
    rnd = random.Random(seed)
    reports = _reports(_kept_lines(seed))
    expected = report_runs(reports)
    shares: list[list[tuple[str, int, int]]] = [[] for _ in range(rnd.randint(1, 40))]
    for report in reports:
        rnd.choice(shares).append(report)
    total = keys.KeyTally.zero({})["runs"]
    for share in [*shares, *rnd.sample(shares, min(3, len(shares)))]:
        runs.merge(total, runs.islands(share))
    assert total == expected
    assert sum(len(server_runs) for server_runs in expected.values()) > 300  # many gaps


def test_the_key_pass_brings_the_runs_back_in_its_tally(spark):
    kept = _kept_lines(29)
    frame = spark.createDataFrame([(line, "test") for line in kept], "value string, source string").repartition(7)
    tally = spark.sparkContext.accumulator(keys.KeyTally.zero({}), keys.KeyTally())
    keys.key_lines(frame, keys.ConvertSettings(), tally).count()
    assert tally.value["runs"] == report_runs(_reports(kept))
    assert sum(tally.value["rejects"].values()) == len(GARBAGE_LINES)
