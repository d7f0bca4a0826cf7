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
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["SHIFT", "RunIndex", "Runs", "report_runs"]

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
