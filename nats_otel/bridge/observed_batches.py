"""What the processor observed, held batch by batch through the link window: the entries of
each observed batch (`Converter.observe_held`), by its first message, until `convert` gives
them back (`Converter.convert_many(raws, observed=...)`).

Why not the converter's own store (`_pending`, a dict by each raw message's id): in issue
48's burst it holds ~60k observed messages, and its two look-ups a message (on observe and
on convert: the table, the key and the entry each a cache miss in a dict that size) were
~2-3 % of the bridge's CPU (`perf`, docs/performance.md, session 39). The bridge converts
its batches whole and in the order observed (the ripening joins whole batches:
`ripening.py`), so one look-up a batch finds them here. `take` hands over a new list of
them, which `convert_many` consumes: each entry, and the message it decoded, is freed as
its message is converted, while still in the CPU's caches (docs/performance.md, session 46).

What is not converted as it was observed (a batch split or reordered, or held past the
bound here: a drain that ran out never converts its batches) goes back to the converter
(`Converter.adopt`), which then finds each message's entry and bounds them as before
(`pending_capacity`: past it the oldest are decoded again when converted). Nothing held
grows without bound: at most `max_messages` here, `pending_capacity` there.

Payloads released once observed (`release_payloads`: the bridge in core mode, in one
process, archiving nothing): once a batch is observed, nothing reads its messages' payloads
again (its entries hold what `convert` maps; forwarding to an owner happens before the
observation; only the archive, written at `convert`, and a message decoded again read them).
So each raw message's payload is replaced by `RELEASED` as it is observed (the processor
passes `released` to `Converter.observe_held`, which does it in C in the kernel: a loop over
each batch here cost ~1.5 % of the bridge's CPU, session 49): the link window holds each
trace message's parse, not also the ~0.7 KB of JSON it came from. In
issue 48's burst: peak RSS 262 -> 220 MB, a fifth fewer page faults, and ~5 % less CPU a
message (docs/performance.md, session 47). A message decoded again (its entry dropped past
`pending_capacity`, after `take` gave the batches back) cannot be: `name_released` says so
in its result (`Rejected`, reason `PAST_THE_BOUND`), counted as every rejected message is.
"""

from __future__ import annotations

from collections.abc import Sequence

from nats_otel.core.decode import RawTraceMessage
from nats_otel.core.engine import Converter
from nats_otel.core.pipeline import Converted, Observed, Rejected, entry_raw

__all__ = ["PAST_THE_BOUND", "RELEASED", "ObservedBatches"]

#: What a released payload is replaced with: an object of its own, told by identity from
#: every payload received (each is a new bytes object), and not JSON.
RELEASED = b"<payload released once observed>"
#: The reason of a released message that had to be decoded again (`name_released`).
PAST_THE_BOUND = "past_window_bound"


class ObservedBatches:
    """Observed batches' entries by their first message, oldest first, at most `max_messages`
    entries in all (past it the oldest batches go back to the converter)."""

    def __init__(self, converter: Converter, max_messages: int, release_payloads: bool = False) -> None:
        self._converter = converter
        self._batches: dict[int, list[Observed]] = {}  # id of the batch's first raw -> its entries
        self._max_messages = max_messages
        self._release = release_payloads
        self.messages = 0

    @property
    def released(self) -> bytes | None:
        """What `observe_held` replaces each payload with (`release`), or None: kept."""
        return RELEASED if self._release else None

    def put(self, entries: list[Observed]) -> None:
        """Hold one observed batch's entries (`observe_held`'s, in order: with `released`, their
        messages' payloads released)."""
        if not entries:
            return
        # An entry holds its raw message, so no other live message has its id; but the same
        # message may begin two batches (the bridge makes each anew; a caller may not): the
        # earlier batch goes to the converter, so that the count stays exact.
        key = id(entry_raw(entries[0]))
        earlier = self._batches.pop(key, None)
        if earlier is not None:
            self.messages -= len(earlier)
            self._converter.adopt(earlier)
        self._batches[key] = entries
        self.messages += len(entries)
        while self.messages > self._max_messages:
            oldest = self._batches.pop(next(iter(self._batches)))
            self.messages -= len(oldest)
            self._converter.adopt(oldest)

    def peek(self, raws: Sequence[RawTraceMessage]) -> list[Observed] | None:
        """The entries of `raws` if they are one held batch, as observed (kept held)."""
        entries = self._batches.get(id(raws[0])) if raws else None
        return entries if entries is not None and _covers(entries, raws, 0) else None

    def take(self, raws: Sequence[RawTraceMessage]) -> list[Observed] | None:
        """The entries of `raws` (removed) if they are held batches, whole and in order;
        else None, and every held batch given back to the converter (rare: it then finds
        each message's entry itself)."""
        taken: list[Observed] = []
        at, end = 0, len(raws)
        while at < end:
            entries = self._batches.pop(id(raws[at]), None)
            if entries is None:
                break
            self.messages -= len(entries)
            taken += entries
            if not _covers(entries, raws, at):
                break
            at += len(entries)
        else:
            return taken
        self._converter.adopt(taken)
        self.give_back()
        return None

    def name_released(self, raws: Sequence[RawTraceMessage], results: list[Converted | Rejected]) -> None:
        """After `raws` were converted without their entries (`take` gave None): a message
        whose payload was released and whose entry the converter had dropped (past
        `pending_capacity`) was decoded again from `RELEASED`; its result (`results`, in
        place) says why it has no spans, not that its JSON was bad. Nothing to look at
        where nothing is released."""
        if not self._release:
            return
        for at, raw in enumerate(raws):
            if raw.payload is RELEASED and isinstance(results[at], Rejected):
                results[at] = Rejected(PAST_THE_BOUND, "held past the link window's bound of observed messages "
                                       "after its payload was released: not decoded again", raw.subject)

    def give_back(self) -> None:
        """Every held batch to the converter (which finds each message's entry itself)."""
        for entries in self._batches.values():
            self._converter.adopt(entries)
        self._batches.clear()
        self.messages = 0


def _covers(entries: list[Observed], raws: Sequence[RawTraceMessage], at: int) -> bool:
    """The batch's first and last messages are `raws`' from `at` on (the converter checks the
    rest: `convert_many`'s `observed`)."""
    last = at + len(entries) - 1
    return last < len(raws) and entry_raw(entries[0]) is raws[at] and entry_raw(entries[-1]) is raws[last]
