"""The JetStream source asked about before Spark starts: its server answers, takes the
credentials, has JetStream, and has the stream (issue 47).

Without this, `convert --jetstream-url URL --stream NO_SUCH` said so only once the JVM had
started (seconds, and Spark's own lines first); an unreachable URL waited on nats-py's
reconnects. Here it is one connection and one `stream_info` request from this process,
bounded by `timeout`; each problem is one line, a result (`checks` raises it as a
`UsageError`: exit 2). The driver plans the stream's ranges from this process anyway
(`sources.read_jetstream`), so what this process cannot reach, the job could not read
either. No pyspark import.
"""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["stream_problem"]

# A connection or a request: what the data source's tasks wait too (`jetstream.JetStreamSource`).
TIMEOUT_S = 5.0


def _redact(url: str) -> str:
    scheme, sep, rest = url.rpartition("://")
    return f"{scheme}{sep}{rest.rpartition('@')[2]}"


def _why(error: BaseException | None) -> str:
    if isinstance(error, ConnectionRefusedError):
        return "connection refused"
    if isinstance(error, TimeoutError):
        return "no answer in time"
    if error is None:
        return "no server answered"
    text = str(error).removeprefix("nats: ").strip("'\"")
    return text or type(error).__name__


def _refused(why: str) -> bool:
    return "authorization" in why.lower() or "authentication" in why.lower()


async def _ask(servers: list[str], stream: str, creds: str | None, timeout: float) -> str | None:
    import nats
    from nats.errors import NoRespondersError, NoServersError
    from nats.errors import TimeoutError as NatsTimeout
    from nats.js.errors import NotFoundError, ServiceUnavailableError

    shown = ", ".join(_redact(s) for s in servers)
    errors: list[BaseException] = []

    async def keep(error: BaseException) -> None:  # nats-py's own callback logs a traceback
        errors.append(error)

    kwargs: dict[str, Any] = {
        # One attempt per server, no wait between: nats-py retries a first connection that
        # is refused for ever when reconnects are off.
        "servers": servers, "connect_timeout": timeout, "max_reconnect_attempts": 1, "reconnect_time_wait": 0,
        "error_cb": keep,
    }
    if creds:
        kwargs["user_credentials"] = creds
    try:
        nc = await asyncio.wait_for(nats.connect(**kwargs), timeout * (len(servers) + 1))
    except Exception as exc:  # noqa: BLE001 - refused, unreachable, a bad creds file: each one line
        why = _why(errors[-1] if errors and isinstance(exc, NoServersError | TimeoutError) else exc)
        where = f"--jetstream-creds {creds}" if creds else f"--jetstream-url {shown}"
        # A refusal may reach us as the server's -ERR or only as the reset that follows it
        # (whichever nats-py read first): any attempt's refusal is the answer.
        refused = [_why(e) for e in [*errors, exc] if _refused(_why(e))]
        if refused:
            return f"{where}: the server refused the credentials ({refused[0]})"
        if isinstance(exc, NoServersError | OSError | TimeoutError):
            return f"--jetstream-url {shown}: cannot connect ({why})"
        return f"{where}: {why}"
    try:
        await nc.jetstream(timeout=timeout).stream_info(stream)
    except NotFoundError:
        return f"JetStream stream {stream!r} not found on {shown}"
    except (ServiceUnavailableError, NoRespondersError, NatsTimeout, TimeoutError):
        return f"--jetstream-url {shown}: JetStream does not answer (not enabled for this account?)"
    finally:
        await nc.close()
    return None


def stream_problem(url: str, stream: str, creds: str | None = None, timeout: float = TIMEOUT_S) -> str | None:
    """Why `stream` cannot be read at `url` (comma-separated NATS URLs) with `creds`, in one
    line; None when a server answers, takes the credentials, and has the stream."""
    servers = [s.strip() for s in url.split(",") if s.strip()]
    return asyncio.run(_ask(servers, stream, creds, timeout))
