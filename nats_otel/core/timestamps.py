"""RFC 3339 timestamps with nanoseconds, as nats-server writes them (Go's RFC3339Nano).

`datetime` keeps microseconds only; the servers report nanoseconds with 0 to 9 fractional
digits (trailing zeros trimmed), so timestamps are parsed to integer nanoseconds here.
"""

from __future__ import annotations

import calendar
import re

__all__ = ["format_rfc3339_ns", "parse_rfc3339_ns", "python_parse_rfc3339_ns"]

_RFC3339 = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?"
    r"(?:([Zz])|([+-])(\d{2}):(\d{2}))\Z"
)


# Whole-second prefix ("2026-11-22T02:16:30") -> epoch seconds. Trace messages of one
# second share it, so the fast path below parses only the fraction. Bounded.
_SECONDS: dict[str, int] = {}


def parse_rfc3339_ns(text: str) -> int:
    """Nanoseconds since the Unix epoch; `ValueError` naming the text if it is not RFC 3339."""
    # Fast path for what servers write: UTC, "Z", 1 to 9 fractional digits.
    if isinstance(text, str) and 21 <= len(text) <= 30 and text[-1] == "Z" and text[19] == ".":
        seconds = _SECONDS.get(text[:19])
        fraction = text[20:-1]
        if seconds is not None and fraction.isdigit() and fraction.isascii():
            return seconds * 1_000_000_000 + int(fraction.ljust(9, "0"))
    ns = _parse_slow(text)
    if isinstance(text, str) and len(text) >= 20 and text[19] in ".Z" and text[-1] == "Z":
        if len(_SECONDS) > 4096:
            _SECONDS.clear()
        _SECONDS[text[:19]] = ns // 1_000_000_000
    return ns


def _parse_slow(text: str) -> int:
    match = _RFC3339.match(text) if isinstance(text, str) else None
    if match is None:
        raise ValueError(f"not an RFC 3339 timestamp: {text!r:.80}")
    year, month, day, hour, minute, second = (int(g) for g in match.group(1, 2, 3, 4, 5, 6))
    if not (1 <= month <= 12 and 1 <= day <= 31 and hour < 24 and minute < 60 and second < 61):
        raise ValueError(f"timestamp out of range: {text!r:.80}")
    seconds = calendar.timegm((year, month, day, hour, minute, second, 0, 0, 0))
    if match.group(9):
        offset = int(match.group(10)) * 3600 + int(match.group(11)) * 60
        seconds -= offset if match.group(9) == "+" else -offset
    fraction = match.group(7) or ""
    return seconds * 1_000_000_000 + int(fraction.ljust(9, "0") or 0)


# The reference of `_primitives.parse_rfc3339_ns`, which the decoding hooks use when built
# (and which hands it the forms its C parser does not take).
python_parse_rfc3339_ns = parse_rfc3339_ns


def format_rfc3339_ns(ns: int) -> str:
    """UTC RFC 3339 with all nine fractional digits (for display and archives)."""
    seconds, nanos = divmod(ns, 1_000_000_000)
    import time

    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{nanos:09d}Z"
