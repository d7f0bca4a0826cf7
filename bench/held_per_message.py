"""What one observed trace message holds while it waits in the live bridge's link window.

The corpus mix (`corpus_replay.replicate`), each message made as the bridge's receive makes
it (an interned subject, the receive's headers, the payload) and observed in batches of 512
by the running core's `Converter.observe_held`, its payload then released as the bridge
releases it (`observed_batches.RELEASED`). Two counts, per message:

- tracemalloc: the bytes and blocks allocated from just before the raw messages are made to
  just after the last batch is observed, still held (the raw messages, their records, the
  link index's entries);
- a walk of the held entries by type (`sys.getsizeof`, each object once): what each kind of
  object costs, and how many a message holds.

    python setup.py build_ext --inplace
    PYTHONPATH=. python bench/held_per_message.py [--messages 6000]

With a baseline checkout, `PYTHONPATH=/path/to/base python bench/held_per_message.py`: a
count, not a time, so the two runs need not be paired. Measured so in docs/performance.md
(sessions 46-52).
"""

from __future__ import annotations

import argparse
import gc
import sys
import tracemalloc
import types
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from corpus_replay import replicate

from nats_otel.bridge.observed_batches import RELEASED
from nats_otel.bridge.sources.stamp import received_at
from nats_otel.core import decode, engine
from nats_otel.core.decode import RawTraceMessage

BATCH = 512


def _receive_headers() -> Any:
    # The headers the receive gives a message without any: one shared dict where this
    # checkout has it (`decode.NO_RAW_HEADERS`), else a new one each, as it did before.
    return getattr(decode, "NO_RAW_HEADERS", None)


# The kernel's per-message record's fields (`_stage_record.pxi`), read by name
_RECORD_FIELDS = ("raw", "server", "headers", "msg_size", "hops", "unknown_events", "seq",
                  "ident", "issues", "size", "id_fields", "trace_state", "adhoc_key", "arrival_key", "arrival_entry",
                  "egress_ids")


def by_type(held: list[Any]) -> tuple[Counter[str], Counter[str]]:
    """Bytes and objects of each type reachable from `held`, each object counted once."""
    seen: set[int] = set()
    sizes: Counter[str] = Counter()
    counts: Counter[str] = Counter()
    stack = list(held)
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, (type, types.ModuleType, types.FunctionType)):
            continue
        seen.add(id(obj))
        name = type(obj).__name__
        sizes[name] += sys.getsizeof(obj)
        counts[name] += 1
        stack.extend(gc.get_referents(obj))
        fields = getattr(type(obj), "__struct_fields__", None)  # msgspec Structs: gc=False, no referents
        if fields:
            stack.extend(getattr(obj, field) for field in fields)
        elif name == "MessageRecord":  # the kernel's record: not tracked by gc either
            stack.extend(getattr(obj, field) for field in _RECORD_FIELDS)
            # its events' shapes, as it holds them (`ingress` and `events` would make new records)
            stack.extend(obj.shapes() if hasattr(obj, "shapes") else (obj.ingress, *obj.events))
    return sizes, counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=6000)
    args = parser.parse_args()
    corpus = replicate(args.messages)
    shared = _receive_headers()
    subjects: dict[str | None, str | None] = {}
    stamp = received_at()  # the receive stamps each read once: one text shared by its messages
    converter = engine.Converter()
    gc.disable()  # nothing freed behind the count's back
    tracemalloc.start(1)
    before = tracemalloc.take_snapshot()
    raws = [RawTraceMessage(subjects.setdefault(r.subject, r.subject), {} if shared is None else shared,
                            r.payload, stamp) for r in corpus]
    held = [converter.observe_held(raws[at:at + BATCH], 0.0, RELEASED) for at in range(0, len(raws), BATCH)]
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    diff = after.compare_to(before, "filename")
    count = len(raws)
    print(f"{engine.implementation()} core, {count:,} messages of the corpus mix, payloads released")
    print(f"held a message (tracemalloc): {sum(d.size_diff for d in diff) / count:,.0f} bytes, "
          f"{sum(d.count_diff for d in diff) / count:.1f} blocks")
    sizes, counts = by_type(held)
    print(f"the held entries by type: {sum(sizes.values()) / count:,.0f} bytes, "
          f"{sum(counts.values()) / count:.1f} objects a message")
    for name, size in sizes.most_common(16):
        print(f"  {name:24s} {size / count:7.1f} B {counts[name] / count:5.2f}")


if __name__ == "__main__":
    main()
