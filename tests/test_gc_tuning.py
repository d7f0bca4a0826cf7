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
