"""Traced traffic that crosses routes and a leafnode, shaped like the traffic of issue 29.

One publisher on one server, a subscriber on every server of the topology, so each message
is forwarded over routes (and on over the leafnode) and every server on its way reports it.
What differs between the modes is what makes linking hard:

* `per_message`: a new sampled W3C traceparent per message (every message its own
  context: the easy case, what the corpus mostly has);
* `batch`: one traceparent for a whole batch (a producer span publishing a batch, ordinary
  OpenTelemetry use), same-size messages `gap_ms` apart;
* `back_to_back`: the same batches with no gap at all (one client write, the servers
  forward them microseconds apart);
* `adhoc`: no traceparent, a `Nats-Trace-Dest` header naming one fixed destination (a
  shared debug subject: every message shares the ad-hoc context), `gap_ms` apart;
* `adhoc_back_to_back`: the same, in batches sent back to back (a loop publishing with a
  debug header).

Every message has the same payload size, so size never tells two messages apart. By default
each carries its number in `hop_truth.SEQUENCE_HEADER` (fixed width: sizes stay alike), which
the servers copy into their reports: a check of the order-based truth, and a header of the
message's own, which the linker takes as exact evidence (`core/shapes.py`); `numbered=False`
sends the messages of a context alike but for their time (the truth then rests on order).
The plan
(headers, payloads, pauses) is a pure function of the options and the seed
(`plan_messages`); `run_traffic` sends it with nats-py and counts what the subscribers got.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from nats_otel.bridge.sources.direct import flush_in_order
from nats_otel.devkit.hop_truth import SEQUENCE_HEADER
from nats_otel.devkit.processes import wait_for_interest

__all__ = ["MODES", "PlannedMessage", "TrafficOptions", "TrafficReport", "plan_messages", "run_traffic"]

Mode = Literal["per_message", "batch", "back_to_back", "adhoc", "adhoc_back_to_back"]
MODES: tuple[Mode, ...] = ("per_message", "batch", "back_to_back", "adhoc", "adhoc_back_to_back")


@dataclass(frozen=True, slots=True)
class TrafficOptions:
    """What to send. `batch_size` messages share a traceparent in `batch` and `back_to_back`
    (and are sent together in `adhoc_back_to_back`); `gap_ms` separates messages (all modes
    but the `..back_to_back` ones); `batch_gap_ms` separates batches (so one batch's reports
    are not interleaved with the next one's)."""

    mode: Mode = "per_message"
    messages: int = 1000
    batch_size: int = 100
    gap_ms: float = 2.0
    batch_gap_ms: float = 20.0
    payload_size: int = 128
    subject: str = "hops.traffic"
    adhoc_dest: str = "trace.adhoc.hops"
    seed: int = 29
    #: Each message carries its number in `SEQUENCE_HEADER`: a header of its own, which the
    #: linker uses as exact evidence (`core/shapes.py`). False: the messages of a context
    #: are alike but for their time and order, what a loop publishing one payload sends.
    numbered: bool = True
    #: > 0: the messages go out in bursts of this many back to back, `batch_gap_ms` between
    #: bursts, whatever the mode's own pauses (issue 46's traffic: a traceparent per message,
    #: 600 msgs/s in bursts of 50); the contexts still follow the mode and `batch_size`.
    burst: int = 0

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode: one of {', '.join(MODES)}, not {self.mode!r}")
        if self.messages < 1 or self.batch_size < 1 or self.payload_size < 1:
            raise ValueError("messages, batch_size and payload_size must be positive")
        if self.gap_ms < 0 or self.batch_gap_ms < 0 or self.burst < 0:
            raise ValueError("gap_ms, batch_gap_ms and burst must not be negative")


@dataclass(frozen=True, slots=True)
class PlannedMessage:
    """One message to publish, and how long to wait after the previous one (seconds)."""

    headers: dict[str, str]
    payload: bytes
    pause_s: float


def _traceparent(rng: random.Random) -> str:
    # Never all-zero (invalid): getrandbits could give 0 only with odds of 2^-128 / 2^-64.
    trace_id = rng.getrandbits(128) or 1
    parent = rng.getrandbits(64) or 1
    return f"00-{trace_id:032x}-{parent:016x}-01"


def plan_messages(options: TrafficOptions) -> list[PlannedMessage]:
    """The whole run, message by message: same options and seed, same plan."""
    rng = random.Random(options.seed)
    gap_s, batch_gap_s = options.gap_ms / 1000, options.batch_gap_ms / 1000
    plan = []
    context: dict[str, str] = {}
    for number in range(options.messages):
        # The payload's first bytes number the message (readable in a capture); all one size.
        payload = f"{number:08d}".encode().ljust(options.payload_size, b".")[: options.payload_size]
        first_of_batch = number % options.batch_size == 0
        if options.mode == "per_message":
            headers, pause = {"traceparent": _traceparent(rng)}, gap_s
        elif options.mode == "adhoc":
            headers, pause = {"Nats-Trace-Dest": options.adhoc_dest}, gap_s
        elif options.mode == "adhoc_back_to_back":
            headers, pause = {"Nats-Trace-Dest": options.adhoc_dest}, batch_gap_s if first_of_batch else 0.0
        else:
            if first_of_batch:
                context = {"traceparent": _traceparent(rng)}
            headers = dict(context)
            if options.mode == "batch":
                pause = batch_gap_s if first_of_batch else gap_s
            else:
                pause = batch_gap_s if first_of_batch else 0.0
        if options.burst > 0:
            pause = batch_gap_s if number % options.burst == 0 else 0.0
        if options.numbered:
            headers[SEQUENCE_HEADER] = f"{number:08d}"
        plan.append(PlannedMessage(headers, payload, 0.0 if number == 0 else pause))
    return plan


@dataclass(slots=True)
class TrafficReport:
    """What was sent and what the subscribers received (per server)."""

    published: int = 0
    duration_s: float = 0.0
    received: dict[str, int] = field(default_factory=dict)
    contexts: int = 0  # distinct traceparents (1 for ad-hoc: one shared destination)

    @property
    def complete(self) -> bool:
        """Every subscriber got every message."""
        return all(count == self.published for count in self.received.values())


async def run_traffic(publish_url: str, subscribe_urls: Mapping[str, str], options: TrafficOptions,
                      settle_s: float = 5.0) -> TrafficReport:
    """Subscribe on every server, wait for the interest to spread, publish the plan from
    `publish_url`, wait (up to `settle_s`) for the subscribers to get it all. Closes what it opened.

    Each pause is a minimum between two writes to the socket (a message is flushed before
    the pause that follows it): a late wake-up is not caught up with a shorter gap, which
    would put messages closer together than asked. `back_to_back` batches go out in one write.
    """
    import nats

    plan = plan_messages(options)
    received = dict.fromkeys(subscribe_urls, 0)
    clients: list[Any] = []
    try:
        publisher = await nats.connect(publish_url, name="hop-traffic-pub", allow_reconnect=False)
        clients.append(publisher)
        for server, url in subscribe_urls.items():
            subscriber = await nats.connect(url, name=f"hop-traffic-sub@{server}", allow_reconnect=False)
            clients.append(subscriber)

            async def count(_msg: Any, server: str = server) -> None:
                received[server] += 1

            await subscriber.subscribe(options.subject, cb=count, pending_msgs_limit=1_000_000,
                                       pending_bytes_limit=1 << 30)
            await subscriber.flush()
            await wait_for_interest(publisher, subscriber)
        started = last_write = time.monotonic()
        for message in plan:
            if message.pause_s > 0:
                await flush_in_order(publisher)
                delay = last_write + message.pause_s - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                last_write = time.monotonic()
            await publisher.publish(options.subject, message.payload, headers=message.headers)
        await flush_in_order(publisher)  # nats-py's own flush may not wait for them (direct.py)
        duration = time.monotonic() - started
        deadline = time.monotonic() + settle_s
        while any(n < len(plan) for n in received.values()) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
    finally:
        for client in clients:
            if not client.is_closed:
                await client.close()
    contexts = len({m.headers.get("traceparent") for m in plan})
    return TrafficReport(len(plan), duration, dict(received), contexts)
