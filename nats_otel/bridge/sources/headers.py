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

__all__ = ["parse_headers"]

_VERSION = b"NATS/1.0"
_CRLF = b"\r\n"


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
