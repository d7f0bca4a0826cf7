"""Which reports of each server were seen: the servers number the events they publish
(`server.seq`), so runs of consecutive numbers say where a report was lost (`sequences`
counts hops in order only across stretches where none was)."""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from collections.abc import Iterable, Sequence
from heapq import heappop, heappush

__all__ = ["ReportLedger", "report_runs"]


class _ServerRuns:
    """The seqs seen from one server as runs of consecutive numbers, sorted: parallel lists
    of each run's first and last seq, its earliest and latest report times and when it was
    last extended (`now`, for expiry).

    `due` finds the runs to expire without reading them all (with gaps every few reports a
    live bridge holds ~10^5 runs, and expiry ran at every batch): a heap of (when a run was
    touched, a seq in it then), pushed whenever a run's `touched` takes a new value. Runs
    only grow or merge, so the seq stays in the run that holds it, and every run has an
    entry with its current `touched`; an entry whose run was touched since (or is gone) is
    passed over when it comes due. Only a bounded ledger expires its runs (its `_fifo`):
    the others' runs (a whole input, runs taken as given) keep no heap (`due` None)."""

    __slots__ = ("due", "firsts", "lasts", "since_ns", "touched", "until_ns")

    def __init__(self, expiring: bool) -> None:
        self.firsts: list[int] = []
        self.lasts: list[int] = []
        self.since_ns: list[int] = []
        self.until_ns: list[int] = []
        self.touched: list[float] = []
        self.due: list[tuple[float, int]] | None = [] if expiring else None

    def _touch(self, run: int, seq: int, now: float) -> None:
        if self.touched[run] != now:
            self.touched[run] = now
            if self.due is not None:
                heappush(self.due, (now, seq))

    def append(self, first: int, last: int, since_ns: int, until_ns: int, touched: float) -> None:
        """A run after every run held."""
        self.firsts.append(first)
        self.lasts.append(last)
        self.since_ns.append(since_ns)
        self.until_ns.append(until_ns)
        self.touched.append(touched)
        if self.due is not None:
            heappush(self.due, (touched, first))

    def add(self, seq: int, ts_ns: int, now: float) -> None:
        firsts, lasts = self.firsts, self.lasts
        # A server's reports mostly come in its order: past the last run, `seq` extends it
        # or starts a new one (what the general case below decides there, without its
        # bisect and branches: this runs for every report, issue 39).
        if not lasts or seq > lasts[-1]:
            if lasts and seq == lasts[-1] + 1:
                lasts[-1] = seq
                if ts_ns < self.since_ns[-1]:
                    self.since_ns[-1] = ts_ns
                if ts_ns > self.until_ns[-1]:
                    self.until_ns[-1] = ts_ns
                if self.touched[-1] != now:  # `_touch`, without a call: this runs per report
                    self.touched[-1] = now
                    if self.due is not None:
                        heappush(self.due, (now, seq))
            else:
                self.append(seq, seq, ts_ns, ts_ns, now)
            return
        at = bisect_right(firsts, seq) - 1  # the run starting at or before seq
        if at >= 0 and seq <= lasts[at]:
            return  # seen (a redelivery)
        joins_left = at >= 0 and lasts[at] == seq - 1
        joins_right = at + 1 < len(firsts) and firsts[at + 1] == seq + 1
        if joins_left and joins_right:
            lasts[at] = lasts[at + 1]
            self.since_ns[at] = min(self.since_ns[at], self.since_ns[at + 1], ts_ns)
            self.until_ns[at] = max(self.until_ns[at], self.until_ns[at + 1], ts_ns)
            for column in (firsts, lasts, self.since_ns, self.until_ns, self.touched):
                del column[at + 1]
            self._touch(at, seq, now)
            return
        if joins_left or joins_right:
            run = at if joins_left else at + 1
            if joins_left:
                lasts[at] = seq
            else:
                firsts[at + 1] = seq
            self.since_ns[run] = min(self.since_ns[run], ts_ns)
            self.until_ns[run] = max(self.until_ns[run], ts_ns)
            self._touch(run, seq, now)
            return
        for column in (firsts, lasts):
            column.insert(at + 1, seq)
        self.since_ns.insert(at + 1, ts_ns)
        self.until_ns.insert(at + 1, ts_ns)
        self.touched.insert(at + 1, now)
        if self.due is not None:
            heappush(self.due, (now, seq))

    def run_of(self, seq: int) -> int:
        """Index of the run holding `seq`, or -1."""
        at = bisect_right(self.firsts, seq) - 1
        return at if at >= 0 and seq <= self.lasts[at] else -1

    def expire(self, horizon: float) -> None:
        """Drop the runs last touched before `horizon` (a bounded ledger's: the others' never are)."""
        due, touched = self.due, self.touched
        gone = set()
        while due and due[0][0] < horizon:
            at = self.run_of(heappop(due)[1])
            if at >= 0 and touched[at] < horizon:
                gone.add(at)
        if not gone:
            return
        columns = ("firsts", "lasts", "since_ns", "until_ns", "touched")
        if max(gone) == len(gone) - 1:  # the usual case: the oldest runs, the first ones
            for name in columns:
                del getattr(self, name)[:len(gone)]
        else:
            keep = [i for i in range(len(touched)) if i not in gone]
            for name in columns:
                column = getattr(self, name)
                setattr(self, name, [column[i] for i in keep])


# A gap wider than this between two reports of one server on one stream is not vouched for
# (a restarted server numbers from 1 again; a wide gap is not worth the doubt).
_VOUCHED_GAP = 100_000
# Streams (members) and (stream, server) coverages followed: the servers of a deployment,
# times its bridges' sources; a hostile input's bound.
_VOUCHED_STREAMS = 4096


class _Member:
    """A stream that receives reports of the subscriptions the deployment shares (a source of
    this bridge, or a peer bridge's through the link exchange), and what it says of itself
    (`ReportLedger.whole`): its losses so far, whole since (None: unknown) and until when."""

    __slots__ = ("breaks", "gone_after_ns", "heard", "local", "since_ns", "trusted_from_ns", "until_ns")

    def __init__(self, local: bool) -> None:
        self.local = local
        self.breaks: int | None = None  # None: it never said (a peer that does not vouch)
        self.since_ns: int | None = None
        self.until_ns: int | None = None
        self.heard = 0.0
        # Report time after which it received nothing (it left: `depart`); None while present.
        self.gone_after_ns: int | None = None
        # Report time before which what it received may not have reached this ledger (a peer
        # first heard of mid-way: its earlier evidence went out before this bridge listened).
        self.trusted_from_ns: int | None = None


class ReportLedger:
    """Which reports of each server were observed (`server.seq`), and which report an
    identity is: says whether a stretch of one server's reports is complete.

    A gap in a server's numbers is either its other events (statsz, advisories, other
    accounts' trace messages) or a report lost on the way. The runs of numbers seen prove a
    stretch complete by themselves; beyond them, the streams that receive the reports vouch
    (`vouch`, `whole`): a stream delivers each server's reports in the order the server
    numbered them, so a stream that lost nothing between two reports of a server received
    every report of that server between them that was routed to it. When *every* member
    stream - this bridge's sources, and with the link exchange its peers' - vouches for a gap,
    no report in it was routed anywhere unseen: it holds none of ours (`_accounted`). Members
    are the streams heard of: a queue-group member that never published its evidence is
    unknown here (docs/span-model.md says what that assumes)."""

    __slots__ = ("_bounded", "_covers", "_fifo", "_fixed", "_members", "_reports", "_servers",
                 "capacity", "receiving", "retention_s")

    def __init__(self, capacity: int, retention_s: float, bounded: bool = True) -> None:
        self.capacity, self.retention_s, self._bounded = capacity, retention_s, bounded
        self._servers: dict[str, _ServerRuns] = {}
        # identity -> (server id, seq, account, report time): what an Egress's or Arrival's `ident` is.
        self._reports: dict[bytes, tuple[str, int, str, int]] = {}
        self._fifo: deque[tuple[float, bytes]] = deque()
        self._fixed = False
        self._members: dict[str, _Member] = {}
        # (stream, server id) -> [breaks, lo, hi]: of that server's reports routed to that
        # stream, every one numbered lo..hi arrived (lo 0: every one since the stream's start),
        # with `breaks` losses of the stream before them (`vouch`).
        self._covers: dict[tuple[str, str], list[int]] = {}
        # (stream, breaks) of the reports being observed, when their receiver vouches for them
        # (`vouch`): set around a batch that arrived on one stream with no loss inside it.
        self.receiving: tuple[str, int] | None = None

    def use_runs(self, runs: dict[str, Sequence[tuple[int, int, int, int]]]) -> None:
        """Take every server's runs as given (`report_runs` of a whole input), for a part of
        that input (the backfill converts one trace context at a time): then only the
        identities of the reports observed here are recorded."""
        self._fixed = True
        self._servers = {}
        for server_id, server_runs in runs.items():
            into = self._servers[server_id] = _ServerRuns(self._bounded)
            for first, last, since_ns, until_ns in sorted(server_runs):
                into.append(first, last, since_ns, until_ns, 0.0)

    def runs(self) -> dict[str, tuple[tuple[int, int, int, int], ...]]:
        """Every server's runs: (first seq, last seq, earliest and latest report times)."""
        return {server_id: tuple(zip(runs.firsts, runs.lasts, runs.since_ns, runs.until_ns, strict=True))
                for server_id, runs in sorted(self._servers.items())}

    def __len__(self) -> int:
        return len(self._reports)

    def observe(self, ident: bytes, server_id: str, seq: int, ts_ns: int, now: float = 0.0,
                account: str = "") -> None:
        """One report seen (any report: with hop evidence or not). seq 0: not numbered, ignored.
        `account`: the account it came in on (pooled routes carry one account per connection)."""
        if seq <= 0 or ident in self._reports:
            return
        self._reports[ident] = (server_id, seq, account, ts_ns)
        if self._fixed:
            return
        runs = self._servers.get(server_id)
        if runs is None:
            runs = self._servers[server_id] = _ServerRuns(self._bounded)
        runs.add(seq, ts_ns, now)
        if self._bounded:
            self._fifo.append((now, ident))
        if self.receiving is not None:
            self.vouch(self.receiving[0], server_id, seq, self.receiving[1], now)

    def _member(self, stream: str, local: bool = True) -> _Member | None:
        member = self._members.get(stream)
        if member is None and len(self._members) < _VOUCHED_STREAMS:
            member = self._members[stream] = _Member(local)
        return member

    def vouch(self, stream: str, server_id: str, seq: int, breaks: int, now: float = 0.0) -> None:
        """A report observed (`observe`) that arrived on `stream` after `breaks` possible
        losses of that stream (`Delivery.breaks`). A server publishes its reports in the order
        it numbers them and one stream delivers them in that order: when the last report of
        this server on this stream came with the same `breaks` and a lower number, every
        report of this server routed to this stream between the two arrived; when it is the
        first with no loss at all, every one before it did (none came). Out of order (a
        redelivery) it vouches for nothing; a new count of losses starts anew from it."""
        if seq <= 0 or self._fixed:
            return
        # Runs for every report a bridge receives: the known member without a call (issue 39).
        member = self._members.get(stream)
        if member is None:
            member = self._member(stream)
            if member is None:
                return  # a hostile input's bound: it vouches for nothing
        if now > member.heard:
            member.heard = now
        key = (stream, server_id)
        cover = self._covers.get(key)
        if cover is None:
            if len(self._covers) < _VOUCHED_STREAMS:
                self._covers[key] = [breaks, 0 if breaks == 0 else seq, seq]
            return
        if breaks != cover[0]:
            if breaks > cover[0]:  # lost something since: what came before proves nothing after
                cover[:] = [breaks, seq, seq]
            return
        if seq > cover[2]:
            if seq - cover[2] > _VOUCHED_GAP:
                cover[1] = seq
            cover[2] = seq

    def whole(self, stream: str, breaks: int | None, since_ns: int | None, until_ns: int | None,
              now: float = 0.0, local: bool = True, trusted_from_ns: int | None = None) -> None:
        """The receiver of `stream` says it got every report routed to it, in each server's
        order, from `since_ns` (None: unknown; given only while it lost nothing since: with
        `breaks` above 0 it started anew then, `CoreSource.note_reroute`) to
        `until_ns` (report times: the clock skew taken off), but for the `breaks` losses it
        counted (`vouch`). `breaks` None: a member that does not say (a peer that cannot
        vouch): while it is one, no gap is vouched for. `local`: a source of this bridge
        (a peer's stream is `depart`ed when it falls silent). `trusted_from_ns`: what it
        received before then may never have been told here (kept once given)."""
        member = self._member(stream, local)
        if member is None:
            return
        member.breaks, member.since_ns, member.until_ns = breaks, since_ns, until_ns
        if trusted_from_ns is not None and (member.trusted_from_ns is None or trusted_from_ns > member.trusted_from_ns):
            member.trusted_from_ns = trusted_from_ns
        member.heard = max(member.heard, now)
        member.gone_after_ns = None

    def depart_silent(self, silent_before: float, gone_after_ns: int) -> list[str]:
        """Peers last heard before `silent_before` left (their bridge stopped or died: its
        subscription went with its connection): nothing reported after `gone_after_ns` was
        routed to them. Their coverage stays for what came before. Returns who left now."""
        gone = [name for name, member in self._members.items()
                if not member.local and member.gone_after_ns is None and member.heard < silent_before]
        for name in gone:
            self._members[name].gone_after_ns = gone_after_ns
        return gone

    def forget_departed(self, gone_before_ns: int) -> None:
        """Drop the peers that left before `gone_before_ns` (older than any report held)."""
        for name in [n for n, m in self._members.items()
                     if m.gone_after_ns is not None and m.gone_after_ns < gone_before_ns]:
            del self._members[name]
            for key in [k for k in self._covers if k[0] == name]:
                del self._covers[key]

    def _covers_range(self, name: str, member: _Member, server_id: str, first: int, first_ts_ns: int, last: int,
                      last_ts_ns: int) -> bool:
        """Whether every report of `server_id` numbered `first`..`last` (reported at
        `first_ts_ns`, `last_ts_ns`) routed to the member arrived: its coverage holds them,
        or holds `first` on and it has been whole, with no loss since, until past `last`'s
        time; or it had left before `first`. Never before it is trusted from."""
        if member.trusted_from_ns is not None and first_ts_ns < member.trusted_from_ns:
            return False
        cover = self._covers.get((name, server_id))
        whole_until = member.until_ns if member.breaks is not None else None
        # Whole since a time (`whole`'s `since_ns`: given only while it lost nothing since) that
        # is before `first`: every report routed to it from then on arrived, as if it had lost
        # nothing at all (a bridge whose trace ownership changed starts anew so: `routing`).
        whole_before = member.since_ns is not None and member.since_ns <= first_ts_ns
        if cover is None:
            covered = (member.breaks == 0 or whole_before) and whole_until is not None and whole_until >= last_ts_ns
        else:
            covered = (cover[1] <= first or (whole_before and member.breaks == cover[0])) and (cover[2] >= last or (
                member.breaks == cover[0] and whole_until is not None and whole_until >= last_ts_ns))
        return covered or (member.gone_after_ns is not None and last_ts_ns > member.gone_after_ns)

    def _accounted(self, server_id: str, first: int, first_ts_ns: int, last: int, last_ts_ns: int) -> bool:
        """Every member vouches for `first`..`last` of a server: no report of ours among the
        numbers between not seen here."""
        members = self._members
        return bool(members) and all(self._covers_range(name, member, server_id, first, first_ts_ns, last, last_ts_ns)
                                     for name, member in members.items())

    def _whole_since(self, server_id: str, seq: int, ts_ns: int, since_ns: int) -> bool:
        """No report of a server before `seq` (reported at `ts_ns`) from `since_ns` on was
        lost: every member vouches for all its numbers up to `seq`, and one of them received
        since then with no loss (so each report then was routed to a member)."""
        return any(m.gone_after_ns is None and m.since_ns is not None and m.since_ns <= since_ns
                   for m in self._members.values()) and self._accounted(server_id, 0, since_ns, seq, ts_ns)

    def _whole_until(self, server_id: str, seq: int, ts_ns: int, until_ns: int) -> bool:
        """No report of a server after `seq` (reported at `ts_ns`) up to `until_ns` (report
        time) was lost."""
        return self._accounted(server_id, seq, ts_ns, 1 << 62, until_ns)

    def observe_number(self, server_id: str, seq: int, ts_ns: int, now: float = 0.0) -> None:
        """A report seen elsewhere (a sibling worker's, whose traces this one never links):
        only its number, for the runs."""
        if seq <= 0 or self._fixed:
            return
        runs = self._servers.get(server_id)
        if runs is None:
            runs = self._servers[server_id] = _ServerRuns(self._bounded)
        runs.add(seq, ts_ns, now)
        if self._bounded:
            self._fifo.append((now, b""))  # no identity: expires the runs like any other

    def expire(self, now: float) -> None:
        horizon = now - self.retention_s
        fifo, reports = self._fifo, self._reports
        expired = False
        while fifo and (fifo[0][0] < horizon or len(fifo) > self.capacity):
            reports.pop(fifo.popleft()[1], None)
            expired = True
        if expired:
            for server_id in list(self._servers):
                runs = self._servers[server_id]
                runs.expire(horizon)
                if not runs.firsts:
                    del self._servers[server_id]

    def account(self, ident: bytes) -> str | None:
        """The account a report came in on, if it was observed."""
        found = self._reports.get(ident)
        return None if found is None else found[2]

    def number(self, ident: bytes) -> int | None:
        """The report's `server.seq`, if it was observed."""
        found = self._reports.get(ident)
        return None if found is None else found[1]

    def complete(self, first: bytes, last: bytes, since_ns: int | None = None, until_ns: int | None = None
                 ) -> bool:
        """True when `first` and `last` are reports of one server with every report between
        them seen, and (with `since_ns`, `until_ns`) every report of that server from then,
        to then, too: by the runs of numbers seen, or where the members vouch (`_accounted`)."""
        a, b = self._reports.get(first), self._reports.get(last)
        if a is None or b is None or a[0] != b[0]:
            return False
        runs = self._servers.get(a[0])
        if runs is None:
            return False
        if a[1] > b[1]:
            a, b = b, a
        at = runs.run_of(a[1])
        if at < 0:
            return False
        if runs.lasts[at] < b[1] and not self._accounted(a[0], a[1], a[3], b[1], b[3]):
            return False
        if since_ns is not None and runs.since_ns[at] > since_ns and not self._whole_since(a[0], a[1], a[3], since_ns):
            return False
        if until_ns is None:
            return True
        end = runs.run_of(b[1])
        return (end >= 0 and runs.until_ns[end] >= until_ns) or self._whole_until(a[0], b[1], b[3], until_ns)


def report_runs(reports: Iterable[tuple[str, int, int]]) -> dict[str, tuple[tuple[int, int, int, int], ...]]:
    """The runs of a whole input's reports, given as (server id, seq, report time): what
    `ReportLedger.use_runs` takes (the backfill works them out over all contexts at once)."""
    ledger = ReportLedger(capacity=0, retention_s=0.0, bounded=False)
    for number, (server_id, seq, ts_ns) in enumerate(reports):
        ledger.observe(number.to_bytes(8, "big"), server_id, seq, ts_ns)
    return ledger.runs()
