"""Which reports of each server were seen: the servers number the events they publish
(`server.seq`), so runs of consecutive numbers say where a report was lost (`sequences`
counts hops in order only across stretches where none was)."""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from collections.abc import Iterable, Sequence

__all__ = ["ReportLedger", "report_runs"]


class _ServerRuns:
    """The seqs seen from one server as runs of consecutive numbers, sorted: parallel lists
    of each run's first and last seq, its earliest and latest report times and when it was
    last extended (`now`, for expiry)."""

    __slots__ = ("firsts", "lasts", "since_ns", "touched", "until_ns")

    def __init__(self) -> None:
        self.firsts: list[int] = []
        self.lasts: list[int] = []
        self.since_ns: list[int] = []
        self.until_ns: list[int] = []
        self.touched: list[float] = []

    def add(self, seq: int, ts_ns: int, now: float) -> None:
        firsts, lasts = self.firsts, self.lasts
        at = bisect_right(firsts, seq) - 1  # the run starting at or before seq
        if at >= 0 and seq <= lasts[at]:
            return  # seen (a redelivery)
        joins_left = at >= 0 and lasts[at] == seq - 1
        joins_right = at + 1 < len(firsts) and firsts[at + 1] == seq + 1
        if joins_left and joins_right:
            lasts[at] = lasts[at + 1]
            self.since_ns[at] = min(self.since_ns[at], self.since_ns[at + 1], ts_ns)
            self.until_ns[at] = max(self.until_ns[at], self.until_ns[at + 1], ts_ns)
            self.touched[at] = now
            for column in (firsts, lasts, self.since_ns, self.until_ns, self.touched):
                del column[at + 1]
            return
        if joins_left or joins_right:
            run = at if joins_left else at + 1
            if joins_left:
                lasts[at] = seq
            else:
                firsts[at + 1] = seq
            self.since_ns[run] = min(self.since_ns[run], ts_ns)
            self.until_ns[run] = max(self.until_ns[run], ts_ns)
            self.touched[run] = now
            return
        for column in (firsts, lasts):
            column.insert(at + 1, seq)
        self.since_ns.insert(at + 1, ts_ns)
        self.until_ns.insert(at + 1, ts_ns)
        self.touched.insert(at + 1, now)

    def join(self, first: int, last: int, now: float) -> None:
        """One run from the run holding `first` to the one holding `last` (both seen): the
        numbers between are vouched for as no report of ours (`ReportLedger.vouch`)."""
        at, end = self.run_of(first), self.run_of(last)
        if at < 0 or end <= at:
            return
        self.lasts[at] = self.lasts[end]
        self.since_ns[at] = min(self.since_ns[at:end + 1])
        self.until_ns[at] = max(self.until_ns[at:end + 1])
        self.touched[at] = now
        for column in (self.firsts, self.lasts, self.since_ns, self.until_ns, self.touched):
            del column[at + 1:end + 1]

    def run_of(self, seq: int) -> int:
        """Index of the run holding `seq`, or -1."""
        at = bisect_right(self.firsts, seq) - 1
        return at if at >= 0 and seq <= self.lasts[at] else -1

    def expire(self, horizon: float) -> None:
        keep = [i for i, touched in enumerate(self.touched) if touched >= horizon]
        if len(keep) != len(self.touched):
            for name in self.__slots__:
                column = getattr(self, name)
                setattr(self, name, [column[i] for i in keep])


# A gap wider than this between two reports of one server is not vouched for (a restarted
# server numbers from 1 again; a wide gap is not worth the doubt).
_VOUCHED_GAP = 100_000
# (stream, server) pairs followed by `vouch`: the servers of a deployment, times its sources.
_VOUCHED_STREAMS = 4096


class ReportLedger:
    """Which reports of each server were observed (`server.seq`), and which report an
    identity is: says whether a stretch of one server's reports is complete."""

    __slots__ = ("_bounded", "_fifo", "_first_vouched", "_fixed", "_reports", "_servers", "_vouched", "_whole",
                 "capacity", "receiving", "retention_s")

    def __init__(self, capacity: int, retention_s: float, bounded: bool = True) -> None:
        self.capacity, self.retention_s, self._bounded = capacity, retention_s, bounded
        self._servers: dict[str, _ServerRuns] = {}
        # identity -> (server id, seq, account): what an Egress's or Arrival's `ident` is.
        self._reports: dict[bytes, tuple[str, int, str]] = {}
        self._fifo: deque[tuple[float, bytes]] = deque()
        self._fixed = False
        # (stream, server id) -> (breaks, seq) of the last report `vouch`ed on that stream.
        self._vouched: dict[tuple[str, str], tuple[int, int]] = {}
        # (stream, server id) -> the seq of its first report on that stream, if it lost nothing before.
        self._first_vouched: dict[tuple[str, str], int] = {}
        # stream -> (breaks, whole since, whole until): what its receiver says of it (`whole`).
        self._whole: dict[str, tuple[int, int | None, int]] = {}
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
            into = self._servers[server_id] = _ServerRuns()
            for first, last, since_ns, until_ns in sorted(server_runs):
                into.firsts.append(first)
                into.lasts.append(last)
                into.since_ns.append(since_ns)
                into.until_ns.append(until_ns)
                into.touched.append(0.0)

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
        self._reports[ident] = (server_id, seq, account)
        if self._fixed:
            return
        runs = self._servers.get(server_id)
        if runs is None:
            runs = self._servers[server_id] = _ServerRuns()
        runs.add(seq, ts_ns, now)
        if self._bounded:
            self._fifo.append((now, ident))
        if self.receiving is not None:
            self.vouch(self.receiving[0], server_id, seq, self.receiving[1], now)

    def vouch(self, stream: str, server_id: str, seq: int, breaks: int, now: float = 0.0) -> None:
        """A report observed (`observe`) that arrived on `stream` after `breaks` possible
        losses of that stream (`Delivery.breaks`), vouching for what a gap in the numbers
        hides. A server publishes its trace messages in the order it numbers them and one
        stream delivers them in that order, so when the last report of this server on this
        stream came with the same `breaks` and a lower number, every trace message of this
        server for this stream between the two arrived: the numbers in between are the
        server's other events (statsz, advisories, other accounts' trace messages), no
        report of ours, and the two runs become one. Only for a stream that receives every
        report of its subscriptions (core mode, one process: the bridge says when)."""
        if seq <= 0 or self._fixed:
            return
        key = (stream, server_id)
        last = self._vouched.get(key)
        if last is None and breaks == 0 and len(self._first_vouched) < _VOUCHED_STREAMS:
            # The first report of this server on a stream that has lost nothing: none of this
            # server's came before it since the stream is whole (`complete`).
            self._first_vouched[key] = seq
        if last is not None and last[0] == breaks:
            if seq <= last[1]:
                return  # out of order (a redelivery): it vouches for nothing
            if seq - last[1] <= _VOUCHED_GAP:
                runs = self._servers.get(server_id)
                if runs is not None:
                    runs.join(last[1], seq, now)
        elif last is None and len(self._vouched) >= _VOUCHED_STREAMS:
            return  # a hostile input's bound: streams times servers
        self._vouched[key] = (breaks, seq)

    def whole(self, stream: str, breaks: int, since_ns: int | None, until_ns: int) -> None:
        """The receiver of `stream` says it got every report of its subscriptions, in each
        server's order, from `since_ns` (None: unknown; only with no loss since: `breaks`
        0) to `until_ns` (report times: the clock skew taken off), but for the `breaks`
        losses it counted before (`vouch`). A run whose last report was vouched for on that
        stream, with no loss since, is then known whole until `until_ns` (`complete`)."""
        if stream in self._whole or len(self._whole) < _VOUCHED_STREAMS:
            self._whole[stream] = (breaks, since_ns, until_ns)

    def _whole_since(self, server_id: str, runs: _ServerRuns, at: int, since_ns: int) -> bool:
        """Whether the run `at` of a server holds its first report on a stream that has lost
        nothing, whole since `since_ns` or earlier: no report of that server came before."""
        for (stream, server), first in self._first_vouched.items():
            whole = self._whole.get(stream)
            if (server == server_id and whole is not None and whole[0] == 0 and whole[1] is not None
                    and whole[1] <= since_ns and runs.run_of(first) == at):
                return True
        return False

    def _whole_until(self, server_id: str, runs: _ServerRuns, at: int) -> int | None:
        """How far the run `at` of a server is known whole on a stream that vouched for its
        last report and lost nothing since."""
        best = None
        for (stream, server), (breaks, seq) in self._vouched.items():
            whole = self._whole.get(stream)
            if (server == server_id and whole is not None and whole[0] == breaks
                    and runs.run_of(seq) == at and (best is None or whole[2] > best)):
                best = whole[2]
        return best

    def observe_number(self, server_id: str, seq: int, ts_ns: int, now: float = 0.0) -> None:
        """A report seen elsewhere (a sibling worker's, whose traces this one never links):
        only its number, for the runs."""
        if seq <= 0 or self._fixed:
            return
        runs = self._servers.get(server_id)
        if runs is None:
            runs = self._servers[server_id] = _ServerRuns()
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
        to then, too."""
        a, b = self._reports.get(first), self._reports.get(last)
        if a is None or b is None or a[0] != b[0]:
            return False
        runs = self._servers.get(a[0])
        if runs is None:
            return False
        at = runs.run_of(min(a[1], b[1]))
        if at < 0 or runs.lasts[at] < max(a[1], b[1]):
            return False
        if since_ns is not None and runs.since_ns[at] > since_ns and not (
                self._whole and self._whole_since(a[0], runs, at, since_ns)):
            return False
        if until_ns is None or runs.until_ns[at] >= until_ns:
            return True
        whole_until = self._whole_until(a[0], runs, at) if self._whole else None
        return whole_until is not None and whole_until >= until_ns


def report_runs(reports: Iterable[tuple[str, int, int]]) -> dict[str, tuple[tuple[int, int, int, int], ...]]:
    """The runs of a whole input's reports, given as (server id, seq, report time): what
    `ReportLedger.use_runs` takes (the backfill works them out over all contexts at once)."""
    ledger = ReportLedger(capacity=0, retention_s=0.0, bounded=False)
    for number, (server_id, seq, ts_ns) in enumerate(reports):
        ledger.observe(number.to_bytes(8, "big"), server_id, seq, ts_ns)
    return ledger.runs()
