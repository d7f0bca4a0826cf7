"""`ReportLedger.vouch`: a receiver that lost nothing vouches for the gaps in a server's
numbers (its other events), and only then."""

from __future__ import annotations

import os
import random

from nats_otel.core.report_ledger import ReportLedger


def _ledger(*seqs: int) -> ReportLedger:
    ledger = ReportLedger(capacity=1000, retention_s=30.0)
    for seq in seqs:
        ledger.observe(b"r%d" % seq, "S1", seq, seq * 1000, 0.0)
    return ledger


def test_reports_on_one_stream_with_no_loss_between_make_one_run():
    ledger = _ledger(10, 13, 20)
    assert not ledger.complete(b"r10", b"r20")  # gaps: 11-12, 14-19
    for seq in (10, 13, 20):
        ledger.vouch("a", "S1", seq, breaks=0)
    assert ledger.complete(b"r10", b"r20")


def test_a_loss_between_two_reports_leaves_the_gap():
    ledger = _ledger(10, 13, 20)
    ledger.vouch("a", "S1", 10, breaks=0)
    ledger.vouch("a", "S1", 13, breaks=1)  # the stream lost something before 13 arrived
    ledger.vouch("a", "S1", 20, breaks=1)
    assert not ledger.complete(b"r10", b"r13")
    assert ledger.complete(b"r13", b"r20")


def test_every_member_stream_must_vouch_and_out_of_order_vouches_nothing():
    ledger = _ledger(10, 13, 20)
    ledger.observe(b"t5", "S2", 5, 0, 0.0)
    ledger.observe(b"t9", "S2", 9, 0, 0.0)
    ledger.vouch("a", "S1", 10, breaks=0)
    ledger.vouch("b", "S1", 13, breaks=0)  # another stream: says nothing of what "a" received
    ledger.vouch("a", "S2", 5, breaks=0)
    ledger.vouch("a", "S2", 9, breaks=0)
    # "a" vouches for S1 only up to 10; "b" never said how long it has been whole, so S2's
    # reports routed to it in 6-8 may be on their way.
    assert not ledger.complete(b"r10", b"r13") and not ledger.complete(b"t5", b"t9")
    ledger.whole("b", 0, 0, 10**12)  # whole since its start, until long after
    assert ledger.complete(b"t5", b"t9")
    ledger.vouch("a", "S1", 20, breaks=0)
    ledger.vouch("a", "S1", 13, breaks=0)  # came after 20: a redelivery, vouches for nothing
    assert ledger.complete(b"r10", b"r20")


def test_reports_spread_over_a_queue_group_are_whole_when_every_member_vouches():
    """The sidecar layout: each bridge receives a share of every server's reports; the gap
    between two reports received by one member holds reports of the others. A member that
    lost something, or that never says whether it did, leaves the gaps unvouched."""
    ledger = _ledger(10, 12, 15, 16, 19)
    for stream, seqs in (("a", (10, 15, 19)), ("b", (12, 16))):
        ledger.whole(stream, 0, 0, 0, now=2.0, local=False)
        for seq in seqs:
            ledger.vouch(stream, "S1", seq, breaks=0)
    assert not ledger.complete(b"r10", b"r19")  # "b" vouches only up to 16, and is whole until 0
    ledger.whole("b", 0, 0, 19_000, now=2.0, local=False)  # whole until 19's report time
    assert ledger.complete(b"r10", b"r19")
    ledger.whole("c", None, None, None, now=0.5, local=False)  # a peer that cannot vouch (worker processes)
    assert not ledger.complete(b"r10", b"r19")
    ledger.whole("c", 1, None, 10**12, now=0.5, local=False)  # it lost something and never got S1's reports
    assert not ledger.complete(b"r10", b"r19")
    # It left (fell silent) before 10 was reported: what came after was never routed to it.
    assert ledger.depart_silent(silent_before=1.0, gone_after_ns=9_000) == ["c"]  # "a", "b" heard since
    assert ledger.complete(b"r10", b"r19")
    ledger.forget_departed(gone_before_ns=10_000)
    assert ledger.complete(b"r10", b"r19")


def test_a_peer_first_heard_of_mid_way_vouches_only_for_what_came_after():
    ledger = _ledger(10, 20, 30)
    ledger.whole("a", 0, 0, 10**12)
    for seq in (10, 20, 30):
        ledger.vouch("a", "S1", seq, breaks=0)
    ledger.whole("b", 0, 0, 10**12, local=False, trusted_from_ns=15_000)  # its evidence before 15 us never came
    assert not ledger.complete(b"r10", b"r20")  # reports of S1 routed to it in 11-19 may be unknown here
    assert ledger.complete(b"r20", b"r30")
    assert not ledger.complete(b"r20", b"r30", since_ns=0) and ledger.complete(b"r20", b"r30", since_ns=15_000)


def test_a_member_whole_since_before_a_report_vouches_that_none_came_before_it():
    ledger = _ledger(10, 20)
    ledger.whole("a", 0, 5_000, 10**12)
    ledger.vouch("a", "S1", 10, breaks=0)
    ledger.vouch("a", "S1", 20, breaks=0)
    assert ledger.complete(b"r10", b"r20", since_ns=5_000)  # none of S1's before 10, since 5 us
    assert not ledger.complete(b"r10", b"r20", since_ns=4_000)  # before it subscribed: unknown
    assert ledger.complete(b"r10", b"r20", until_ns=10**12)
    ledger.whole("a", 1, None, 2 * 10**12)  # a loss after 20: whole until no later than before
    assert not ledger.complete(b"r10", b"r20", until_ns=10**12 + 1)


def test_a_stream_that_starts_anew_after_a_break_is_whole_from_then():
    """A bridge whose trace ownership changed (`CoreSource.note_reroute`) counts a break and
    says it is whole again from the change (`since_ns` with breaks above 0): the gaps after
    that are vouched for as if it had lost nothing, never those before it."""
    ledger = _ledger(10, 20, 30, 40)
    for seq in (10, 20):
        ledger.vouch("a", "S1", seq, breaks=0)
    for seq in (30, 40):
        ledger.vouch("a", "S1", seq, breaks=1)  # the change came between 20 and 30
    ledger.whole("a", 1, None, 10**12)  # a break and no new start: only its own runs vouch
    assert not ledger.complete(b"r20", b"r30") and not ledger.complete(b"r30", b"r40", since_ns=25_000)
    assert ledger.complete(b"r30", b"r40")  # 30 and 40 came on the stream with nothing lost between
    ledger.whole("a", 1, 25_000, 10**12)  # whole again from 25 us (report time): after 20, before 30
    assert ledger.complete(b"r30", b"r40", since_ns=25_000)  # none of S1's came in 25-30 us unseen
    assert not ledger.complete(b"r30", b"r40", since_ns=24_000)  # before it started anew: unknown
    assert not ledger.complete(b"r20", b"r30")  # across the break: never
    # A peer that never received a report of S2 and started anew before it: S2's gap is vouched.
    ledger.observe(b"t5", "S2", 5, 30_000, 0.0)
    ledger.observe(b"t9", "S2", 9, 31_000, 0.0)
    ledger.vouch("a", "S2", 5, breaks=1)
    ledger.vouch("a", "S2", 9, breaks=1)
    ledger.whole("b", 2, 26_000, 10**12, local=False)
    assert ledger.complete(b"t5", b"t9")
    ledger.whole("b", 2, 30_500, 10**12, local=False)  # anew between 5 and 9: 6-8 unvouched by it
    assert not ledger.complete(b"t5", b"t9")


def test_a_server_numbering_anew_is_not_vouched_for():
    ledger = _ledger(5, 300_000)
    ledger.vouch("a", "S1", 5, breaks=0)
    ledger.vouch("a", "S1", 300_000, breaks=0)  # wider than any burst of other events
    assert not ledger.complete(b"r5", b"r300000")


def _simulate(seed: int) -> tuple[int, int]:
    """One server's numbers spread over a queue group's member streams, some lost on the way
    (each loss counted by its stream, as a bridge counts a drop or a lost connection); the
    streams observed in any interleaving, each in order, saying now and then how long they
    have been whole. Every stretch the ledger calls complete holds no lost report. Returns
    (stretches checked, stretches complete)."""
    rnd = random.Random(seed)
    members = [f"m{i}" for i in range(rnd.randint(1, 4))]
    ledger = ReportLedger(capacity=100_000, retention_s=1e9)
    breaks = dict.fromkeys(members, 0)
    queues: dict[str, list[tuple[int, int]]] = {m: [] for m in members}
    drained_until = dict.fromkeys(members, 0)  # the last number published that each has observed
    lost: set[int] = set()
    seen: list[int] = []
    loss = rnd.choice([0.0, 0.01, 0.1])
    checked = complete = 0
    for member in members:  # each heard of from its start (a bridge's first heartbeat)
        ledger.whole(member, 0, 0, 0)
    for number in range(1, rnd.randint(50, 400)):
        if rnd.random() < 0.6:  # a report of ours; else the server's other events
            member = rnd.choice(members)
            if rnd.random() < loss:
                lost.add(number)
                breaks[member] += 1
            else:
                queues[member].append((number, breaks[member]))
        for member in members:
            if not queues[member]:
                drained_until[member] = number  # nothing of it on its way
        if rnd.random() < 0.3:
            member = rnd.choice(members)
            taken, queues[member] = queues[member][:rnd.randint(1, 10)], queues[member]
            del queues[member][:len(taken)]
            for seq, count in taken:
                ledger.receiving = (member, count)
                ledger.observe(b"%d" % seq, "S", seq, seq * 1000)
                ledger.receiving = None
                seen.append(seq)
                drained_until[member] = seq
            ledger.whole(member, breaks[member], 0 if breaks[member] == 0 else None, drained_until[member] * 1000)
        for _ in range(3):
            if len(seen) > 1:
                a, b = sorted(rnd.sample(seen, 2))
                checked += 1
                if ledger.complete(b"%d" % a, b"%d" % b):
                    complete += 1
                    assert not any(a < n < b for n in lost), (seed, a, b, sorted(lost))
                if ledger.complete(b"%d" % a, b"%d" % b, since_ns=0):
                    assert not any(n < a for n in lost), (seed, a, sorted(lost))
    return checked, complete


def test_no_loss_pattern_over_a_queue_groups_streams_makes_a_stretch_complete_wrongly():
    """Random queue groups (1-4 member streams), loss rates and interleavings: the ledger
    never calls a stretch with a lost report complete, and still proves most stretches
    where nothing was lost."""
    checked = complete = 0
    for seed in range(int(os.environ.get("LEDGER_PATTERNS", "2000"))):
        c, k = _simulate(seed)
        checked, complete = checked + c, complete + k
    assert checked > 10_000 and complete > 0.3 * checked, (checked, complete)


def test_runs_are_what_the_numbers_seen_say_whatever_their_order():
    """`_ServerRuns.add`'s in-order path (a report past the last run) and its general case
    keep the same runs: each a maximal stretch of consecutive numbers seen, its earliest
    and latest report times and when it was last extended."""
    for seed in range(300):
        rng = random.Random(seed)
        seqs = sorted(rng.sample(range(1, 400), rng.randrange(1, 120)))
        # Mostly in order, some swapped and some repeated: a live bridge's and a redelivery's.
        for _ in range(rng.randrange(0, 12)):
            i, j = rng.randrange(len(seqs)), rng.randrange(len(seqs))
            seqs[i], seqs[j] = seqs[j], seqs[i]
        seqs += rng.sample(seqs, min(len(seqs), rng.randrange(0, 5)))
        ledger = ReportLedger(capacity=1000, retention_s=30.0)
        ts_of = {seq: rng.randrange(10**9) for seq in seqs}
        touched: dict[int, float] = {}
        for at, seq in enumerate(seqs):
            ledger.observe(b"r%d" % seq, "S1", seq, ts_of[seq], float(at))
            touched.setdefault(seq, float(at))
        expected: list[list[int]] = []
        run: list[int] = []
        for seq in sorted(set(seqs)):
            if seq - 1 not in ts_of:
                run = [seq]
                expected.append(run)
            else:
                run.append(seq)
        want = tuple((r[0], r[-1], min(ts_of[s] for s in r), max(ts_of[s] for s in r)) for r in expected)
        assert ledger.runs() == {"S1": want}, seed
        kept = ledger._servers["S1"]
        assert kept.touched == [max(touched[s] for s in r) for r in expected], seed


def test_expiry_drops_exactly_the_runs_last_touched_before_the_horizon():
    """`_ServerRuns.expire` finds the runs to drop by its heap of due times, not by reading
    every run (issue 39: ~10^5 runs with gaps every few reports): after any mix of reports
    (in order, late, repeated, with `now` not always rising) and expiries, the runs left are
    the runs before it, less exactly those last touched before the horizon."""
    from nats_otel.core.report_ledger import _ServerRuns

    columns = ("firsts", "lasts", "since_ns", "until_ns", "touched")
    dropped_middle = 0
    for seed in range(400):
        rng = random.Random(seed)
        runs = _ServerRuns(expiring=True)
        now, top = 0.0, 0
        for _ in range(rng.randrange(20, 400)):
            step = rng.random()
            if step < 0.6:  # a report past the last, with gaps now and then
                top += 1 + (rng.randrange(1, 4) if rng.random() < 0.3 else 0)
                runs.add(top, rng.randrange(10**9), now)
            elif step < 0.8 and top:  # a late one, or a repeat
                runs.add(rng.randrange(1, top + 1), rng.randrange(10**9), now)
            elif step < 0.95:
                now += rng.choice((0.0, 0.1, 1.0, 3.0)) if rng.random() < 0.9 else -0.5
            else:
                horizon = now - rng.choice((0.0, 1.0, 2.5, 5.0))
                before = [list(getattr(runs, c)) for c in columns]
                keep = [i for i, t in enumerate(before[4]) if t >= horizon]
                dropped_middle += bool(keep) and keep[0] != len(before[4]) - len(keep)
                runs.expire(horizon)
                assert [getattr(runs, c) for c in columns] == [[col[i] for i in keep] for col in before], seed
    assert dropped_middle > 0  # runs dropped from the middle too, not only the oldest first


def test_expiry_takes_only_the_due_entries():
    """With many runs held, an expiry pops the entries due and reads the runs they name, not
    every run (what it did; `bench/ledger_expiry.py` measures both): each of 200k runs has
    one entry, and each expiry takes one."""
    from nats_otel.core.report_ledger import _ServerRuns

    runs = _ServerRuns(expiring=True)
    for seq in range(1, 400_000, 2):  # a gap after every report: 200k runs
        runs.add(seq, seq, float(seq))
    assert len(runs.firsts) == len(runs.due) == 200_000
    for horizon in range(3, 2003, 2):  # 1,000 expiries, one run due at each
        runs.expire(float(horizon))
        assert runs.firsts[0] == horizon and len(runs.due) == len(runs.firsts)
    assert len(runs.firsts) == 200_000 - 1_000


def test_only_a_bounded_ledger_keeps_its_runs_due():
    """A whole input's ledger (and one whose runs were taken as given) never expires them: it
    keeps no heap of due times, one entry per run for nothing (the backfill takes every
    server's runs for each batch it converts)."""
    whole = ReportLedger(capacity=0, retention_s=0.0, bounded=False)
    live = ReportLedger(capacity=1000, retention_s=30.0)
    for seq in (1, 2, 4, 7, 8):
        whole.observe(b"r%d" % seq, "S1", seq, seq, 1.0)
        live.observe(b"r%d" % seq, "S1", seq, seq, 1.0)
    assert whole.runs() == live.runs()
    assert whole._servers["S1"].due is None and live._servers["S1"].due == [(1.0, 1), (1.0, 4), (1.0, 7)]
    whole.use_runs(live.runs())
    assert whole._servers["S1"].due is None
