"""The link-evidence exchange: bridges that share a cluster's traces share their hop evidence.

In the sidecar layout (a bridge per server, one queue group) or with several JetStream
bridges on one durable, each bridge receives a random share of the trace messages, so the
upstream report of a hop is usually at another bridge. Each bridge publishes the evidence of
every report it observes (`core.evidence`: identity, event number, arrival, forwarding
egresses; ~260 bytes a report), batched one message per intake batch, on one subject that
every bridge subscribes to without a queue group; it records what the others publish into
its own link window before deciding, `link.wait` later. Queue groups and durables stay as
they are and there is no membership: a bridge that joins starts publishing, one that leaves
stops, and only the hops whose evidence it alone held (its batches in flight) lose a link.

In JetStream mode (at least once) the evidence is also kept (`keep`): a stream
(`NATS_OTEL_LINKS_<durable>`) holds the subject's batches for `link.retention`, and a
bridge that starts - after a SIGKILL, in a rolling restart - replays them before it fetches,
so a downstream report redelivered to it finds the evidence of an upstream report that the
killed bridge had already settled, as an unkilled bridge would.

With worker processes (`batch.workers`) each worker observes its shard of the traces: it
encodes its evidence batch and the parent publishes it (`publish_soon`); a received batch is
checked here once, then each report goes to the worker whose link window holds its trace
(`WorkerPool.record_evidence`).

A core-mode bridge in one process also says what its streams know of their completeness
(`bridge.wholeness`): each report carries the stream it arrived on and that stream's losses
before it, each batch the streams' losses, whole since and whole until, and an idle bridge
sends that every second alone (a heartbeat). Every bridge's ledger then holds its peers'
streams as members that vouch for what was routed to them (`ReportLedger`), so that alike
messages count by order in the sidecar layout as with one bridge. Batches are numbered per
sender (`BATCH_HEADER`): one that never arrived counts as a loss of the sender's streams.

Received batches are checked (`evidence.decode_batch`): a malformed, oversized, badly signed
(with `link.exchange_key_file`) or foreign-format one is dropped whole, counted by reason in
`nats_otel_link_evidence{result}` and logged (rate-limited); it never stops the bridge.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import socket
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from nats_otel.bridge.kept_evidence import ensure_stream, replay_stream
from nats_otel.bridge.routing import BYE_HEADER, VIEW_HEADER
from nats_otel.bridge.sources.direct import subscribe_plain
from nats_otel.bridge.sources.read_pacing import tick_at_or_after
from nats_otel.core.evidence import (
    EvidenceError,
    HopEvidence,
    LinkLatencyEstimate,
    PeerBatch,
    Streams,
    StreamState,
    decode_peer_batch,
    encode_batch,
    sign,
)

if TYPE_CHECKING:
    from nats_otel.bridge.routing import Router
    from nats_otel.bridge.settings import BridgeSettings

__all__ = ["BATCH_HEADER", "SENDER_HEADER", "SIGNATURE_HEADER", "LinkExchange", "Recorder", "exchange_for"]

log = logging.getLogger("nats_otel.bridge.exchange")

SENDER_HEADER = "Nats-Otel-Sender"
SIGNATURE_HEADER = "Nats-Otel-Signature"
BATCH_HEADER = "Nats-Otel-Batch"  # the sender's count of batches published, from 1
# An idle bridge that vouches says so every `_HEARTBEAT_S` (peers silent ten times as long
# left: `wholeness.PEER_SILENCE_S`), and every `_HEARTBEAT_SOON_S` for `_AFTER_DATA_S` after
# its last evidence: how long it has been whole must reach its peers before they decide the
# hops of its last batch (`link.wait` after it; a burst's end needs its whole window past it).
_HEARTBEAT_S = 1.0
_HEARTBEAT_SOON_S = 0.1
_AFTER_DATA_S = 2.0
# Senders whose batch numbers are followed: the bridges of a deployment; a hostile input's bound.
# Each start of a bridge is a sender of its own: when the bound is reached, those not heard
# from for `_FORGET_S` are forgotten (at most once per `_PRUNE_EVERY_S`); one heard again
# after that counts as first heard mid-way (`_numbered`).
_SENDERS = 4096
_FORGET_S = 600.0
_PRUNE_EVERY_S = 1.0
# Evidence batches waiting to be recorded; past it, the newest are dropped (counted): the
# conversion thread is behind, and a bounded backlog is worth more than a late one.
_PENDING_BATCHES = 256
_LOG_EVERY_S = 10.0
_TICK_S = 0.5  # how often the router looks for silent peers (`Router.tick`)
# Heartbeats published without hearing one's own back before it says so (`heard_itself`):
# NATS echoes a message within a round trip; three allow for a reconnect under way.
_UNHEARD_BEATS = 3
# Replays waiting for their time (`replay_at`): changes within a quarter second share one,
# and past this many (a storm of changes) a change asks for none (its own replay still runs).
_CATCH_UPS = 64
_CATCH_UP_GRAIN_S = 0.25


class Recorder(Protocol):
    """What records evidence in the link window: `processor.Processor.observe_evidence` (in
    its conversion thread), or with worker processes `workers.WorkerPool.record_evidence`
    (each report to the worker whose link window holds its trace)."""

    def __call__(self, reports: Sequence[HopEvidence], latencies: Sequence[LinkLatencyEstimate],
                 peer: PeerBatch | None = None) -> None: ...


def exchange_for(settings: BridgeSettings, metrics: Any, record: Recorder, pool: Any) -> LinkExchange | None:
    """The bridge's exchange (`link.exchange`), or None when it is off."""
    subject = settings.exchange_subject
    if subject is None:
        return None
    return LinkExchange(subject, settings.exchange_key(), metrics, record, pool,
                        margin_ns=int(2 * settings.link.max_clock_skew * 1e9))


class LinkExchange:
    """Publishes this bridge's evidence and records the others' (see the module docstring).

    `record` runs in `pool`'s thread (`run_in_executor(pool, record, reports, latencies)`):
    the conversion lane, whose thread touches the link window while anything is queued in
    it (the event loop's thread only while it is idle, `processor_lane`); with worker
    processes, the thread that hands the evidence to them."""

    def __init__(self, subject: str, key: bytes | None, metrics: Any, record: Recorder, pool: Any,
                 margin_ns: int = 0) -> None:
        self.subject, self._key, self._metrics, self._record, self._pool = subject, key, metrics, record, pool
        # Report time is the servers' clock: a report at least this far past when this bridge
        # subscribed to the exchange was published after it (twice the clock skew).
        self._margin_ns = margin_ns
        self._listening_since_ns: int | None = None
        # Unique per process and start: a bridge skips its own batches (NATS echoes them).
        self.sender = f"{socket.gethostname()}:{os.getpid()}:{time.time_ns()}"
        self._nc: Any = None
        self._sub: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._publishing: set[asyncio.Task[None]] = set()
        self._pending = 0
        self._last_log: dict[str, float] = {}
        self._published = 0  # batches numbered so far (`BATCH_HEADER`)
        self._last_published = self._last_data = 0.0
        # sender -> (its last batch number seen, batches of it missed so far, when last heard)
        self._numbers: dict[str, tuple[int, int, float]] = {}
        self._pruned = 0.0
        # sender -> report time from which its evidence reached this bridge (first heard of mid-way)
        self._late: dict[str, int] = {}
        self._heartbeat: asyncio.Task[None] | None = None
        # With trace ownership (`routing`): the router hears every peer's heartbeat, and keeps
        # their latest states for the next batch (`Router.take_states`), applied by the
        # conversion (`Processor.whole`) instead of a trip to its thread for each.
        self.router: Router | None = None
        self._ticked = 0.0
        # How often it says how long it has been whole after data (`route_with`: less often).
        self.soon_s = _HEARTBEAT_SOON_S
        # JetStream mode with trace ownership (`js_routing`): each trace's evidence stays with
        # its owner, so data batches go to this subject, kept by the stream for a restart, and
        # heard live by no bridge; the exchange subject carries the heartbeats alone.
        self.kept_subject: str | None = None
        self._kept_in: tuple[str, float] | None = None  # (stream, retention) once kept (`keep`)
        self._replaying: asyncio.Future[None] | None = None
        self._replay_again = False
        self._catch_ups: dict[float, asyncio.TimerHandle] = {}  # when (monotonic) -> its replay (`replay_at`)
        # Its own batches came back (NATS echoes them): it hears the exchange (`members_known`).
        self.heard_itself = False
        self._unheard_beats = 0

    async def start(self, nc: Any) -> None:
        self._nc, self._loop = nc, asyncio.get_running_loop()
        self._listening_since_ns = time.time_ns()
        self._sub = await subscribe_plain(nc, self.subject, self._accept, _PENDING_BATCHES * 4)
        log.info("link evidence exchanged on %s", self.subject)

    async def attach(self, nc: Any, settings: BridgeSettings, streams: Callable[[], Streams] | None = None) -> bool:
        """Start on the bridge's (first source's) connection once connected, and in JetStream
        mode keep the evidence in its stream; with `streams` (a bridge that vouches), say
        what they know every `_HEARTBEAT_S` while idle. False when there is no connection (logged)."""
        if nc is None:
            log.warning("link exchange not started: the first source has no connection")
            return False
        await self.start(nc)
        if settings.mode == "jetstream":
            await self.keep(nc, f"NATS_OTEL_LINKS_{settings.jetstream.durable}", settings.link.retention)
        if streams is not None:
            self._heartbeat = asyncio.create_task(self._beat(streams, settings.nats.read_interval))
        if self.router is not None:  # trace ownership rides on this connection and its heartbeats
            await self.router.start(nc)
        return True

    def route_with(self, router: Router, link_wait_s: float) -> None:
        """Trace ownership: `router` hears the heartbeats, which go out soon after data every
        quarter of `link.wait` (`soon_s`) rather than every 0.1 s: every peer hears every bridge."""
        self.router = router
        self.soon_s = min(1.0, max(self.soon_s, link_wait_s / 4))

    async def stop(self) -> None:
        for handle in self._catch_ups.values():
            handle.cancel()
        self._catch_ups.clear()
        if self._replaying is not None:
            self._replaying.cancel()
            await asyncio.gather(self._replaying, return_exceptions=True)
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            await asyncio.gather(self._heartbeat, return_exceptions=True)

    async def _beat(self, streams: Callable[[], Streams], tick_s: float) -> None:
        loop = asyncio.get_running_loop()
        while True:
            # On a read tick (`tick_at_or_after`): one wake-up with the reads the tick resumes.
            await asyncio.sleep(tick_at_or_after(loop.time() + self.soon_s, tick_s) - loop.time())
            now = time.monotonic()
            if self.router is not None and now - self._ticked >= _TICK_S:
                self._ticked = now
                self.router.tick()
            quiet = now - self._last_published
            # Soon after data, unless every peer just got this bridge's state with a forward.
            soon = (quiet >= self.soon_s and now - self._last_data <= _AFTER_DATA_S
                    and (self.router is None or not self.router.told_all(now - self.soon_s)))
            if quiet >= _HEARTBEAT_S or soon:
                states = [StreamState(name, *state) for name, state in streams().items()]
                await self.publish(encode_batch(self.sender, [], (), states), data_batch=False)
                self._unheard_beats = 0 if self.heard_itself else self._unheard_beats + 1
                if self._unheard_beats >= _UNHEARD_BEATS:
                    self._count("unheard", "this bridge does not hear its own heartbeats, so not its peers' either "
                                "(may its user publish and subscribe there? docs/security.md): until it does, its "
                                "streams vouch for nothing and alike messages link by their numbers alone")

    async def keep(self, nc: Any, stream: str, retention_s: float) -> int:
        """JetStream mode: the stream that keeps the evidence (created if missing, given the
        kept subject if an earlier release made it), and its last `retention_s` replayed into
        the link window (`replay`). Returns the batches replayed; a stream that cannot be used
        is logged (links then rest on the live exchange alone)."""
        try:
            await ensure_stream(nc, stream, [self.subject] + ([self.kept_subject] if self.kept_subject else []),
                                retention_s)
        except Exception as exc:  # noqa: BLE001 - the bridge runs on without what was kept
            self._count("unkept", f"stream {stream}: {type(exc).__name__}: {exc}; a restarted bridge starts "
                        "without it")
            return 0
        self._kept_in = (stream, retention_s)
        return await self.replay()

    def replay_soon(self) -> None:
        """JetStream mode with trace ownership: the members changed, so this bridge may now own
        traces whose upstream reports another bridge mapped; replay what was kept (one replay
        at a time; a change during one asks for one more after it)."""
        if self._kept_in is None:
            return
        if self._replaying is not None and not self._replaying.done():
            self._replay_again = True
            return

        async def replays() -> None:
            self._replay_again = True
            while self._replay_again:
                self._replay_again = False
                await self.replay()

        self._replaying = asyncio.ensure_future(replays())

    def replay_at(self, when: float) -> None:
        """One more replay at the monotonic `when` (`replay_soon` then), beside any asked for
        at other times. Trace ownership moved at a change, but the former owners still map
        the trace messages they took before it (their link windows, the forwards they were
        sent) and keep that evidence after the replay of the change ran: what the new owner
        held for want of it comes back as the hold window closes (`JetStreamSource.hold`),
        so a replay then finds it (without it, a redelivered copy was exported unlinked
        where its first copy was linked: a span with two parents)."""
        if self._kept_in is None or self._loop is None:
            return
        due = when - when % _CATCH_UP_GRAIN_S  # never later than asked: the held come back just after
        if due in self._catch_ups or len(self._catch_ups) >= _CATCH_UPS:
            return
        self._catch_ups[due] = self._loop.call_later(max(0.0, due - time.monotonic()), self._catch_up, due)

    def _catch_up(self, due: float) -> None:
        del self._catch_ups[due]
        self.replay_soon()

    async def replay(self) -> int:
        """The kept stream's last `link.retention` of evidence into the link window, each
        batch recorded before the next (never dropped); the batches replayed. What is replayed
        says nothing of who is a member now: the router does not hear it."""
        if self._kept_in is None or self._nc is None:
            return 0
        stream, retention_s = self._kept_in

        def failed(exc: BaseException) -> None:
            self._count("unkept", f"replaying stream {stream}: {type(exc).__name__}: {exc}")

        return await replay_stream(self._nc, stream, self.kept_subject or self.subject, retention_s,
                                   functools.partial(self._accept, live=False), failed)

    def note_data(self) -> None:
        """This bridge observed data (with trace ownership it publishes no evidence): say how
        long it has been whole soon after, as after a data batch."""
        self._last_data = time.monotonic()

    async def bye(self) -> None:
        """Say goodbye (trace ownership: the peers take this bridge off the ring at once)."""
        if self._nc is None or not self._nc.is_connected:
            return
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            await asyncio.gather(self._heartbeat, return_exceptions=True)
            self._heartbeat = None
        try:
            await self._nc.publish(self.subject, encode_batch(self.sender, [], (), ()),
                                   headers={SENDER_HEADER: self.sender, BYE_HEADER: "1"})
            await self._nc.flush(timeout=2)
        except Exception as exc:  # noqa: BLE001 - the peers find out by the silence, or a 503
            self._count("unpublished", f"goodbye: {type(exc).__name__}: {exc}")

    def publish_soon(self, data: bytes) -> None:
        """`publish` from another thread (a worker process's evidence, read by its pipe's
        reader thread); before `start`, counted as unpublished."""
        if self._loop is None:
            self._count("unpublished", "the exchange has not started")
            return
        self._loop.call_soon_threadsafe(self._publish_task, data)

    def _publish_task(self, data: bytes) -> None:
        task = asyncio.ensure_future(self.publish(data))
        self._publishing.add(task)  # a task nobody holds may be collected before it runs
        task.add_done_callback(self._publishing.discard)

    async def publish(self, data: bytes, *, data_batch: bool = True) -> None:
        if not data or self._nc is None or not self._nc.is_connected:
            if data:
                self._count("unpublished", "not connected")
            return
        self._published += 1  # numbered even if it fails: the peers see the gap
        subject = self.subject
        if data_batch and self.kept_subject is not None:
            subject = self.kept_subject  # for a restart's replay only: no peer's heartbeat is due
        else:
            self._last_published = time.monotonic()
            if data_batch:
                self._last_data = self._last_published
        headers = {SENDER_HEADER: self.sender, BATCH_HEADER: str(self._published)}
        if self.router is not None:
            headers[VIEW_HEADER] = self.router.view
        if self._key is not None:
            headers[SIGNATURE_HEADER] = sign(self._key, data)
        try:
            await self._nc.publish(subject, data, headers=headers)
        except Exception as exc:  # noqa: BLE001 - a lost batch costs links, never the bridge
            self._count("unpublished", f"{type(exc).__name__}: {exc}")
            return
        self._metrics.link_evidence.labels("published").inc()

    def _accept(self, msg: Any, live: bool = True) -> asyncio.Future[None] | None:
        """Check a received batch and hand it to the conversion thread; the future of its
        recording, or None when it was skipped or dropped (counted). Not `live` (replayed),
        it is evidence alone: heard by no router."""
        headers = msg.headers or {}
        if headers.get(SENDER_HEADER) == self.sender:
            self.heard_itself = True  # it hears the exchange: its peers' batches reach it too
            return None
        try:
            batch = decode_peer_batch(msg.data, self._key, headers.get(SIGNATURE_HEADER))
        except EvidenceError as exc:
            self._count(exc.reason, exc.detail)
            return None
        sender = batch.sender
        if sender == self.sender:
            self._count("forged", "a batch naming this bridge as its sender")
            return None
        batch = self._numbered(batch, headers.get(BATCH_HEADER))
        if self.router is not None and live:
            bye = BYE_HEADER in headers
            # Only a bridge that owns traces says its view; one that does not (ownership off,
            # worker processes, a build from before it) is no member: a forward there would
            # only come back 503, and with it heard again the ring would change at each.
            if (bye or VIEW_HEADER in headers) and self.router.heard(sender, bye):
                self._last_published = 0.0  # a newcomer: tell it who is here at once
            if bye:
                return None
            if not batch.reports:  # a heartbeat: its state waits for the next batch
                self.router.note_states(sender, headers.get(VIEW_HEADER), batch.streams, batch.latencies,
                                        batch.trusted_from_ns)
                return None
        if self._pending >= _PENDING_BATCHES:
            self._count("dropped", "the conversion thread is behind")
            if sender in self._numbers:  # a batch lost here, as if on the way
                last, missed, heard = self._numbers[sender]
                self._numbers[sender] = (last, missed + 1, heard)
            return None
        # Not awaited: nats-py runs one subscription's callbacks one after another, so waiting
        # for the conversion thread here would record one batch per turn of that thread and
        # let the evidence fall behind `link.wait` under load (measured: 62-76% of the links
        # found in bursts, against 99-100% without the wait). `_pending` bounds what is queued.
        self._pending += 1
        future = asyncio.get_running_loop().run_in_executor(self._pool, self._record, batch.reports,
                                                            batch.latencies, batch)
        future.add_done_callback(functools.partial(self._recorded, reports=len(batch.reports),
                                                   result="received" if live else "replayed"))
        return future

    def _numbered(self, batch: PeerBatch, number: str | None) -> PeerBatch:
        """`batch` with how many of its sender's batches before it never arrived here (a
        batch dropped below for a busy conversion thread counts too: the next one shows it).
        A sender first heard of past its first batch started before this bridge listened:
        what it received before then is not vouched for here (`trusted_from_ns`)."""
        try:
            current = int(number) if number is not None else 0
        except ValueError:
            current = 0
        sender = batch.sender
        now = time.monotonic()
        followed = self._numbers.get(sender)
        if followed is None:
            if len(self._numbers) >= _SENDERS:
                self._forget_silent(now)
            if len(self._numbers) >= _SENDERS:  # never followed, so never trusted
                return PeerBatch(sender, batch.reports, batch.latencies, batch.streams, 1)
            followed = (0, 0, now)
            if current > 1:  # its earlier batches went out before this bridge listened
                followed = (current - 1, 0, now)
                self._late[sender] = (self._listening_since_ns or time.time_ns()) + self._margin_ns
        last, missed, _ = followed
        if current <= 0 or current <= last:
            missed += 1  # unnumbered or out of order: what it vouches for is in doubt
        else:
            missed += current - last - 1
        self._numbers[sender] = (max(last, current), missed, now)
        trusted_from = self._late.get(sender)
        return PeerBatch(batch.sender, batch.reports, batch.latencies, batch.streams, missed, trusted_from)

    def _forget_silent(self, now: float) -> None:
        """Forget the senders not heard from for `_FORGET_S` (bridges stopped or restarted)."""
        if now - self._pruned < _PRUNE_EVERY_S:
            return
        self._pruned = now
        for sender in [s for s, (_, _, heard) in self._numbers.items() if now - heard > _FORGET_S]:
            del self._numbers[sender]
            self._late.pop(sender, None)

    def _recorded(self, future: asyncio.Future[None], *, reports: int, result: str) -> None:
        self._pending -= 1
        if future.cancelled() or future.exception() is not None:
            self._count("dropped", f"recording failed: {'cancelled' if future.cancelled() else future.exception()}")
            return
        self._metrics.link_evidence.labels(result).inc()  # heard live, or replayed from the kept stream
        self._metrics.link_evidence_reports.inc(reports)

    def _count(self, result: str, detail: str) -> None:
        self._metrics.link_evidence.labels(result).inc()
        now = time.monotonic()
        if now - self._last_log.get(result, -_LOG_EVERY_S) >= _LOG_EVERY_S:
            self._last_log[result] = now
            log.warning("link evidence %s on %s: %s", result, self.subject, detail)
