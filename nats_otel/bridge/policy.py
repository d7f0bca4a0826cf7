"""The error policy: what becomes of each trace message of a converted batch (DESIGN §6).

* fatal: configuration (invalid settings, missing stream, unreadable certificates) - stop;
* drop and count: bad input (a message that cannot decode: counted by reason, JetStream
  `term`s it so it is never redelivered);
* retry: a transient export failure (the exporter retries with backoff; then JetStream naks
  the batch with a growing delay and pauses intake, core mode drops and counts it); also a
  refusal that a fixed configuration cures (401, 403, 404: nak, not ready);
* isolate, then drop and count: spans the backend refuses as invalid (HTTP 400,
  INVALID_ARGUMENT) are sent again message by message; what is refused alone is never
  retried (OTLP says so), JetStream `term`s it (`dropped{reason="export_invalid"}`).

`settle` is the per-message part, pure: the batch's deliveries and its outcome in, each
delivery's fate out; the loop (`loop.Bridge._policy`) settles them (JetStream) or counts
what was lost (core mode), and stops on what is fatal."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, TypeVar

from nats_otel.core.pipeline import Rejected

if TYPE_CHECKING:
    from nats_otel.bridge.processor import BatchOutcome

__all__ = ["Fates", "NakBackoff", "settle"]

D = TypeVar("D")
Fates = tuple[list[D], list[D], list[D], list[D]]


def settle(deliveries: Sequence[D], outcome: BatchOutcome) -> Fates[D]:
    """Each delivery's fate, as (ack, nak, term, hold):

    * hold: not exported, its upstream's evidence may yet come (`BatchOutcome.held`);
    * term: bad input, or spans the backend refused as invalid: never redelivered;
    * ack: exported;
    * nak: a transient downstream failure: try again later."""
    ack: list[D] = []
    nak: list[D] = []
    term: list[D] = []
    hold: list[D] = []
    exported = outcome.exported
    for position, (delivery, result) in enumerate(zip(deliveries, outcome.results, strict=True)):
        if position in outcome.held:
            hold.append(delivery)
        elif isinstance(result, Rejected) or position in outcome.poisoned:
            term.append(delivery)
        elif exported:
            ack.append(delivery)
        else:
            nak.append(delivery)
    return ack, nak, term, hold


class NakBackoff:
    """JetStream mode's retry: after a batch with naks, they are delayed and intake pauses
    for `initial` seconds, doubling with each failing batch in a row up to `maximum`; a
    batch without naks resets it."""

    def __init__(self, initial: float, maximum: float) -> None:
        self.initial, self.maximum = initial, maximum
        self._failures = 0
        self._pause_until = 0.0

    def after(self, naked: bool) -> float:
        """The nak delay for a batch just settled (0 when it had no naks)."""
        if not naked:
            self._failures = 0
            return 0.0
        self._failures += 1
        delay = min(self.initial * 2 ** (self._failures - 1), self.maximum)
        self._pause_until = time.monotonic() + delay
        return delay

    def pause_left(self) -> float:
        """Seconds intake still pauses (the backend is failing; fetching more would only nak more)."""
        return self._pause_until - time.monotonic()
