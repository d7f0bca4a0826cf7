"""Archives of real trace messages, changed as a test needs them."""

from __future__ import annotations

import base64
import json


def without_header(line: bytes, name: str) -> bytes:
    """An archive line whose trace message reports its message without the header `name`:
    gone from `request.header`, and its `Name: value\\r\\n` lines from `request.msgsize`, as
    if the publisher had never set it. What the servers' reports of a batch published
    without a per-message header look like (tests/data/hop_batches was recorded with one,
    `Hop-Check-Seq`, the truth's check)."""
    record = json.loads(line)
    report = json.loads(base64.b64decode(record["payload_b64"]))
    request = report["request"]
    headers = request.get("header") or {}
    for key in [key for key in headers if key.lower() == name.lower()]:
        request["msgsize"] -= sum(len(key) + len(value) + 4 for value in headers.pop(key))
    record["payload_b64"] = base64.b64encode(json.dumps(report, separators=(",", ":")).encode()).decode()
    return json.dumps(record, separators=(",", ":")).encode()
