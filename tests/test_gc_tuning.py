"""The bridge's GC tuning: fewer young collections, setup objects frozen, cycles still freed."""

from __future__ import annotations

import subprocess
import sys

# GC settings are process-wide: measure in a fresh interpreter, never in the test process.
_PROBE = """
import gc, weakref
from nats_otel.gc_tuning import YOUNG_THRESHOLD, tune_gc_for_throughput
default = gc.get_threshold()
tune_gc_for_throughput()
assert gc.get_threshold() == (YOUNG_THRESHOLD, 20, 10), gc.get_threshold()
assert gc.get_freeze_count() > 0
class Node: pass
a, b = Node(), Node()
a.other, b.other = b, a          # a reference cycle: refcounting alone never frees it
alive = weakref.ref(a)
del a, b
gc.collect()
print(default[0], alive() is None)
"""


def test_tuning_raises_young_threshold_and_still_collects_cycles():
    done = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True)
    default_young, cycle_freed = done.stdout.split()
    assert int(default_young) < 50_000  # the tuning changes something
    assert cycle_freed == "True"


# `after_batch`: survivors frozen (not walked again); a cycle frozen in is still freed by the
# periodic full collection; nothing at all without the tuning (a program embedding Bridge).
_AFTER_BATCH = """
import gc, weakref
from nats_otel import gc_tuning
class Node: pass
def cycle():
    a, b = Node(), Node()
    a.other, b.other = b, a
    alive = weakref.ref(a)
    return alive
gc_tuning.after_batch()
untuned_frozen = gc.get_freeze_count()
gc_tuning.tune_gc_for_throughput()
gc_tuning.FULL_COLLECTION_EVERY_S = 3600.0
gc_tuning._next_full_at = float("inf")
alive = cycle()                      # garbage, but frozen before any collection saw it
gc_tuning.after_batch()
gc.collect()                         # a collection never looks at frozen objects
frozen_survives = alive() is not None
gc_tuning._next_full_at = 0.0        # the full collection is due
before = gc.get_freeze_count()
gc_tuning.after_batch()
print(untuned_frozen, frozen_survives, alive() is None, gc.get_freeze_count() > 0,
      gc.get_freeze_count() < before, gc_tuning._next_full_at > 0)
"""


def test_after_batch_freezes_survivors_and_collects_them_periodically():
    done = subprocess.run([sys.executable, "-c", _AFTER_BATCH], capture_output=True, text=True, check=True)
    untuned_frozen, frozen_survives, freed, refrozen, fewer, rescheduled = done.stdout.split()
    assert untuned_frozen == "0"  # no tuning asked for: the collector is left alone
    assert frozen_survives == "True"  # frozen: ordinary collections skip it (the point)
    assert freed == "True"  # the periodic full collection frees the cycle anyway
    assert refrozen == "True" and fewer == "True"  # what is left is frozen again, minus the garbage
    assert rescheduled == "True"
