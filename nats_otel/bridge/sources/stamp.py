"""When a trace message was received (`RawTraceMessage.received_at`, RFC 3339 UTC with
microseconds): stamped once per read of the connection, not once per message.

The direct receive path serves every complete frame of a read in one pass
(`direct.DirectParser`); the messages of one read arrived together, so they share one
stamp: `refresh` runs once per read and the per-message handler only reads `CURRENT[0]`.
Reading the clock and comparing per message was ~2 % of the bridge's GIL-held time under
load (py-spy, issue 39). The text is formatted at most once per millisecond.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

__all__ = ["CURRENT", "received_at", "refresh"]

#: [the stamp's text, the millisecond it names]: read per message, written per read.
CURRENT: list = ["", -1]


def refresh() -> str:
    """Stamp now (formatted only when the millisecond changed) and return the text."""
    now_ns = time.time_ns()
    ms = now_ns // 1_000_000
    if ms != CURRENT[1]:
        CURRENT[1] = ms
        CURRENT[0] = datetime.fromtimestamp(now_ns // 1000 / 1e6, UTC).isoformat().replace("+00:00", "Z")
    return CURRENT[0]


#: The receive time of one message received on its own (nats-py's callback path).
received_at = refresh


refresh()  # never empty: a handler called before any read still stamps a time
