"""JetStream mode: the stream that keeps the link evidence for a restart, and its replay
(`LinkExchange.keep`, `LinkExchange.replay`). NATS calls only; what the exchange counts and
logs stays there."""

from __future__ import annotations

import datetime
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

__all__ = ["ensure_stream", "replay_stream"]

log = logging.getLogger("nats_otel.bridge.exchange")


async def ensure_stream(nc: Any, stream: str, subjects: Sequence[str], retention_s: float) -> None:
    """`stream` on `subjects`, created if missing (file storage, `retention_s` old at most),
    given the subjects it lacks if an earlier release made it. Raises what NATS raises."""
    from nats.js.api import StorageType, StreamConfig
    from nats.js.errors import NotFoundError

    js = nc.jetstream()
    try:
        info = await js.stream_info(stream)
    except NotFoundError:
        await js.add_stream(StreamConfig(name=stream, subjects=list(subjects), storage=StorageType.FILE,
                                         max_age=retention_s))
        log.info("link evidence stream created", extra={"fields": {"stream": stream}})
        return
    if not set(subjects) <= set(info.config.subjects or ()):  # kept by an earlier release
        config = info.config
        config.subjects = sorted({*(config.subjects or ()), *subjects})
        await js.update_stream(config)
        log.info("link evidence stream updated", extra={"fields": {"stream": stream, "subjects": config.subjects}})


async def replay_stream(nc: Any, stream: str, subject: str, retention_s: float,
                        accept: Callable[[Any], Awaitable[None] | None],
                        failed: Callable[[BaseException], None]) -> int:
    """The last `retention_s` of `subject` in `stream`, each message handed to `accept` and
    its recording awaited before the next (never dropped); the messages replayed. A failure
    goes to `failed` and ends the replay with what it had."""
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

    since = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=retention_s)
    try:
        consumer = await nc.jetstream().pull_subscribe(
            subject, stream=stream,
            config=ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_TIME, opt_start_time=since,
                                  ack_policy=AckPolicy.NONE, inactive_threshold=60.0, mem_storage=True))
    except Exception as exc:  # noqa: BLE001 - the bridge runs on without what was kept
        failed(exc)
        return 0
    replayed = 0
    try:
        while True:
            try:
                msgs = await consumer.fetch(256, timeout=1.0)
            except TimeoutError:  # nats-py's, or asyncio's from inside its fetch
                break  # nothing (more) to replay
            except Exception as exc:  # noqa: BLE001 - the bridge runs on with what it has
                failed(exc)
                break
            for msg in msgs:
                recording = accept(msg)
                if recording is not None:
                    await recording  # one batch at a time, never dropped
                replayed += 1
            if msgs and msgs[-1].metadata.num_pending == 0:
                break
    finally:
        try:
            await consumer.unsubscribe()
        except Exception:  # noqa: BLE001 - an ephemeral consumer goes by itself
            pass
    log.info("link evidence replayed", extra={"fields": {"stream": stream, "batches": replayed}})
    return replayed
