"""Garbage-collector settings for the bridge's processes and `convert` (which holds its input).

Converting one trace message allocates a few hundred short-lived objects (the decoded
model, span records, attribute tuples), nearly all freed by reference counting; cycles are
rare. With CPython's default young-generation threshold (700 allocations) the collector
ran every few messages and walked the whole batch in flight each time: in py-spy profiles
of a loaded bridge the cost showed up on whichever line allocated. Collecting less often,
and never again walking what imports and setup created (`gc.freeze`), cost ~6-29 % less
CPU per message in `bench/gc_tuning.py` (typically ~10-15 %; docs/performance.md). Memory
stays bounded: cycles are still collected, just in bigger, rarer sweeps.
"""

from __future__ import annotations

import gc

__all__ = ["tune_gc_for_throughput"]

YOUNG_THRESHOLD = 50_000  # allocations between young collections (CPython default: 700)


def tune_gc_for_throughput() -> None:
    """Call once, after setup and before the message loop."""
    gc.collect()
    gc.freeze()  # modules, settings, exporters: alive until exit, never scanned again
    gc.set_threshold(YOUNG_THRESHOLD, 20, 10)
