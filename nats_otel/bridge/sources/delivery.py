"""A received trace message as the bridge carries it (`Delivery`), and what it costs the
byte-bounded intake (`charge`).

The charge is computed once, when the delivery is made: the intake adds it on `offer` and
takes it back on `release`, and at tens of thousands of messages per second computing it
twice was a visible share of the receive path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nats_otel.core.decode import RawTraceMessage

__all__ = ["MESSAGE_OVERHEAD", "Delivery", "charge"]

#: Bytes of Python objects per waiting message beyond its payload: measured 190-440 with
#: tracemalloc (no header to two), rounded up so the bound errs on the safe side.
MESSAGE_OVERHEAD = 512


@dataclass(slots=True, init=False)
class Delivery:
    """A received trace message; `msg` is the JetStream message to settle, if any; `size`
    what it counts against the intake's bound (payload + subject + `MESSAGE_OVERHEAD`)."""

    raw: RawTraceMessage
    source: str
    msg: Any
    size: int

    def __init__(self, raw: RawTraceMessage, source: str, msg: Any = None) -> None:
        self.raw = raw
        self.source = source
        self.msg = msg
        self.size = len(raw.payload) + len(raw.subject or "") + MESSAGE_OVERHEAD


def charge(delivery: Delivery) -> int:
    """What one held message counts against the bound."""
    return delivery.size
