"""Trace ownership in JetStream mode: a forward is settled by its owner's answer.

Several JetStream bridges on one durable each fetch a random share of every server's
reports, as a queue group's bridges receive one (`routing`). They route alike: a bridge keeps
the trace messages of the traces it owns and forwards the others to their owners, one NATS
message per owner and fetched batch, so that what each bridge links, maps and exports is its
own share of the traces, not everyone's evidence.

What differs is the settling. A JetStream message is acknowledged only once its spans are
exported (at least once), so the sender keeps a forwarded message unacknowledged until the
owner answers on the forward's reply subject what became of each of its trace messages,
one byte each: `a` exported (the sender acks it), `n` not now (the sender naks it:
JetStream redelivers it, to whichever bridge, which routes it again), `t` never (the sender
terms it), `h` held (left unlinked while its upstream's evidence may still come: the sender
holds it, `JetStreamSource.hold`, as for one it fetched). The owner settles a forwarded
message exactly as it settles one it fetched, the same policy (`policy.settle`) and the
same hold (the forward carries the message's delivery count), through a stand-in for the
JetStream message (`ForwardedMsg`), and answers once every message of the forward is
settled.

What it rests on is JetStream's redelivery, nothing of its own:
- An owner SIGKILLed: its forwards are never answered. Its peers find it silent
  (`routing.MEMBER_SILENCE_S`) and nak what they forwarded to it, or NATS answers a new
  forward with 503 (no one subscribes to the owner's subject) and the sender routes it to
  the next owner at once. Either way nothing is acked that was not exported.
- A sender SIGKILLed: what it fetched and had not settled, forwarded or not, is redelivered
  by JetStream after `jetstream.ack_wait`; an owner's late answer goes nowhere.
- A forward (or its answer) lost, or an owner too slow: after `answer_wait` (half the ack
  wait, so that JetStream does not redeliver it first) the sender naks the messages.
In every case a message is exported at least once, and twice where an owner exported it
but its answer did not come back in time: the duplicate that at-least-once allows.

The owner records the hop evidence of what it maps, as a bridge alone does, and publishes
it only to the kept stream (`exchange.LinkExchange.keep`: `<exchange>.kept`), which no
bridge subscribes to live: a bridge that starts replays it, as before, so that a report
redelivered after a SIGKILL still finds the evidence of its upstream report.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from nats_otel.bridge.routing import Leaving, Router
from nats_otel.bridge.sources.delivery import Delivery, size_of
from nats_otel.core.decode import RawTraceMessage
from nats_otel.core.evidence import sign

__all__ = ["ACK", "HOLD", "NAK", "SIGNATURE_HEADER", "TERM", "ForwardedMsg", "JetStreamRouter"]

log = logging.getLogger("nats_otel.bridge.routing")

ACK, NAK, TERM, HOLD = b"a"[0], b"n"[0], b"t"[0], b"h"[0]
_UNSETTLED = b"?"[0]
SIGNATURE_HEADER = "Nats-Otel-Signature"  # an answer's, with `link.exchange_key_file`
_FOREIGN_VIEWS = 64  # a bound on `_foreign_views` (a hostile input's): past it, every such forward replays

# Settles deliveries this bridge fetched: (ack, nak, term, hold), each a list of them.
Settle = Callable[[list[Delivery], list[Delivery], list[Delivery], list[Delivery]], Awaitable[None]]


class _Answer:
    """What became of one received forward's trace messages, sent back when all are settled."""

    __slots__ = ("left", "outcomes", "reply", "send")

    def __init__(self, reply: str, frames: int, send: Callable[[str, bytes], None]) -> None:
        self.reply = reply
        self.outcomes = bytearray([_UNSETTLED]) * frames
        self.left = frames
        self.send = send

    def settle(self, index: int, outcome: int) -> None:
        if self.outcomes[index] != _UNSETTLED:
            return  # settled once: JetStream's own messages ignore a second ack alike
        self.outcomes[index] = outcome
        self.left -= 1
        if not self.left:
            self.send(self.reply, bytes(self.outcomes))


class _Metadata:
    """What `JetStreamSource.holdable` reads of a message: for a forwarded one, the count of
    JetStream's deliveries to its sender (`Frame.delivered`)."""

    __slots__ = ("num_delivered",)

    def __init__(self, num_delivered: int) -> None:
        self.num_delivered = num_delivered


class ForwardedMsg:
    """Stands in for the JetStream message of a forwarded trace message at its owner:
    settling it (`JetStreamSource.settle` calls these) records the outcome in the answer."""

    __slots__ = ("_answer", "_index", "metadata")

    def __init__(self, answer: _Answer, index: int, delivered: int) -> None:
        self._answer, self._index = answer, index
        self.metadata = _Metadata(max(1, delivered))

    def settle(self, outcome: int) -> None:
        """`ACK`, `NAK`, `TERM` or `HOLD`: its part of the answer (sent once all of it is settled)."""
        self._answer.settle(self._index, outcome)

    async def ack(self) -> None:
        self.settle(ACK)

    async def nak(self, delay: float | None = None) -> None:
        self.settle(NAK)

    async def term(self) -> None:
        self.settle(TERM)


class JetStreamRouter(Router):
    """`Router` for JetStream bridges (see the module docstring): forwards wait for their
    answer; forwarded messages are settled by answering. `settle` settles what this bridge
    fetched; `answer_wait_s` is how long a forward waits for its answer before its
    messages are naked."""

    def __init__(self, base_subject: str, me: str, intake: Any, metrics: Any,
                 on_view_change: Callable[[], None], key: bytes | None, settle: Settle,
                 answer_wait_s: float) -> None:
        super().__init__(base_subject, me, intake, metrics, on_view_change, key)
        self._settle = settle
        self._answer_wait = answer_wait_s
        # Members that said goodbye, until their answers are due: a 503 from one of them means
        # it takes no more forwards, not that it will not answer those it took.
        self._draining: dict[str, float] = {}
        # Views of senders that differed from this bridge's, since its own last changed: each
        # starts a replay and a hold window once (`_on_frames`).
        self._foreign_views: set[str] = set()

    async def route_fetched(self, deliveries: list[Delivery]) -> list[Delivery]:
        """The fetched deliveries this bridge owns; the others are forwarded, each kept
        unsettled until its owner answers (or naked now, when the forward could not go)."""
        own, others = self.split(deliveries)
        for owner, part in others.items():
            if not await self.forward(owner, part, []):
                await self._settle([], part, [], [])
        return own

    # -- the sender's side: answers, and forwards never answered ---------------------------

    def _on_answer(self, msg: Any) -> None:
        headers = msg.headers or {}
        kept = self._kept.get(msg.subject)
        if kept is None:
            return  # answered already, or naked for its time: JetStream redelivers it anyway
        if headers.get("Status") == "503":
            del self._kept[msg.subject]
            self._run(self._reroute(kept[1], kept[2]))
            return
        if headers.get("Status") is not None:
            return  # another status of NATS's (none is sent for a published request)
        if self._key is not None and not hmac.compare_digest(headers.get(SIGNATURE_HEADER) or "",
                                                             sign(self._key, msg.subject.encode() + msg.data)):
            self._metrics.routed.labels("forged").inc()
            self._log("forged", "an answer with a missing or wrong signature: its messages wait for their time")
            return
        part = kept[2]
        outcomes = msg.data
        if len(outcomes) != len(part):
            self._metrics.routed.labels("malformed").inc()
            self._log("malformed", f"an answer of {len(outcomes)} outcomes for {len(part)} messages")
            return
        del self._kept[msg.subject]
        settled: dict[int, list[Delivery]] = {ACK: [], NAK: [], TERM: [], HOLD: []}
        for delivery, outcome in zip(part, outcomes, strict=True):
            settled.get(outcome, settled[NAK]).append(delivery)
        self._metrics.routed.labels("answered").inc(len(part))
        self._run(self._settle(settled[ACK], settled[NAK], settled[TERM], settled[HOLD]))

    def _expire(self, now: float) -> None:
        """Forwards unanswered for `answer_wait`: naked, so that JetStream redelivers them."""
        for subject in [s for s, (at, _, _) in self._kept.items() if now - at > self._answer_wait]:
            self._nak_kept(subject, "unanswered")
        for member in [m for m, at in self._draining.items() if now - at > self._answer_wait]:
            del self._draining[member]

    def _rebuild(self, why: str) -> None:
        self._foreign_views.clear()  # judged anew against this view
        super()._rebuild(why)

    def _leave(self, sender: str, why: Leaving) -> None:
        super()._leave(sender, why)
        if why is Leaving.GOODBYE:  # a SIGTERM: it drains, and answers what it was sent
            self._draining[sender] = time.monotonic()
        elif why is Leaving.SILENT or sender not in self._draining:  # gone (a SIGKILL): no answer comes
            for subject in [s for s, (_, owner, _) in self._kept.items() if owner == sender]:
                self._nak_kept(subject, f"owner gone ({why})")

    def _nak_kept(self, subject: str, why: str) -> None:
        _, owner, part = self._kept.pop(subject)
        self._metrics.routed.labels("unanswered").inc(len(part))
        self._log("unanswered", f"{len(part)} trace messages forwarded to {owner}: {why}; naked for redelivery")
        self._run(self._settle([], part, [], []))

    def _taken_back(self, delivery: Delivery) -> Delivery:
        """Owned now (its owner was gone): into this bridge's intake with its JetStream message."""
        return Delivery(delivery.raw, delivery.source, delivery.size, delivery.msg, -1)

    def _unsent(self, part: list[Delivery]) -> None:
        self._run(self._settle([], part, [], []))

    def _not_taken_back(self, delivery: Delivery) -> None:
        """Not lost: naked, JetStream redelivers it (counted as a forwarded one refused here)."""
        self._metrics.routed.labels("refused").inc()
        self._log("refused", "a trace message taken back from a gone owner: the intake is full; naked")
        self._unsent([delivery])

    def _delivered(self, delivery: Delivery) -> int:
        try:
            return int(delivery.msg.metadata.num_delivered)
        except Exception:  # noqa: BLE001 - no JetStream metadata (taken back from a gone owner): a first
            return 1

    # -- the owner's side: forwarded messages in, answers out ------------------------------

    def _on_frames(self, _subject: bytes, _reply: bytes | None, _headers: bytes | None, data: bytes) -> None:
        """A forward: its trace messages into the intake, each settled by answering; what the
        intake refuses is answered `n` at once (the sender naks it: redelivered)."""
        forward = self._decoded(data)
        if forward is None:
            return
        sender = forward.sender
        self._numbered(sender, forward.number)
        if forward.view != self.ring.view and forward.view not in self._foreign_views:
            # The sender sees other members than this bridge does: a change is under way here
            # too, heard of a moment later. Replay and hold now, as for a change of its own.
            if len(self._foreign_views) < _FOREIGN_VIEWS:
                self._foreign_views.add(forward.view)
            self._on_view_change()
        answer = _Answer(self.reply_subject(sender, forward.number, self.me), len(forward.frames), self._answer)
        streams = [f"{sender}/{name}" for name in forward.streams]
        intake, refused = self._intake, 0
        for index, frame in enumerate(forward.frames):
            raw = RawTraceMessage(frame.subject, frame.headers, frame.payload)
            forwarded = ForwardedMsg(answer, index, frame.delivered)
            if not intake.offer(Delivery(raw, streams[frame.stream], size_of(raw), forwarded, -1)):
                refused += 1
                answer.settle(index, NAK)
        self._metrics.routed.labels("received").inc(len(forward.frames) - refused)
        if refused:
            self._metrics.routed.labels("refused").inc(refused)
            self._log("refused", f"{refused} forwarded trace messages: the intake is full; the sender naks them")

    def _answer(self, reply: str, outcomes: bytes) -> None:
        # Signed with where it goes: an answer replayed to another forward does not verify.
        headers = {SIGNATURE_HEADER: sign(self._key, reply.encode() + outcomes)} if self._key is not None else None
        self._run(self._publish_answer(reply, outcomes, headers))

    async def _publish_answer(self, reply: str, outcomes: bytes, headers: dict[str, str] | None) -> None:
        try:
            await self._nc.publish(reply, outcomes, headers=headers)
        except Exception as exc:  # noqa: BLE001 - the sender naks it after `answer_wait`: redelivered
            self._metrics.routed.labels("unanswered").inc(len(outcomes))
            self._log("unanswered", f"an answer to {reply}: {type(exc).__name__}: {exc}")

    # -- leaving ----------------------------------------------------------------------------

    async def stop(self) -> None:
        """Stop taking forwards (NATS answers new ones 503: re-routed by their senders); the
        answers to this bridge's own forwards are still heard until `finish`."""
        for sub in self._subs[:1]:
            try:
                await sub.unsubscribe()
            except Exception:  # noqa: BLE001 - the connection is going anyway
                pass

    async def finish(self, deadline: float) -> None:
        """A drain's end: wait (until the monotonic `deadline`) for the answers to this bridge's
        forwards and for its own answers to go out; what is still unanswered then is naked."""
        while (self._kept or self._tasks) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for subject in list(self._kept):
            self._nak_kept(subject, "the bridge is stopping")
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        await super().stop()
