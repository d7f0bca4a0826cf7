"""Trace ownership among the bridges of a queue group: each trace is linked, mapped and
exported by one bridge, its owner; the others forward its trace messages there.

In the sidecar layout the queue group gives every bridge a random share of every server's
reports, so a hop's two reports are usually at two bridges. Before, every bridge sent the
evidence of every report it received to every other (`exchange`): each bridge's work grew
with the whole deployment's traffic, and eight bridges cost six times one. Now a bridge
splits each batch it collects (`split`): the trace messages of the traces it owns stay, the
others go, as received, one NATS message per owner and batch, to the owner's subject
(`<exchange subject>.to.<member token>`), and arrive there in its intake as if received by
it, with the stream they arrived on at the sender and that stream's losses. What a bridge
receives, computes and sends grows with its own share: one hash per trace message received,
one message per owner and batch forwarded, one heartbeat a second per peer.

What it rests on, all NATS's own:
- Membership: the exchange's heartbeats (every bridge says it is there every second on the
  exchange subject, and every quarter of `link.wait` after data unless it just forwarded to
  every peer, whose forwards carry the same state). A member is a sender heard within
  `MEMBER_SILENCE_S`; one that says goodbye (SIGTERM) leaves at once; one whose subject has
  no subscriber (NATS answers a forward with status 503, no responders: its connection is
  gone, a SIGKILL) leaves when that answer comes, and the forward goes to the next owner.
  One heard again is a member again: at once after a silence (its process or its connection
  stalled; this bridge's own stall is not counted, `tick`), `REJOIN_AFTER_S` after a 503 (it
  reconnected); never after its goodbye.
- Ownership: the members' consistent-hash ring (`ownership.Ring`); every bridge computes it
  from what it heard, no election and no consensus. Two bridges may briefly hold different
  views (one heard a join or a leave first): the view's id goes with every heartbeat and
  forward, and a peer whose view differs from this bridge's vouches for nothing here
  (`note_states`): alike messages are then not counted by order until the views agree again.
  Every change of this bridge's view is a break of its own streams, so what it vouched
  before the change proves nothing after it.

What is lost: a SIGKILLed owner takes what it held (the traces it owned, for one link
window); a forward sent in the milliseconds while the servers still route to the dead
connection goes with it. A SIGTERMed bridge says goodbye, stops taking forwards (new ones
get a 503 and go to the next owner), forwards what it still receives and drains the rest.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from nats_otel.bridge.ownership import Forward, ForwardError, Ring, decode_forward, encode_forward, member_token
from nats_otel.bridge.sharding import shard_key
from nats_otel.bridge.sources.delivery import Delivery, size_of
from nats_otel.bridge.sources.direct import DirectClient, subscribe_plain
from nats_otel.core.decode import RawTraceMessage
from nats_otel.core.evidence import LinkLatencyEstimate, PeerBatch, Streams, StreamState

__all__ = ["MEMBER_SILENCE_S", "ROUTED", "VIEW_HEADER", "Router"]

log = logging.getLogger("nats_otel.bridge.routing")

VIEW_HEADER = "Nats-Otel-View"
BYE_HEADER = "Nats-Otel-Bye"
# A peer not heard for this long (three heartbeats and a half) has left the ring.
MEMBER_SILENCE_S = 3.5
# After joining the exchange, how long a new bridge listens before it routes: every member
# answers a newcomer's first heartbeat at once, and all say so every second anyway.
SETTLE_S = 1.2
# Ticks come every half second or so (`exchange._TICK_S`); one this much later than the one
# before means this bridge's loop stalled (`tick`).
STALL_S = 1.5
# A member that left for a 503 (its connection gone) is heard again only this long after:
# a heartbeat it sent before its connection went may still reach a peer after NATS's answer;
# one sent later is from a new connection (it reconnected) and brings it back.
REJOIN_AFTER_S = 1.0


class Leaving(enum.StrEnum):
    """Why a member left this bridge's ring, which says when it may be a member again
    (`Router.heard`); the text is the log's."""

    GOODBYE = "said goodbye"  # it stopped (SIGTERM): never again under this name
    SILENT = "silent"  # not heard for MEMBER_SILENCE_S (a stall): heard again, at once
    NO_RESPONDERS = "no responders"  # a 503 to a forward: after REJOIN_AFTER_S


# A forward is kept this long for its 503 (no responders) to come back and re-route it (NATS
# answers within a round trip): what a bridge holds for it is its last second of forwards.
_KEEP_FORWARD_S = 1.0
_LOG_EVERY_S = 10.0
# `Delivery.msg` of a trace message forwarded to this bridge: it is never forwarded again.
ROUTED = object()


class Router:
    """The members, the ring, the forwards (see the module docstring). Runs on the event loop."""

    def __init__(self, base_subject: str, me: str, intake: Any, metrics: Any,
                 on_view_change: Callable[[], None], key: bytes | None = None) -> None:
        self.me = me
        self._key = key  # the exchange's shared key: forwards are signed and checked with it
        self._base = base_subject
        self._intake, self._metrics = intake, metrics
        self._on_view_change = on_view_change
        self._peers: dict[str, float] = {}  # member -> when last heard (monotonic)
        # Members that left -> (when, heard again after): a goodbye is never taken back (the
        # bridge drains and exits); a 503 is after `REJOIN_AFTER_S`; silence at once (`heard`).
        self._gone: dict[str, tuple[float, float]] = {}
        self.ring = Ring([me])
        self._leaving = False
        self._routed = False  # a batch was split: a view change breaks this bridge's streams
        self._nc: Any = None
        self._subs: list[Any] = []
        self._settled_at = 0.0
        self._ticked_at = 0.0  # the last `tick` (monotonic)
        self._sent: dict[str, int] = {}  # owner -> forwards numbered so far
        self._heard: dict[str, tuple[int, int]] = {}  # sender -> (last forward number, forwards missed)
        self._kept: dict[str, tuple[float, str, list[Delivery]]] = {}  # ack subject -> (when, owner, what it carried)
        self._ack_prefix = self._answers_to(me)
        self._last_log: dict[str, float] = {}
        self._told: dict[str, float] = {}  # owner -> when it was last forwarded to
        self._states: dict[str, tuple[PeerBatch, bool]] = {}  # peer -> its latest state (`note_states`)
        self._tasks: set[asyncio.Task[Any]] = set()  # `_run`'s

    @property
    def view(self) -> str:
        return self.ring.view

    def subject_of(self, member: str) -> str:
        return f"{self._base}.to.{member_token(member)}"

    async def start(self, nc: Any) -> None:
        self._nc = nc
        own = self.subject_of(self.me)
        if isinstance(nc, DirectClient):  # the receive path's fast lane: no `Msg`, queue or task
            forwards = await nc.subscribe_direct(own, self._on_frames)
        else:
            async def on_msg(msg: Any) -> None:
                self._on_frames(b"", None, None, msg.data)

            forwards = await nc.subscribe(own, cb=on_msg, pending_msgs_limit=65_536)
        self._subs = [forwards, await subscribe_plain(nc, f"{self._ack_prefix}.>", self._on_answer, 65_536)]
        await nc.flush()
        self._metrics.route_members.set(len(self.ring))
        self._settled_at = time.monotonic() + SETTLE_S
        log.info("trace ownership on", extra={"fields": {"subject": self.subject_of(self.me)}})

    async def settled(self) -> None:
        """Wait until this bridge has heard the members (a newcomer listens first)."""
        left = self._settled_at - time.monotonic()
        if left > 0:
            await asyncio.sleep(left)

    # -- membership --------------------------------------------------------------------

    def heard(self, sender: str, bye: bool) -> bool:
        """A peer's heartbeat (or goodbye); True when it is new (answer it with ours at once).

        A member that fell silent (a stall of its process or of its connection) and is heard
        again is a member again at once, as one that reconnected after a 503 is: left out, it would go on owning its
        share by its own view while the others forwarded that share elsewhere, every hop
        across the two unlinked until it restarted."""
        now = time.monotonic()
        if bye:
            self._leave(sender, Leaving.GOODBYE)
            return False
        gone = self._gone.get(sender)
        if gone is not None:
            if now < gone[1]:
                return False
            del self._gone[sender]
        new = sender not in self._peers
        self._peers[sender] = now
        if new:
            self._rebuild(f"{sender} {'came back' if gone is not None else 'joined'}")
        return new

    def tick(self) -> None:
        """Peers silent for `MEMBER_SILENCE_S` left; kept forwards past their time go.

        Silent while this bridge listened: a tick more than `STALL_S` after the one before
        means its own event loop stalled (a GC pause, a throttled container), what its peers
        said meanwhile still waits unread, and the stall does not count against them (else it
        would drop them all on waking, and take them back a read later: two view changes)."""
        now = time.monotonic()
        stalled = now - self._ticked_at - STALL_S if self._ticked_at else 0.0
        self._ticked_at = now
        if stalled > 0:
            for sender in self._peers:
                self._peers[sender] += stalled
        for sender in [s for s, heard in self._peers.items() if now - heard > MEMBER_SILENCE_S]:
            self._leave(sender, Leaving.SILENT)
        self._expire(now)
        for sender in [s for s, (at, _) in self._gone.items() if now - at > 600.0]:
            del self._gone[sender]
        for owner in [o for o in self._told if o not in self._peers]:
            del self._told[owner]
        for sender in [s for s in self._heard if s not in self._peers and s not in self._gone]:
            del self._heard[sender]  # forgotten with it (a sender heard again counts anew)

    def _expire(self, now: float) -> None:
        """Forwards kept past their time for a 503 go (core mode: none comes later)."""
        for subject in [s for s, (at, _, _) in self._kept.items() if now - at > _KEEP_FORWARD_S]:
            del self._kept[subject]

    def _leave(self, sender: str, why: Leaving) -> None:
        now = time.monotonic()
        if why is Leaving.GOODBYE:
            again = math.inf
        elif why is Leaving.NO_RESPONDERS:
            again = now + REJOIN_AFTER_S
        else:
            again = now
        self._gone[sender] = (now, again)
        if self._peers.pop(sender, None) is not None:
            self._rebuild(f"{sender} left ({why})")

    def leave(self) -> None:
        """This bridge stops owning: what it still receives goes to the others."""
        self._leaving = True
        self._rebuild("this bridge is leaving")

    def _rebuild(self, why: str) -> None:
        members = list(self._peers) if self._leaving else [self.me, *self._peers]
        self.ring = Ring(members)
        self._metrics.route_views.inc()
        self._metrics.route_members.set(len(members))
        log.info("trace ownership view changed", extra={"fields": {"why": why, "members": len(members),
                                                                   "view": self.ring.view}})
        if self._routed:  # before its first batch nothing was routed by the old view
            self._on_view_change()

    # -- routing -------------------------------------------------------------------------

    def split(self, deliveries: list[Delivery]) -> tuple[list[Delivery], dict[str, list[Delivery]]]:
        """The deliveries this bridge owns (and those forwarded to it), and the others by
        their owner (`forward` them)."""
        ring = self.ring
        self._routed = True
        if len(ring) == 1 and not self._leaving:
            return deliveries, {}
        me = self.me
        own: list[Delivery] = []
        others: dict[str, list[Delivery]] = {}
        for delivery in deliveries:
            if delivery.msg is ROUTED:
                own.append(delivery)
                continue
            owner = ring.owner(shard_key(delivery.raw)) if len(ring) else me
            if owner == me:
                own.append(delivery)
            else:
                others.setdefault(owner, []).append(delivery)
        return own, others

    async def route(self, batch: list[Delivery], streams: Callable[[], Streams]) -> list[Delivery]:
        """The part of `batch` this bridge owns; the rest is forwarded, with what this bridge's
        streams say of themselves as the batch is taken (`streams`), and released from the intake."""
        own, others = self.split(batch)
        if others:
            said = streams()
            names = list(said)
            states = [StreamState(name, *state) for name, state in said.items()]
            for owner, part in others.items():
                await self.forward(owner, part, names, states)
                self._intake.release(part)
        return own

    async def forward(self, owner: str, part: list[Delivery], names: list[str],
                      states: Sequence[StreamState] = ()) -> bool:
        """Send `part` to its owner, one message (`names`: this bridge's stream names, the
        frames' index; a stream not among them is added to this batch's; `states`: what they
        say of themselves, as a heartbeat would). False when it could not be sent (counted)."""
        names = list(names)
        index = {name: at for at, name in enumerate(names)}
        frames = []
        for delivery in part:
            at = index.get(delivery.source)
            if at is None:
                index[delivery.source] = at = len(names)
                names.append(delivery.source)
            frames.append((delivery.raw, at, delivery.breaks, self._delivered(delivery)))
        number = self._sent[owner] = self._sent.get(owner, 0) + 1
        reply = self.reply_subject(self.me, number, owner)
        now = time.monotonic()
        self._kept[reply] = (now, owner, part)
        self._told[owner] = now
        try:
            await self._nc.publish(self.subject_of(owner), encode_forward(self.me, self.ring.view, number, names,
                                                                          frames, states, self._key), reply=reply)
        except Exception as exc:  # noqa: BLE001 - counted and logged; the bridge goes on
            self._kept.pop(reply, None)
            self._metrics.routed.labels("unforwarded").inc(len(part))
            self._log("unforwarded", f"{len(part)} trace messages to {owner}: {type(exc).__name__}: {exc}")
            return False
        self._metrics.routed.labels("forwarded").inc(len(part))
        return True

    def _delivered(self, delivery: Delivery) -> int:
        """A forwarded message's delivery count (`Frame.delivered`): none in core mode."""
        return 0

    def reply_subject(self, sender: str, number: int, owner: str) -> str:
        """Where the answers to `sender`'s forward `number` to `owner` go: NATS's 503, and in
        JetStream mode the owner's (`js_routing`), which derives it from the forward alone."""
        return f"{self._answers_to(sender)}.{number}.{member_token(owner)}"

    def _answers_to(self, sender: str) -> str:
        """The prefix of every answer to `sender`'s forwards (it subscribes `<prefix>.>`)."""
        return f"{self._base}.ack.{member_token(sender)}"

    def _on_answer(self, msg: Any) -> None:
        """A forward's answer: only NATS's own, 503 when no one subscribes to the owner's
        subject (it is gone): re-route what it carried."""
        if (msg.headers or {}).get("Status") != "503" or msg.subject not in self._kept:
            return
        self._run(self._reroute(*self._kept.pop(msg.subject)[1:]))

    def _run(self, work: Awaitable[Any]) -> None:
        """Run `work` on the loop (from a subscription's handler, which never awaits)."""
        task = asyncio.ensure_future(work)
        self._tasks.add(task)  # a task nobody holds may be collected before it runs
        task.add_done_callback(self._tasks.discard)

    async def _reroute(self, owner: str, part: list[Delivery]) -> None:
        """NATS answered a forward to `owner` with 503: it is gone; `part` goes to the owners now."""
        self._leave(owner, Leaving.NO_RESPONDERS)
        self._metrics.routed.labels("rerouted").inc(len(part))
        own, others = self.split(part)
        for owner_now, again_part in others.items():
            if not await self.forward(owner_now, again_part, []):
                self._unsent(again_part)
        for delivery in own:  # now this bridge's: back into its intake, vouching for nothing
            if not self._intake.offer(self._taken_back(delivery)):
                self._not_taken_back(delivery)

    def _taken_back(self, delivery: Delivery) -> Delivery:
        """A forwarded delivery this bridge owns now, as its intake takes it (core: never
        forwarded again, vouching for nothing)."""
        return Delivery(delivery.raw, delivery.source, delivery.size, ROUTED, -1)

    def _unsent(self, part: list[Delivery]) -> None:
        """What could not be forwarded again (core mode: lost, counted `unforwarded` already)."""

    def _not_taken_back(self, delivery: Delivery) -> None:
        """The intake had no room for a delivery taken back (core mode: lost)."""
        self._metrics.dropped.labels("queue_full").inc()

    def _decoded(self, data: bytes) -> Forward | None:
        """A received forward, checked; None (counted, logged) when it cannot be read."""
        try:
            return decode_forward(data, self._key)
        except ForwardError as exc:
            self._metrics.routed.labels(exc.reason).inc()
            self._log(exc.reason, f"a forward: {exc.detail}")
            return None

    def _on_frames(self, _subject: bytes, _reply: bytes | None, _headers: bytes | None, data: bytes) -> None:
        """Trace messages another bridge received for the traces this one owns: into the
        intake, as that bridge's streams (`<sender>/<stream>`) with their losses, when it
        routes as this one does; else vouching for nothing (`Delivery.breaks` -1). What its
        streams say of themselves waits for the next batch, as a heartbeat's does."""
        forward = self._decoded(data)
        if forward is None:
            return
        sender = forward.sender
        missed = self._numbered(sender, forward.number)
        vouched = forward.view == self.ring.view
        intake, refused = self._intake, 0
        streams = [f"{sender}/{name}" for name in forward.streams]
        for frame in forward.frames:
            raw = RawTraceMessage(frame.subject, frame.headers, frame.payload)
            breaks = frame.breaks + missed if vouched and frame.breaks >= 0 else -1
            if not intake.offer(Delivery(raw, streams[frame.stream], size_of(raw), ROUTED, breaks)):
                refused += 1
        self._metrics.routed.labels("received").inc(len(forward.frames) - refused)
        if refused:  # lost here: a loss of the sender's streams from now on
            self._metrics.dropped.labels("queue_full").inc(refused)
            last, missed = self._heard.get(sender, (0, 0))
            self._heard[sender] = (last, missed + 1)
        if forward.states:
            self.note_states(sender, forward.view, forward.states, ())

    def note_states(self, sender: str, view: str | None, states: Sequence[StreamState],
                    latencies: Sequence[LinkLatencyEstimate], trusted_from_ns: int | None = None) -> None:
        """What a peer's streams say of themselves (a heartbeat, or a forward): kept, the
        latest for each peer, until the next batch takes them (`take_states`). Its losses
        are its forwards to this bridge lost (a lost heartbeat loses no report)."""
        previous = self._states.get(sender)
        if previous is not None and not latencies:
            latencies = previous[0].latencies
        batch = PeerBatch(sender, (), tuple(latencies), tuple(states), self.missed(sender), trusted_from_ns)
        # A leaving bridge owns nothing in the peers' view: what they say of their streams
        # from then on is about traces they forward elsewhere.
        self._states[sender] = (batch, view == self.ring.view and not self._leaving)

    def take_states(self) -> list[tuple[PeerBatch, bool]]:
        """The peers' latest states since the last call, each with whether the peer routes as
        this bridge does (`Processor.whole`)."""
        taken = list(self._states.values())
        self._states.clear()
        return taken

    def told_all(self, since: float) -> bool:
        """Whether every peer got a forward (and with it this bridge's state) since `since`."""
        told = self._told
        return all(told.get(member, 0.0) >= since for member in self.ring.members if member != self.me)

    def _numbered(self, sender: str, current: int) -> int:
        """The forwards of `sender` to this bridge that never arrived, so far."""
        last, missed = self._heard.get(sender, (0, 0))
        if current <= last:
            missed += 1
        elif last:
            missed += current - last - 1
        elif current > 1:  # its first forwards here went out before this bridge listened
            missed += 1
        self._heard[sender] = (max(last, current), missed)
        return missed

    def missed(self, sender: str) -> int:
        """Forwards from `sender` lost on the way or refused here: losses of its streams."""
        return self._heard.get(sender, (0, 0))[1]

    async def depart(self, bye: Callable[[], Awaitable[None]], window_s: float) -> None:
        """Leave (a drain): what this bridge still receives goes to the other owners, and
        `bye` tells the peers to stop forwarding here. The forwards already on their way still
        arrive for `window_s` (a link window: the batches held here are decided then, as at
        any other time, for what the peers said of their streams holds only after it); later
        ones get NATS's 503 once the subscription is gone, which re-routes them."""
        self.leave()
        await bye()
        await asyncio.sleep(max(0.0, window_s))
        await self.stop()

    async def stop(self) -> None:
        """Stop taking forwards (new ones are answered 503 by NATS and re-routed by their
        senders); what was read already is in the intake."""
        for sub in self._subs:
            try:
                await sub.unsubscribe()
            except Exception:  # noqa: BLE001 - the connection is going anyway
                pass
        self._subs = []
        if self._tasks:  # re-routes under way: they end (forwarded, or counted) before the connection goes
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def _log(self, result: str, detail: str) -> None:
        now = time.monotonic()
        if now - self._last_log.get(result, -_LOG_EVERY_S) >= _LOG_EVERY_S:
            self._last_log[result] = now
            log.warning("trace forward %s: %s", result, detail)
