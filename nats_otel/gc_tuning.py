"""Garbage-collector settings for the bridge's processes and `convert` (which holds its input).

Converting one trace message allocates a few hundred short-lived objects (the decoded
model, span records, attribute tuples), nearly all freed by reference counting; cycles are
rare. With CPython's default young-generation threshold (700 allocations) the collector
ran every few messages and walked the whole batch in flight each time: in py-spy profiles
of a loaded bridge the cost showed up on whichever line allocated. Collecting less often,
and never again walking what imports and setup created (`gc.freeze`), cost ~6-29 % less
CPU per message in `bench/gc_tuning.py` (typically ~10-15 %; docs/performance.md). Memory
stays bounded: cycles are still collected, just in bigger, rarer sweeps.

The live bridge also holds every message of the last `link.wait` (about a second of
traffic, hundreds of thousands of objects) while it waits for the other side of its hops.
Those survivors were walked again by every older-generation collection: ~12 % of the
bridge's CPU under load (perf: `gc_collect_main`, `visit_reachable`). `after_batch`
freezes what survived each batch, so the collector only ever walks what the last batch
allocated; once every `FULL_COLLECTION_EVERY_S` everything is unfrozen and collected, so a
cycle that spans batches is still reclaimed within that time. The bridge calls it after each
batch is observed (what the link window holds is made then) and after each is converted:
with the second alone, a 60k burst still ran ~18 young collections over the observed
batches waiting for the window, ~80-100 ms (~1.5 µs per trace message, ~5 % of the bridge's
CPU); with both, none or one (docs/performance.md, session 34). Only in processes that asked
for throughput tuning (the CLI's bridge, its workers): a program embedding `Bridge` keeps
its own collector as it is.
"""

from __future__ import annotations

import gc
import time

__all__ = ["FULL_COLLECTION_EVERY_S", "after_batch", "tune_gc_for_throughput"]

YOUNG_THRESHOLD = 50_000  # allocations between young collections (CPython default: 700)
#: The longest a garbage cycle created while batches run stays uncollected.
FULL_COLLECTION_EVERY_S = 60.0

_tuned = False
_next_full_at = 0.0


def tune_gc_for_throughput() -> None:
    """Call once, after setup and before the message loop."""
    global _tuned, _next_full_at
    gc.collect()
    gc.freeze()  # modules, settings, exporters: alive until exit, never scanned again
    gc.set_threshold(YOUNG_THRESHOLD, 20, 10)
    _tuned = True
    _next_full_at = time.monotonic() + FULL_COLLECTION_EVERY_S


def after_batch() -> None:
    """Call after each batch: what survived it (mostly messages waiting out the link
    window, freed later by reference counting) is not walked again by the collector, and
    once every `FULL_COLLECTION_EVERY_S` a full collection looks at everything. A no-op
    unless `tune_gc_for_throughput` was called in this process."""
    global _next_full_at
    if not _tuned:
        return
    now = time.monotonic()
    if now >= _next_full_at:
        _next_full_at = now + FULL_COLLECTION_EVERY_S
        gc.unfreeze()
        gc.collect()
    gc.freeze()
