"""Direct dispatch: core-mode subscriptions served without nats-py's per-message objects.

nats-py's parser hands every MSG/HMSG to `Client._process_msg(sid, subject, reply, data,
headers)`, which builds a header dict and a `Msg`, queues it on the subscription, and a task
per subscription awaits the queue and then the callback. For the bridge's trace
subscriptions all of that is overhead: `DirectClient` calls a plain function with the
subject, the raw header block and the payload instead, and returns. Every other sid
(JetStream, requests, inboxes) goes to nats-py unchanged.

A direct subscription is made with nats-py's own `subscribe` (no callback), so nats-py
keeps it in its table, resends its SUB under the same sid after a reconnect, and `drain`
works: UNSUB, then a flush; the messages read before the PONG were handed over
synchronously, in order, before the flush returns. nats-py's per-subscription pending
limits do not apply (nothing waits in its queue): the caller's own bound does.

`_process_msg` is private. `UNSUPPORTED` says why the installed nats-py cannot be served
this way (None when it can); the caller then subscribes with a callback as before.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

from nats.aio.client import Client
from nats.aio.subscription import Subscription

__all__ = ["UNSUPPORTED", "DirectClient", "DirectHandler", "direct_unsupported"]

#: Called with (subject, raw header block or None, payload); must not block or raise.
DirectHandler = Callable[[bytes, "bytes | None", bytes], None]

_EXPECTED = ["self", "sid", "subject", "reply", "data", "headers"]


def direct_unsupported(client_class: type = Client) -> str | None:
    """Why `client_class` cannot be dispatched directly, or None if it can: its parser must
    await `_process_msg` with the parameters this module overrides."""
    method = getattr(client_class, "_process_msg", None)
    if method is None:
        return "nats-py's Client has no _process_msg"
    if not inspect.iscoroutinefunction(method):
        return "nats-py's Client._process_msg is not a coroutine function"
    params = list(inspect.signature(method).parameters)
    if params != _EXPECTED:
        return f"nats-py's Client._process_msg takes {params}, expected {_EXPECTED}"
    for name in ("subscribe", "_remove_sub"):
        if not callable(getattr(client_class, name, None)):
            return f"nats-py's Client has no {name}"
    return None


UNSUPPORTED = direct_unsupported()


class DirectClient(Client):
    """A nats-py `Client` whose direct subscriptions skip `Msg`, queue and task."""

    def __init__(self) -> None:
        super().__init__()
        self._direct: dict[int, DirectHandler] = {}

    async def subscribe_direct(self, subject: str, handler: DirectHandler, queue: str = "") -> Subscription:
        """Subscribe `subject` (in `queue`, if any); each message calls `handler` at once."""
        # `subscribe` takes the next sid before its first await: registering it first means
        # no message of this subscription can reach nats-py's path.
        sid = self._sid + 1
        self._direct[sid] = handler
        try:
            sub = await self.subscribe(subject, queue=queue)
        except BaseException:
            self._direct.pop(sid, None)
            raise
        if sub._id != sid:  # nats-py changed how it numbers: move the registration
            self._direct[sub._id] = self._direct.pop(sid)
        return sub

    def _remove_sub(self, sid: int, max_msgs: int = 0) -> None:
        self._direct.pop(sid, None)
        super()._remove_sub(sid, max_msgs)

    async def _process_msg(self, sid: int, subject: bytes, reply: bytes, data: bytes,
                           headers: bytes | None) -> None:
        handler = self._direct.get(sid)
        if handler is None:
            return await super()._process_msg(sid, subject, reply, data, headers)  # type: ignore[arg-type]
        stats = self.stats
        stats["in_msgs"] += 1
        stats["in_bytes"] += len(data)
        try:
            handler(subject, headers, data)
        except Exception as exc:  # noqa: BLE001 - as nats-py does for a failing callback: report, keep reading
            await self._error_cb(exc)
