"""The whole input's report runs (`nats_otel.core.report_ledger.report_runs`), worked out by Spark.

Every trace message carries its server's event number (`server.seq`); runs of consecutive
numbers say where a report was lost, and the linker decides crowded hops (many messages of
one context over one hop) only across stretches where nothing was lost. `nats-otel convert`
sees the whole input; the backfill converts one trace context at a time, so it works the
runs out over all contexts first and hands them to every context's `convert_batch`.

The runs are "islands" of consecutive numbers: ordered by seq, `seq - dense_rank()` is the
same within a run. Numbered per server and bucket of 2^20 seqs (a busy server's reports are
not one sort in one task), then the buckets' runs that touch are joined, per server: a
second, small pass (as many rows as runs). Only the runs (one per server, plus one per gap
in its numbers) come back to the driver.

That takes four stages over the persisted records: 1.2 s of a 15 s job at 200k trace
messages on two cores, plus each job's own start (docs/backfill.md, "Where the time
goes"). A classic session has a shorter way: each task of the key pass works out the runs
of the reports it read (`islands`), an accumulator merges them on the driver (`merge`,
`RunsTally`) as the tasks finish. Runs that touch or overlap join, so the union is exact
whatever split of the input each task had, and a task retried adds nothing new. The
driver holds at most the runs plus a run's two ends per task and server: the order of
what `report_runs` collects. Spark Connect has no accumulators: `report_runs` there.
"""

from __future__ import annotations

import heapq
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["SHIFT", "RunIndex", "Runs", "RunsTally", "islands", "merge", "report_runs"]

# Which reports of each server an input holds: (first seq, last seq, earliest and latest
# report times) of each run, per server id (what `convert_batch` takes as `report_runs`).
Runs = dict[str, Sequence[tuple[int, int, int, int]]]

# Seqs and report times are uint64 (a server's counter; ns up to the year 2554): Spark's
# long is signed, so they travel as `value - SHIFT`, which keeps their order and their
# differences (a hostile seq of 2**64 - 1 cannot overflow the column or fail the job).
SHIFT = 1 << 63


def report_runs(reports: Any, bucket_bits: int = 20) -> Runs:
    """`report_ledger.report_runs` of the reports of a DataFrame (`server_id` string, `seq` and
    `ts_ns` long, both less `SHIFT`; rows with a null seq are not reports). A (server, seq)
    reported more than once counts once, with its earliest time."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    seq, first, last, since, until = F.col("seq"), F.col("first"), F.col("last"), F.col("since"), F.col("until")
    numbered = reports.where(seq.isNotNull()).withColumn("bucket", F.shiftright(seq, bucket_bits))
    # dense_rank: a seq seen twice (a redelivery) is numbered once. seq - rank >= the
    # bucket's lowest possible seq, never below the long's minimum.
    island = seq - F.dense_rank().over(Window.partitionBy("server_id", "bucket").orderBy(seq))
    pieces = numbered.withColumn("island", island).groupBy("server_id", "bucket", "island").agg(
        F.min(seq).alias("first"), F.max(seq).alias("last"), F.min("ts_ns").alias("since"),
        F.max("ts_ns").alias("until"))
    by_first = Window.partitionBy("server_id").orderBy(first)
    starts = F.when(F.lag(last).over(by_first) == first - 1, 0).otherwise(1)
    run = F.sum(starts).over(by_first.rowsBetween(Window.unboundedPreceding, Window.currentRow))
    rows = pieces.withColumn("run", run).groupBy("server_id", "run").agg(
        F.min(first).alias("first"), F.max(last).alias("last"), F.min(since).alias("since"),
        F.max(until).alias("until")).collect()
    found: dict[str, list[tuple[int, int, int, int]]] = {}
    for row in rows:
        found.setdefault(row["server_id"], []).append((row["first"] + SHIFT, row["last"] + SHIFT,
                                                       row["since"] + SHIFT, row["until"] + SHIFT))
    return {server_id: tuple(sorted(server_runs)) for server_id, server_runs in sorted(found.items())}


def _joined(pieces: Iterable[tuple[int, int, int, int]]) -> tuple[tuple[int, int, int, int], ...]:
    """Runs of (first, last, since, until) pieces sorted by first: those that touch or overlap joined."""
    out: list[tuple[int, int, int, int]] = []
    for first, last, since, until in pieces:
        if out and first <= out[-1][1] + 1:
            a_first, a_last, a_since, a_until = out[-1]
            out[-1] = (a_first, max(a_last, last), min(a_since, since), max(a_until, until))
        else:
            out.append((first, last, since, until))
    return tuple(out)


def islands(reports: Iterable[tuple[str, int, int]]) -> Runs:
    """`report_ledger.report_runs` of (server id, seq, report time) reports, worked out by
    sorting (a task's share of the input: `merge` joins the shares)."""
    by_server: dict[str, list[tuple[int, int, int, int]]] = {}
    for server_id, seq, ts_ns in reports:
        if seq <= 0:  # not numbered: no report, as in the ledger
            continue
        by_server.setdefault(server_id, []).append((seq, seq, ts_ns, ts_ns))
    return {server_id: _joined(sorted(pieces)) for server_id, pieces in sorted(by_server.items())}


def merge(total: dict[str, Any], more: Runs) -> dict[str, Any]:
    """`total` with the runs of `more` joined in (in place): the runs of both inputs. Both
    are sorted by first seq, so they are merged in one pass: a task's runs cost the driver
    their number plus the server's runs so far, never a sort of all of them."""
    for server_id, pieces in more.items():
        total[server_id] = _joined(heapq.merge(total.get(server_id, ()), pieces))
    return total


class RunsTally:
    """The runs of the reports the tasks read, merged as they finish (an AccumulatorParam)."""

    @staticmethod
    def zero(value: Runs) -> dict[str, Any]:
        return {}

    @staticmethod
    def addInPlace(total: dict[str, Any], more: Runs) -> dict[str, Any]:  # noqa: N802 - Spark's name
        return merge(total, more)


class RunIndex:
    """The whole input's runs, from which each trace context gets the few it needs.

    A context's ledger only ever asks about the runs that hold its own reports
    (`ReportLedger.complete`), so those answer as the whole would; handing every context
    all of them would cost each one the whole input's gaps (`use_runs` copies them). Built
    on the driver, shipped to the executors with the conversion."""

    __slots__ = ("_firsts", "_runs")

    def __init__(self, runs: Runs) -> None:
        self._runs = {server_id: tuple(sorted(server_runs)) for server_id, server_runs in runs.items()}
        self._firsts = {server_id: [run[0] for run in server_runs] for server_id, server_runs in self._runs.items()}

    def covering(self, reports: Iterable[tuple[str, int]]) -> Runs:
        """The runs holding some of `reports` (server id, seq)."""
        found: dict[str, set[tuple[int, int, int, int]]] = {}
        for server_id, seq in reports:
            firsts = self._firsts.get(server_id)
            if firsts is None:
                continue
            at = bisect_right(firsts, seq) - 1
            if at >= 0 and seq <= self._runs[server_id][at][1]:
                found.setdefault(server_id, set()).add(self._runs[server_id][at])
        return {server_id: tuple(sorted(server_runs)) for server_id, server_runs in sorted(found.items())}
