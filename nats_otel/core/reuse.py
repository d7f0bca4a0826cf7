"""Detecting a traceparent reused on several messages (an application bug that happens).

Two messages with the same traceparent crossing the same server at the same hop would get
the same span ids. The detector numbers such occurrences (0 for the first), by ingress
time, and mapping salts the ids of later occurrences with that number. Hop linking of
reused traceparents is then best effort: the n-th occurrence downstream is linked to the
n-th occurrence upstream.

Owned by the caller (the bridge loop, `convert`), never by the pure mapping.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

__all__ = ["ReuseDetector", "ReuseKey", "assign_occurrences"]

ReuseKey = tuple[bytes, bytes, str, str]  # trace id, parent span id, server id, hop


class ReuseDetector:
    """Streaming detector with a bounded LRU of recently seen keys.

    `occurrence(key, ingress_ns)` returns 0 for the first message seen with a key, and
    1, 2, ... for messages with the same key but a different ingress time. The same
    message seen again (a redelivery) gets the number it got the first time.
    """

    __slots__ = ("_capacity", "_seen", "reused")

    def __init__(self, capacity: int = 100_000) -> None:
        self._capacity = capacity
        self._seen: OrderedDict[ReuseKey, list[int]] = OrderedDict()
        self.reused = 0  # messages that got an occurrence > 0

    def occurrence(self, key: ReuseKey, ingress_ns: int) -> int:
        """The occurrence number of the message with this key and ingress time."""
        times = self._seen.get(key)
        if times is None:
            self._seen[key] = [ingress_ns]
            if len(self._seen) > self._capacity:
                self._seen.popitem(last=False)
            return 0
        self._seen.move_to_end(key)
        try:
            return times.index(ingress_ns)
        except ValueError:
            times.append(ingress_ns)
            self.reused += 1
            return len(times) - 1

    def __len__(self) -> int:
        return len(self._seen)


def assign_occurrences(keyed: Iterable[tuple[ReuseKey, int]]) -> list[int]:
    """Batch version for whole inputs (`convert`, the backfill): order-independent.

    Within each key, distinct ingress times are ranked in time order, so shuffled input
    gives the same numbers. Returns one number per input item, in input order.
    """
    items = list(keyed)
    by_key: dict[ReuseKey, set[int]] = {}
    for key, ingress_ns in items:
        by_key.setdefault(key, set()).add(ingress_ns)
    ranks = {key: {ns: rank for rank, ns in enumerate(sorted(times))} for key, times in by_key.items()}
    return [ranks[key][ingress_ns] for key, ingress_ns in items]
