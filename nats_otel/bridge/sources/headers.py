"""NATS message headers from their wire bytes, for the direct receive path.

The block is `NATS/1.0[ status[ description]]\r\n` then `Name: value\r\n` lines and an empty
line. Unlike nats-py's dict (one value per name), every value is kept, in order, under the
name as written: the core looks names up case-insensitively. An inline status becomes
`Status` (and `Description`), as nats-py reports it.

Bad bytes never raise: a line without a colon, a name that is not ASCII or holds spaces, a
value that is not UTF-8 (kept with U+FFFD), or a block without the `NATS/1.0` line are
counted in the returned `malformed` and the rest is kept. The caller counts and logs them.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from nats_otel.core import accel

__all__ = ["HeaderReader", "SubjectTexts", "parse_headers"]

_VERSION = b"NATS/1.0"
_CRLF = b"\r\n"
_LOG_EVERY_S = 10.0


def parse_headers(block: bytes) -> tuple[dict[str, list[str]], int]:
    """The headers of one message, and how many of its parts were malformed."""
    headers: dict[str, list[str]] = {}
    malformed = 0
    lines = block.split(_CRLF)
    first = lines[0]
    if first.startswith(_VERSION):
        status_line = first[len(_VERSION):].strip()
        if status_line:
            malformed += _status(status_line, headers)
    else:
        malformed += 1
    for line in lines[1:]:
        if not line:
            continue
        name_bytes, colon, value_bytes = line.partition(b":")
        name = name_bytes.strip()
        if not colon or not name or not name.isascii() or len(name.split()) != 1:
            malformed += 1
            continue
        try:
            value = value_bytes.strip().decode()
        except UnicodeDecodeError:
            value = value_bytes.strip().decode(errors="replace")
            malformed += 1
        key = name.decode()
        values = headers.get(key)
        if values is None:
            headers[key] = [value]
        else:
            values.append(value)
    return headers, malformed


def _status(line: bytes, headers: dict[str, list[str]]) -> int:
    """`503` or `404 No Messages` after the version: nats-py's `Status` and `Description`."""
    code, _, description = line.partition(b" ")
    if not (len(code) == 3 and code.isdigit()):
        return 1
    headers["Status"] = [code.decode()]
    if description.strip():
        headers["Description"] = [description.strip().decode(errors="replace")]
    return 0


class HeaderReader:
    """`parse_headers` for one receive path: a block with malformed parts is counted in
    `counter` (`nats_otel_mapping_issues_total{kind="malformed_header"}`) and logged to `log`
    at most every 10 s, with how many and an example; `where` names the path in the log."""

    def __init__(self, counter: Any, log: logging.Logger, where: dict[str, str]) -> None:
        self._counter, self._log, self._where = counter, log, where
        self._logged_at = -_LOG_EVERY_S
        self._since_log = 0

    def __call__(self, block: bytes) -> dict[str, list[str]]:
        if _plain_headers is not None:  # a plain block (a compressed trace message's) in C
            plain = _plain_headers(block)
            if plain is not None:
                return plain
        headers, malformed = parse_headers(block)
        if malformed:
            self._counter.inc()
            self._since_log += 1
            now = time.monotonic()
            if now - self._logged_at >= _LOG_EVERY_S:
                self._log.warning("malformed message headers: the parts that parse are kept", extra={"fields": {
                    **self._where, "messages": self._since_log, "example": block[:200].decode(errors="replace")}})
                self._logged_at, self._since_log = now, 0
        return headers


# `parse_headers` for the plain blocks servers send (`_frames.plain_headers`, tested against
# it in tests/bridge/test_delivery_sink.py); None where the compiled modules are not used.
_compiled: Any = accel.compiled("nats_otel.bridge.sources._frames")
_plain_headers: Any = None if _compiled is None else _compiled.plain_headers


class SubjectTexts(dict[bytes, str]):
    """The text of each subject a direct handler meets, made once: a trace subscription sees
    a few. Bounded: past `limit` subjects (a wildcard may see many) the rest are decoded anew
    each time. A handler reads it as a dict (`get`) and calls `add` on a miss."""

    def __init__(self, limit: int = 1024) -> None:
        super().__init__()
        self.limit = limit

    def add(self, subject: bytes) -> str:
        text = subject.decode(errors="replace")
        if len(self) < self.limit:
            self[subject] = text
        return text
