"""What this bridge can say of its own completeness, for the report ledger and its peers.

The linker counts alike messages by order only where no report can be missing
(`core.sequences`, `core.report_ledger`). A core-mode bridge in one process knows that of
its sources: each counts the times it could have lost a trace message (`CoreSource.breaks`:
queue_full, slow_consumer, a lost connection) and knows since when it is subscribed
(`whole_since_ns`). Until when it is whole is what it has *observed*: everything received
before a batch was collected with the intake left empty is in that batch or an earlier one,
and the batches are observed in order. That time, less twice the servers' clock skew (the
ledger compares report times, and a report may still be on its way), is what it vouches
until - never the present while a backlog waits in the intake.

The same state goes with the link evidence to the peers (`exchange`), so that a queue
group's bridges, each with a share of every server's reports, vouch together
(`ReportLedger`'s members).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from nats_otel.bridge.sources.nats_core import CoreSource
from nats_otel.core.evidence import Streams

__all__ = ["PEER_SILENCE_S", "Wholeness", "members_known"]

# A peer heard from neither evidence nor heartbeat (`exchange`, every second) for this long
# has stopped receiving: its bridge stopped or died, and its subscription went with its
# connection. What was reported after that was routed to the others.
PEER_SILENCE_S = 10.0


class Wholeness:
    """The core sources' losses, whole since and observed until (see the module docstring)."""

    def __init__(self, sources: Sequence[Any], max_clock_skew_s: float, intake: Any) -> None:
        self._sources = sources  # the bridge's list: filled when they start
        self._margin_ns = int(2 * max_clock_skew_s * 1e9)
        self._intake = intake
        self._observed_until_ns: int | None = None
        self._observing = 0  # batches collected and not yet observed

    def collecting(self) -> None:
        """A batch's first delivery was taken: until it is observed, what it holds is neither
        in the intake nor observed (at rest, `idle` must not say it was)."""
        self._observing += 1

    def collected(self) -> int | None:
        """Right after a batch was taken (`collecting` before it): its time, if the intake was
        left empty (everything received before it is in this batch or an earlier one); else None."""
        return time.time_ns() if self._intake.empty() else None

    def observed(self, collected_ns: int | None) -> None:
        """The batch `collected` at `collected_ns` was observed."""
        self._observing -= 1
        self._advance(collected_ns)

    def idle(self) -> None:
        """Nothing waits in the intake and no batch is being observed: all received was."""
        if not self._observing and self._intake.empty():
            self._advance(time.time_ns())

    def _advance(self, until_ns: int | None) -> None:
        if until_ns is not None and (self._observed_until_ns is None or until_ns > self._observed_until_ns):
            self._observed_until_ns = until_ns

    def streams(self, collected_ns: int | None = None) -> Streams:
        """Each core source's (losses, whole since, whole until) in report time; with
        `collected_ns`, as if the batch collected then were observed already (the state that
        goes out with that batch's evidence). At rest (`idle`), observed until now."""
        self.idle()
        until_ns = self._observed_until_ns
        if collected_ns is not None and (until_ns is None or collected_ns > until_ns):
            until_ns = collected_ns
        until = None if until_ns is None else until_ns - self._margin_ns
        streams: Streams = {}
        for source in self._sources:
            if isinstance(source, CoreSource):
                breaks = source.breaks
                whole = breaks == source.since_breaks  # nothing lost since `whole_since_ns`
                streams[source.source.name] = (breaks, source.whole_since_ns if whole else None, until)
        return streams

    def start_anew(self) -> None:
        """The bridges' trace ownership changed (`routing`): each core source vouches anew,
        whole from now (`CoreSource.note_reroute`, report time: the clock skew margin after)."""
        for source in self._sources:
            if isinstance(source, CoreSource):
                source.note_reroute(self._margin_ns)

    def departures(self) -> tuple[float, int]:
        """(heard before, gone after): peers last heard before the first (monotonic) left;
        nothing reported after the second (report time) was routed to them."""
        return time.monotonic() - PEER_SILENCE_S, time.time_ns() + self._margin_ns


def members_known(exchange: Any, queue_group: str | None) -> bool:
    """Whether this bridge knows every stream its servers route its reports to, as vouching
    needs: alone (no queue group), or hearing the link exchange its queue group's members
    speak on (its own heartbeat came back: `LinkExchange.heard_itself`). A member never heard
    of covers nothing here, so a gap in a server's numbers routed to it would count as
    accounted for, and alike messages could link wrong: a bridge that cannot hear the
    exchange (its user may not publish there) or runs a queue group with it off vouches for
    nothing, and alike messages link by their numbers alone."""
    if exchange is not None:
        return bool(exchange.heard_itself)
    return queue_group is None
