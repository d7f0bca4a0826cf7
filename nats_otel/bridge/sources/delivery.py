"""A received trace message as the bridge carries it (`Delivery`, made by `delivery`), and
what it costs the byte-bounded intake (`charge`).

The charge is computed once, when the delivery is made: the intake adds it on `offer` and
takes it back on `release`, and at tens of thousands of messages per second computing it
twice was a visible share of the receive path. A `Delivery` is a msgspec `Struct`, built
in C: the direct receive path makes one per message, and a class with a Python `__init__`
cost ~1 µs of it.
"""

from __future__ import annotations

from typing import Any

import msgspec

from nats_otel.core.decode import RawTraceMessage

__all__ = ["MESSAGE_OVERHEAD", "Delivery", "charge", "delivery", "size_of"]

#: Bytes of Python objects per waiting message beyond its payload: measured 190-440 with
#: tracemalloc (no header to two), rounded up so the bound errs on the safe side.
MESSAGE_OVERHEAD = 512


class Delivery(msgspec.Struct):
    """A received trace message; `size` what it counts against the intake's bound
    (`size_of`); `msg` the JetStream message to settle, if any; `breaks` how many times its
    source could have lost a trace message before it was received (`CoreSource.breaks`: two
    deliveries with the same count came with nothing lost between them). Made by
    `delivery`, or positionally where it runs per message."""

    raw: RawTraceMessage
    source: str
    size: int
    msg: Any = None
    breaks: int = 0


def size_of(raw: RawTraceMessage) -> int:
    """What a message counts against the intake's bound: payload + subject + `MESSAGE_OVERHEAD`."""
    return len(raw.payload) + len(raw.subject or "") + MESSAGE_OVERHEAD


def delivery(raw: RawTraceMessage, source: str, msg: Any = None) -> Delivery:
    """The delivery of `raw`, received from `source` (`msg`: its JetStream message), sized."""
    return Delivery(raw, source, size_of(raw), msg)


def charge(held: Delivery) -> int:
    """What one held message counts against the bound."""
    return held.size
