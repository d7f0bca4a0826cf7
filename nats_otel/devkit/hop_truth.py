"""The truth of every hop link, from order on each connection alone, and a score against it.

Issue 29 asks for links that hold where users deploy (N bridges, batches under one trace
context, lost reports). Measuring that needs an instrument that does not share the
linker's assumptions, so this module never looks at `core/linking.py`, the pipeline's
`Linker`, trace ids, hop ids or sizes to decide a link. It uses what NATS guarantees:
messages on one connection are delivered in order. For every route, gateway and leafnode
connection from an upstream server U to a peer D:

* U's forwarding egresses on that connection (its `cid`, `name` = D), sorted by time, are
  one sequence;
* D's ingresses from U (`ingress.name` = U) on D's side of the same connection (D's own
  `cid`), sorted by time, are the other;
* the k-th egress is the k-th arrival.

The two sides number their connections independently, and two servers may share several
connections (route pooling: one per account hash), so each of U's connections to D is
paired with one of D's connections from U by their sequences: equal lengths, every arrival
within a window of its egress, and the smallest spread of arrival-minus-egress (a real link
has a near-constant latency; a wrong pairing does not). Connections that cannot be paired
cleanly (no partner, or several partners fitting about as well) are reported, not guessed.

The hop id, trace context and size are then compared along the pairing as a check only
(`Truth.label_mismatches`): if order and labels ever disagree, the instrument says so. Within
a batch under one context those labels are all alike, so traffic made to be checked
(`devkit.hop_traffic`) numbers its messages in a header of their own, `SEQUENCE_HEADER`,
which every report copies: where both reports carry it, it must agree too. The linker
under test never reads it (it is not allow-listed, and all numbers have the same width,
so it leaves sizes alike).

Pure: no I/O, no clock. `devkit.hop_score` classifies a bridge's or `convert`'s output
against the truth.
"""

from __future__ import annotations

import itertools
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from nats_otel.core.decode import DecodeError, RawTraceMessage, decode
from nats_otel.core.ids import TraceContext, event_span_id, identity, server_span_id, trace_context
from nats_otel.core.model import FORWARDING_KINDS, TraceMessage, kind_label
from nats_otel.core.model import Egress as EgressEvent

__all__ = [
    "SEQUENCE_HEADER",
    "ConnectionProblem",
    "Hop",
    "LinkId",
    "Truth",
    "TruthSettings",
    "compute_truth",
]

_HOP_HEADER = "nats-trace-hop"
#: A header numbering each message of checkable traffic (fixed width): a check of the truth.
SEQUENCE_HEADER = "Hop-Check-Seq"


@dataclass(frozen=True, slots=True)
class TruthSettings:
    """How far an arrival may be from its egress for a connection pairing to be considered.

    Wide on purpose: the window only rules pairings out, the spread of the latency chooses
    among the rest. `max_early_ns` allows for clock offsets between hosts (on one host
    arrivals are never early); `max_latency_ns` for a loaded machine.
    `clear_margin`: the best pairing of a group of pooled connections must have less than
    this fraction of the next best pairing's spread to count as clean.
    """

    max_early_ns: int = 100_000_000
    max_latency_ns: int = 2_000_000_000
    clear_margin: float = 0.5


class _Report(NamedTuple):
    """One decoded trace message with what the truth needs from it."""

    msg: TraceMessage
    ctx: TraceContext
    ident: bytes


# Both sides sort by time, then by the report's identity: never by input order, so the
# truth is the same whatever order the trace messages came in.
class _Egress(NamedTuple):
    ts_ns: int
    ident: bytes
    position: int  # 1-based among the report's events: what `event_span_id` hashes
    report: int  # index into the reports


class _Arrival(NamedTuple):
    ts_ns: int
    ident: bytes
    report: int


# One side of one connection: (server id, cid). Server ids, not names: a restarted server
# has a new id and numbers its connections from scratch.
_Side = tuple[str, int]


class LinkId(NamedTuple):
    """One connection, seen from both ends: who sent, who received, each side's own cid."""

    upstream_server: str
    upstream_cid: int
    downstream_server: str
    downstream_cid: int
    kind: int

    def label(self) -> str:
        """`east-2#12 -> east-1#9 (router)`: readable in tables and problem lists."""
        return (f"{self.upstream_server}#{self.upstream_cid} -> {self.downstream_server}#{self.downstream_cid} "
                f"({kind_label(self.kind)})")


@dataclass(frozen=True, slots=True)
class Hop:
    """One crossing: the downstream report and the upstream egress that forwarded its message."""

    downstream: bytes  # the downstream report's identity (`ids.identity`)
    downstream_span_id: bytes  # its server span's id: how its span is found in an output
    parent_span_id: bytes  # the truth: the upstream egress span's id
    upstream: bytes  # the upstream report's identity
    link: LinkId
    index: int  # 0-based position of this message in its connection's sequence
    egress_ts_ns: int
    arrival_ts_ns: int
    #: The upstream report's trace context (`TraceContext.id_fields`): for the statistics of
    #: messages sharing one, which only order tells apart.
    context: bytes = b""

    @property
    def latency_ns(self) -> int:
        """Arrival minus egress: the link's latency for this message (clock offset included)."""
        return self.arrival_ts_ns - self.egress_ts_ns


@dataclass(frozen=True, slots=True)
class ConnectionProblem:
    """Connections between two servers whose sequences could not be paired cleanly.

    Their downstream reports get no truth (`Truth.unplaced`) rather than a guessed one.
    """

    upstream_server: str
    downstream_server: str
    kind: int
    reason: str
    egress_counts: tuple[int, ...]  # per upstream connection of the group
    arrival_counts: tuple[int, ...]  # per downstream connection of the group

    def describe(self) -> str:
        return (f"{self.upstream_server} -> {self.downstream_server} ({kind_label(self.kind)}): {self.reason}; "
                f"egresses per connection {list(self.egress_counts)}, arrivals {list(self.arrival_counts)}")


@dataclass(slots=True)
class Truth:
    """Every hop's true parent, keyed by the downstream report's identity, and what got in the way."""

    hops: dict[bytes, Hop] = field(default_factory=dict)
    problems: list[ConnectionProblem] = field(default_factory=list)
    #: Downstream reports in connections that were not paired: no truth for them.
    unplaced: set[bytes] = field(default_factory=set)
    #: Every decoded report's identity -> its server span id (origins included).
    reports: dict[bytes, bytes] = field(default_factory=dict)
    duplicates: int = 0  # the same report seen again (same identity): counted once
    rejected: int = 0  # trace messages that did not decode
    #: Forwarding egresses with an error (e.g. the peer does not trace): no downstream report.
    failed_egresses: int = 0
    #: Consecutive events of one connection's sequence at the same nanosecond (their order,
    #: hence their pairing, is then a guess): 0 in every capture so far.
    time_ties: int = 0
    #: Pairs (by order) whose hop id, trace context or size disagree: (what, hop); a check.
    label_mismatches: list[tuple[str, Hop]] = field(default_factory=list)

    def links(self) -> dict[LinkId, list[Hop]]:
        """The hops of each paired connection, in order."""
        out: dict[LinkId, list[Hop]] = defaultdict(list)
        for hop in self.hops.values():
            out[hop.link].append(hop)
        for hops in out.values():
            hops.sort(key=lambda h: h.index)
        return dict(out)


def compute_truth(raws: Iterable[RawTraceMessage], settings: TruthSettings = TruthSettings()) -> Truth:
    """The truth of every hop in a complete set of trace messages (any order, any contexts).

    Complete means: every report of every traced message that crossed a connection. A lost
    report makes its connection's two sequences differ in length; that connection pair is
    then reported in `problems` and its hops left out, never guessed.
    """
    truth = Truth()
    reports: list[_Report] = []
    for raw in raws:
        try:
            msg = decode(raw)
            ctx = trace_context(msg, raw.subject)
        except DecodeError:
            truth.rejected += 1
            continue
        ident = identity(msg)
        if ident in truth.reports:
            truth.duplicates += 1
            continue
        truth.reports[ident] = server_span_id(ctx, ident)
        reports.append(_Report(msg, ctx, ident))

    # Each side of each connection: (upstream name, downstream name, kind) groups the
    # connections that may be one another's other side.
    egress_sides: dict[tuple[str, str, int], dict[_Side, list[_Egress]]] = defaultdict(lambda: defaultdict(list))
    arrival_sides: dict[tuple[str, str, int], dict[_Side, list[_Arrival]]] = defaultdict(lambda: defaultdict(list))
    for number, report in enumerate(reports):
        msg = report.msg
        ingress = msg.ingress
        if ingress.kind in FORWARDING_KINDS:
            group = (ingress.name, msg.server.name, ingress.kind)
            arrival_sides[group][(msg.server.id, ingress.cid)].append(_Arrival(ingress.ts_ns, report.ident, number))
        for position, event in enumerate(msg.events, start=1):
            if type(event) is EgressEvent and event.kind in FORWARDING_KINDS and event.hop:
                if event.error:
                    truth.failed_egresses += 1
                    continue
                group = (msg.server.name, event.name, event.kind)
                egress_sides[group][(msg.server.id, event.cid)].append(
                    _Egress(event.ts_ns, report.ident, position, number))

    for group in sorted(set(egress_sides) | set(arrival_sides)):
        ups = {side: sorted(seq) for side, seq in sorted(egress_sides.get(group, {}).items())}
        downs = {side: sorted(seq) for side, seq in sorted(arrival_sides.get(group, {}).items())}
        # Two events of one connection at the same nanosecond: their order is unknown.
        sequences = [[e.ts_ns for e in seq] for seq in ups.values()]
        sequences += [[a.ts_ns for a in seq] for seq in downs.values()]
        for times in sequences:
            truth.time_ties += sum(1 for t, later in itertools.pairwise(times) if t == later)
        pairs, problem = _pair_connections(group, ups, downs, settings)
        if problem is not None:
            truth.problems.append(problem)
        paired_downs = set()
        for up_side, down_side in pairs:
            paired_downs.add(down_side)
            _record_hops(truth, reports, group, up_side, ups[up_side], down_side, downs[down_side])
        for down_side, arrivals in downs.items():
            if down_side not in paired_downs:
                truth.unplaced.update(reports[a.report].ident for a in arrivals)
    return truth


def _record_hops(truth: Truth, reports: list[_Report], group: tuple[str, str, int], up_side: _Side,
                 egresses: list[_Egress], down_side: _Side, arrivals: list[_Arrival]) -> None:
    link = LinkId(group[0], up_side[1], group[1], down_side[1], group[2])
    for index, (egress, arrival) in enumerate(zip(egresses, arrivals, strict=True)):
        up, down = reports[egress.report], reports[arrival.report]
        hop = Hop(
            downstream=down.ident,
            downstream_span_id=truth.reports[down.ident],
            parent_span_id=event_span_id(up.ctx, up.ident, egress.position),
            upstream=up.ident,
            link=link,
            index=index,
            egress_ts_ns=egress.ts_ns,
            arrival_ts_ns=arrival.ts_ns,
            context=up.ctx.id_fields,
        )
        truth.hops[down.ident] = hop
        for what in _label_disagreements(up, egress.position, down):
            truth.label_mismatches.append((what, hop))


def _label_disagreements(up: _Report, position: int, down: _Report) -> list[str]:
    """What the servers' labels say against a pairing made by order: a check, never a decision."""
    event = up.msg.events[position - 1]
    assert type(event) is EgressEvent
    found = []
    if (down.msg.header(_HOP_HEADER) or "") != event.hop:
        found.append("hop")
    if down.ctx.id_fields != up.ctx.id_fields:
        found.append("context")
    up_seq, down_seq = up.msg.header(SEQUENCE_HEADER), down.msg.header(SEQUENCE_HEADER)
    if up_seq is not None and down_seq is not None and up_seq != down_seq:
        found.append("sequence")
    if _size_without_hop(down.msg) != _size_without_hop(up.msg):
        found.append("size")  # legitimate across service imports, which add headers
    return found


def _size_without_hop(msg: TraceMessage) -> int:
    """The message size without `Nats-Trace-Hop` header lines (`Name: value\\r\\n` each)."""
    size = msg.msg_size
    for name, values in msg.headers.items():
        if name.lower() == _HOP_HEADER:
            size -= sum(len(name) + len(value) + 4 for value in values)
    return size


def _pair_connections(
    group: tuple[str, str, int],
    ups: Mapping[_Side, list[_Egress]],
    downs: Mapping[_Side, list[_Arrival]],
    settings: TruthSettings,
) -> tuple[list[tuple[_Side, _Side]], ConnectionProblem | None]:
    """Pair U's connections to D with D's connections from U; (pairs, problem or None)."""

    def problem(reason: str) -> ConnectionProblem:
        return ConnectionProblem(group[0], group[1], group[2], reason,
                                 tuple(len(s) for s in ups.values()), tuple(len(s) for s in downs.values()))

    if not ups or not downs:
        side = "no downstream reports" if ups else "no upstream egresses"
        return [], problem(f"{side} on this link (the other server's reports are missing)")
    spread: dict[tuple[_Side, _Side], float] = {}
    for up_side, egresses in ups.items():
        for down_side, arrivals in downs.items():
            cost = _spread(egresses, arrivals, settings)
            if cost is not None:
                spread[(up_side, down_side)] = cost
    up_sides, down_sides = sorted(ups), sorted(downs)
    best: tuple[float, list[tuple[_Side, _Side]]] | None = None
    runner_up = float("inf")
    # A few connections per server pair (3 pooled routes by default): every assignment.
    fewer, more = (up_sides, down_sides) if len(up_sides) <= len(down_sides) else (down_sides, up_sides)
    if len(more) > 8:
        return [], problem(f"{len(more)} connections: too many to pair exhaustively")
    for chosen in itertools.permutations(more, len(fewer)):
        pairs = [(a, b) if fewer is up_sides else (b, a) for a, b in zip(fewer, chosen, strict=True)]
        if any(p not in spread for p in pairs):
            continue
        total = sum(spread[p] for p in pairs)
        if best is None or total < best[0]:
            if best is not None:
                runner_up = best[0]
            best = (total, pairs)
        elif total < runner_up:
            runner_up = total
    if best is not None:
        cost, pairs = best
        if runner_up != float("inf") and cost >= settings.clear_margin * runner_up:
            return [], problem(f"two pairings fit alike (latency spread {cost:.0f} ns vs {runner_up:.0f} ns)")
        if len(up_sides) == len(down_sides):
            return pairs, None
        return pairs, problem("more connections on one side than on the other (a side's reports all lost?)")
    # No assignment pairs every connection of the smaller side: pair those with exactly one
    # possible partner, report the rest.
    partners_of_up = Counter(u for u, _ in spread)
    partners_of_down = Counter(d for _, d in spread)
    pairs = [(u, d) for (u, d) in spread if partners_of_up[u] == 1 and partners_of_down[d] == 1]
    return pairs, problem("connections without a partner of the same length within the latency window "
                          "(a lost report?)")


def _spread(egresses: list[_Egress], arrivals: list[_Arrival], settings: TruthSettings) -> float | None:
    """Mean absolute deviation of arrival-minus-egress from its median, or None when the two
    sequences cannot be one connection's (lengths differ, an arrival outside the window)."""
    if len(egresses) != len(arrivals):
        return None
    deltas = [a.ts_ns - e.ts_ns for e, a in zip(egresses, arrivals, strict=True)]
    if min(deltas) < -settings.max_early_ns or max(deltas) > settings.max_latency_ns:
        return None
    middle = statistics.median(deltas)
    return sum(abs(d - middle) for d in deltas) / len(deltas)
