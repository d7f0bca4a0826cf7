"""The live loop: source -> Converter -> batch -> export -> ack (DESIGN §2, §6).

The event loop receives and settles; decoding, mapping and encoding run on the event loop's
thread where the compiled kernel runs (it holds the GIL through a call: a thread of its own
would not let the loop read meanwhile), else in one conversion thread but for small batches
(`processor_lane`: the Converter's link state is touched by one thread at a time, in the
loop's order, either way), exporting
in `batch.exports_in_flight` export threads (so the next batch is converted while earlier
ones wait for the backend, and the NATS read path never waits on one), or with `batch.workers` > 1 in that
many worker processes (`workers.py`: batches sharded by trace id, several batches in flight). The error
policy (fatal, drop and count, retry, isolate) is `policy.py`'s. Each mode's loops (collect,
wait out the link window, hand each batch to `_process`) are `core_loop.py`'s and
`jetstream_loop.py`'s; this module starts them and drains them.

Exit codes: 0 clean drain, 1 the drain timed out, 2 fatal, 3 gave up on NATS
(`nats.give_up_after`: a source disconnected that long).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor

from nats_otel import __version__, gc_tuning
from nats_otel.bridge import core_loop, jetstream_loop
from nats_otel.bridge.accounting import BatchAccounting
from nats_otel.bridge.exchange import exchange_for
from nats_otel.bridge.export.result import ExportResult
from nats_otel.bridge.intake import Intake
from nats_otel.bridge.js_routing import JetStreamRouter
from nats_otel.bridge.policy import NakBackoff, settle
from nats_otel.bridge.processor import BatchOutcome, Exporter, Processor, make_exporters
from nats_otel.bridge.processor_lane import ProcessorLane, inline_limit, run_on_lane
from nats_otel.bridge.readiness import BackendReadiness
from nats_otel.bridge.ripening import Ripening
from nats_otel.bridge.routing import Router
from nats_otel.bridge.settings import BridgeSettings
from nats_otel.bridge.sources.jetstream import JetStreamSetupError, JetStreamSource
from nats_otel.bridge.sources.nats_core import CoreSource, Delivery
from nats_otel.bridge.sources.read_pacing import tick_at_or_after
from nats_otel.bridge.telemetry import HealthServer, Metrics
from nats_otel.bridge.wholeness import Wholeness, members_known
from nats_otel.bridge.workers import WorkerDied, WorkerPool
from nats_otel.core import engine
from nats_otel.core.decode import RawTraceMessage
from nats_otel.core.pipeline import Converted

__all__ = ["Bridge"]

log = logging.getLogger("nats_otel.bridge")

_GIVE_UP_CHECK_S = 0.25
# After the drain deadline, for the batch in flight to be counted exported or failed, not lost.
_DRAIN_GRACE_S = 2.0
EXIT_GAVE_UP = 3


class Bridge:
    """One running bridge. `await run()` until `request_stop()` (SIGTERM) or `max_runtime`."""

    def __init__(self, settings: BridgeSettings, metrics: Metrics | None = None,
                 exporters: Sequence[Exporter] | None = None) -> None:
        self.settings = settings
        self.metrics = metrics or Metrics()
        self._exporters = list(exporters) if exporters is not None else make_exporters(settings)
        # Readiness watches every exporter; with workers, those here only probe their backends.
        self.backend = BackendReadiness(self._exporters)
        self._probe_only: list[Exporter] = []
        self.workers: WorkerPool | None = None
        if settings.batch.workers > 1:
            if exporters is not None:
                raise ValueError("batch.workers > 1 builds its exporters in the workers; pass none")
            # The exporters were built above to fail here, early, on bad files/endpoints.
            self._probe_only, self._exporters = self._exporters, []
            self.workers = WorkerPool(settings, settings.batch.workers)
        # Core mode, one process: nothing reads a payload once observed (observed_batches).
        # (JetStream mode keeps each message to settle, with its payload, whatever this does.)
        self.processor = Processor(settings, self._exporters,
                                   release_payloads=settings.mode == "core" and self.workers is None)
        self.accounting = BatchAccounting(self.metrics, settings.telemetry, self.backend,
                                          [e.name for e in [*self._exporters, *self._probe_only]])
        self._pool = ProcessorLane(thread_name_prefix="nats-otel-convert")
        # The largest batch observed and converted on the loop's thread (`processor_lane`).
        self._inline_limit = inline_limit(engine.implementation() == "compiled", settings.archive is not None)
        self._export_pool = ThreadPoolExecutor(max_workers=settings.batch.exports_in_flight,
                                               thread_name_prefix="nats-otel-export")
        self.intake = Intake(settings.batch.queue_bytes, settings.batch.queue_size)
        # Read at scrape time: exact, and nothing to update per message.
        self.metrics.queue_depth.set_function(lambda: self.intake.held)
        self.metrics.queue_bytes.set_function(lambda: self.intake.bytes)
        self.metrics.queue_limit_bytes.set(settings.batch.queue_bytes)
        self.sources: list[CoreSource | JetStreamSource] = []
        self.health: HealthServer | None = None
        self._stopping: asyncio.Event | None = None
        self._intake_done = False
        self._started = False
        self._gave_up: str | None = None
        self._drain_overran = False
        self._line: Ripening | None = None  # core mode's waiting line (`core_loop`)
        self._backoff = NakBackoff(settings.jetstream.nak_delay_initial, settings.jetstream.nak_delay_max)
        self._fatal: str | None = None
        # Hop evidence shared with the other bridges of a queue group or durable.
        self.exchange = exchange_for(settings, self.metrics, self.processor.observe_evidence
                                     if self.workers is None else self.workers.record_evidence, self._pool)
        if self.exchange is not None and self.workers is not None:
            self.workers.sender, self.workers.on_evidence = self.exchange.sender, self.exchange.publish_soon
        self.wholeness = Wholeness(self.sources, settings.link.max_clock_skew, self.intake)
        # Trace ownership (routing.py): in core mode, in one process, with the exchange on,
        # each trace is linked by one bridge and the others forward its trace messages there.
        # In JetStream mode (`js_routing`), a forward is settled by its owner's answer.
        self.router: Router | None = None
        if self.exchange is not None and self.workers is None and settings.link.ownership:
            if settings.mode == "core":
                self.router = Router(self.exchange.subject, self.exchange.sender, self.intake, self.metrics,
                                     self.wholeness.start_anew, settings.exchange_key())
            else:
                self.router = JetStreamRouter(self.exchange.subject, self.exchange.sender, self.intake, self.metrics,
                                              functools.partial(jetstream_loop.owners_changed, self),
                                              settings.exchange_key(),
                                              functools.partial(jetstream_loop.settle_fetched, self),
                                              settings.jetstream.ack_wait / 2)
                self.exchange.kept_subject = f"{self.exchange.subject}.kept"
            self.exchange.route_with(self.router, settings.link.wait)

    # -- health ----------------------------------------------------------------------------

    def healthy(self) -> tuple[bool, str]:
        if self._fatal:
            return False, self._fatal
        return True, "running"

    def ready(self) -> tuple[bool, str]:
        """Ready when every source is connected and every exporter has shown that it reaches
        its backend; otherwise every reason why not, `; `-separated (never a credential)."""
        if self._stopping is not None and self._stopping.is_set():
            return False, self._gave_up or self._fatal or "draining"
        reasons = [s.link.describe() for s in self.sources if not s.connected]
        if not self.sources or (not reasons and not self._started):
            reasons.append("starting")
        if self.workers is not None and self._started and not self.workers.alive:
            reasons.append("a worker process is not running")
        reasons += self.backend.status()[1]
        return (False, "; ".join(reasons)) if reasons else (True, "ready")

    @property
    def metrics_port(self) -> int | None:
        return self.health.port if self.health else None

    def request_stop(self) -> None:
        """Begin the drain (safe to call from a signal handler on the loop)."""
        if self._stopping is not None and not self._stopping.is_set():
            log.info("stop requested: draining")
            self._stopping.set()

    # -- running ---------------------------------------------------------------------------

    async def run(self) -> int:
        """Run until stopped; 0 after a clean drain, 1 if the drain timed out, 2 if fatal."""
        s = self.settings
        self._stopping = asyncio.Event()
        if s.telemetry.metrics_port is not None:
            self.health = HealthServer(self.metrics, s.telemetry.metrics_host, s.telemetry.metrics_port,
                                       self.healthy, self.ready).start()
            log.info("serving /metrics, /healthz, /readyz", extra={"fields": {"port": self.health.port}})
        watchers = [asyncio.create_task(self.backend.watch(self._stopping)),
                    asyncio.create_task(self._give_up_watch())]
        try:
            code = await self._run()
            return EXIT_GAVE_UP if self._gave_up else code
        finally:
            for task in watchers:
                task.cancel()
            await asyncio.gather(*watchers, return_exceptions=True)
            if self.exchange is not None:
                await self.exchange.stop()
            for source in self.sources:
                await source.close()
            self._export_pool.shutdown(wait=True)
            await asyncio.get_running_loop().run_in_executor(self._pool, self.processor.close)
            for exporter in self._probe_only:
                exporter.close()
            if self.workers is not None:
                await asyncio.get_running_loop().run_in_executor(self._pool, self.workers.close)
            self._pool.shutdown(wait=True)
            if self.health:
                self.health.stop()

    async def _give_up_watch(self) -> None:
        """`nats.give_up_after`: stop (exit 3) once a source has been disconnected that long,
        at start-up or later, so that a job or a supervisor sees the outage."""
        limit = self.settings.nats.give_up_after
        assert self._stopping is not None
        if limit is None:
            return
        while not self._stopping.is_set():
            for source in self.sources:
                if source.link.down_for() >= limit:
                    self._gave_up = f"gave up after {limit:g}s without NATS: {source.link.describe()}"
                    log.error("giving up: a NATS source was disconnected too long", extra={"fields": {
                        "source": source.link.name, "url": source.link.url, "kind": source.link.kind,
                        "reason": source.link.reason, "give_up_after": limit, "exit_code": EXIT_GAVE_UP}})
                    self._stopping.set()
                    return
            await asyncio.sleep(_GIVE_UP_CHECK_S)

    async def _run(self) -> int:
        s = self.settings
        assert self._stopping is not None
        if self.workers is not None:
            loop = asyncio.get_running_loop()
            try:
                await loop.run_in_executor(self._pool, self.workers.start)
            except WorkerDied as exc:
                self._fatal = f"cannot start worker processes: {exc}"
                log.error("fatal: %s", self._fatal)
                return 2
            self.workers.on_death = lambda reason: loop.call_soon_threadsafe(self._worker_died, reason)
        if s.mode == "core":
            self.sources[:] = [CoreSource(src, s.batch, self.intake, self.metrics, s.nats) for src in s.sources]
        else:
            self.sources = list(JetStreamSource.for_settings(s, self.metrics))
        try:
            started = await asyncio.gather(*(src.start(self._stopping) for src in self.sources))
        except JetStreamSetupError as exc:
            self._fatal = str(exc)
            log.error("fatal: %s", exc)
            # Ends the other sources' start-up waits; closing our connections now is no outage
            # (without it, each close was logged as "NATS connection closed" at ERROR).
            self._stopping.set()
            return 2
        if not all(started):
            return 0  # stopped while connecting
        if self.exchange is not None and not await self.exchange.attach(
                getattr(self.sources[0], "nc", None), s,
                self.wholeness.streams if self._may_vouch or self.router is not None else None):
            self.exchange = self.router = None
        if isinstance(self.router, JetStreamRouter):  # the peers' evidence of this bridge's traces, kept late
            jetstream_loop.catch_up(self, [x.hold_closes for x in self.sources if isinstance(x, JetStreamSource)])
        self._started = True
        log.info("bridge running", extra={"fields": {"version": __version__, "core": engine.implementation(),
                                                     "mode": s.mode, "sources": [x.name for x in s.sources],
                                                     "exporters": [e.name for e in self._exporters]}})
        if s.mode == "core":
            workers, self._line = core_loop.tasks(self)
        else:
            js_sources = [src for src in self.sources if isinstance(src, JetStreamSource)]
            workers = [asyncio.create_task(jetstream_loop.run(self, src)) for src in js_sources]
            if isinstance(self.router, JetStreamRouter):  # what the other bridges forward here
                workers.append(asyncio.create_task(jetstream_loop.run(self, js_sources[0], forwarded=True)))
        try:
            await asyncio.wait_for(self._stopping.wait(), s.max_runtime)
        except TimeoutError:
            log.info("max runtime reached: draining")
            self._stopping.set()
        code = await self._drain(workers)
        return 2 if self._fatal else code

    async def _drain(self, workers: list[asyncio.Task[None]]) -> int:
        """Stop intake, flush what was received, settle it; bounded by `drain_timeout`."""
        started = time.monotonic()
        self._drain_deadline = started + self.settings.drain_timeout
        if self.router is not None and self.exchange is not None:
            window = self.settings.link.wait + self.settings.batch.max_delay  # forwards still on their way
            await self.router.depart(self.exchange.bye, min(window, self._drain_deadline - time.monotonic()))
        for source in self.sources:
            if isinstance(source, CoreSource):
                await source.stop_intake()
        self._intake_done = True
        self.intake.stop_waiting()  # the batcher, waiting for a first delivery, stops waiting
        remaining = max(0.1, self._drain_deadline - time.monotonic())
        done, pending = await asyncio.wait(workers, timeout=remaining + _DRAIN_GRACE_S)
        for task in pending:
            task.cancel()
        if pending:  # gone once cancelled (their waits end at once): then what they held is counted
            await asyncio.wait(pending, timeout=_DRAIN_GRACE_S)
            if self._line is not None:  # core mode: what waits in the link window's line
                self._drain_lost(self._line.left_waiting())
        for task in done:
            if task.exception() is not None:
                log.error("worker failed", exc_info=task.exception())
        if isinstance(self.router, JetStreamRouter):  # the answers to its forwards, and its own answers
            await self.router.finish(self._drain_deadline + _DRAIN_GRACE_S)
        self._drop_waiting()
        if pending or self._drain_overran:
            log.error("drain timed out; unexported messages were dropped (JetStream redelivers them)",
                      extra={"fields": {"in_flight_batches": len(pending)}})
            return 1
        log.info("drained", extra={"fields": {"seconds": round(time.monotonic() - started, 3)}})
        return 0

    def _deadline(self) -> float | None:
        return getattr(self, "_drain_deadline", None) if self._intake_done else None

    @property
    def _inflight(self) -> int:
        """Batches processed at once: one converted while `exports_in_flight` are exported
        (each worker process the same, with workers)."""
        per_converter = 1 + self.settings.batch.exports_in_flight
        return per_converter if self.workers is None else per_converter * self.workers.size

    async def _process(self, deliveries: Sequence[Delivery], raws: list[RawTraceMessage],
                       holdable: frozenset[int] = frozenset()
                       ) -> tuple[list[Delivery], list[Delivery], list[Delivery], list[Delivery]]:
        """Convert, export, count one batch (`raws`: its deliveries' raw messages, as
        `_observe` took them); returns what to (ack, nak, term, hold) (JetStream mode,
        `holdable`: `JetStreamSource.holdable`; core mode settles nothing: empty)."""
        if self.workers is None:
            if self.vouching:  # how far each stream is known whole; which peers left; the peers' word
                self.processor.whole(self.wholeness.streams(),
                                     None if self.exchange is None else self.wholeness.departures(),
                                     () if self.router is None else self.router.take_states())
            converted = await run_on_lane(self._pool, self.processor.convert, raws, holdable,
                                          inline=len(raws) <= self._inline_limit)
            outcome = await asyncio.get_running_loop().run_in_executor(
                self._export_pool, self.processor.export, converted, self._deadline())
            self.accounting.account(outcome)
            gc_tuning.after_batch()
            return self._policy(deliveries, outcome)
        settled: tuple[list[Delivery], ...] = ([], [], [], [])
        for positions, result in await self.workers.process(raws, self._deadline(), holdable):
            part = [deliveries[p] for p in positions]
            if isinstance(result, BaseException):
                result = self._failed_batch(part, result)
            else:
                self.accounting.account(result)
            for kept, decided in zip(settled, self._policy(part, result), strict=True):
                kept += decided
        gc_tuning.after_batch()
        ack, nak, term, hold = settled
        return ack, nak, term, hold

    def _worker_died(self, reason: str) -> None:
        """A worker process crashed or was killed: stop (exit code 2) so that a supervisor
        restarts the whole bridge; JetStream redelivers what was not acked, core mode counts
        what the drain cannot export."""
        if not self._fatal:
            self._fatal = reason
            log.error("fatal: %s; stopping", reason)
            self.request_stop()

    def _failed_batch(self, part: Sequence[Delivery], exc: BaseException) -> BatchOutcome:
        """A sub-batch whose worker failed: as if its export failed (JetStream redelivers it)."""
        if isinstance(exc, WorkerDied):
            self._worker_died(str(exc))
        else:
            log.error("worker failed a batch", extra={"fields": {"error": str(exc)}})
        self.metrics.export_failures.labels("worker").inc()
        failed = ExportResult(False, error=str(exc), retryable=True)
        return BatchOutcome([Converted([]) for _ in part], {"worker": failed}, spans=0)

    # -- the link window: observe on arrival, map `link.wait` later ------------------------

    async def _observe(self, deliveries: Sequence[Delivery], raws: list[RawTraceMessage],
                       collected_ns: int | None = None) -> float:
        """Record the hop evidence of just-arrived messages (`raws`: their raw messages, made
        once per batch and kept for `_process`); returns when they may be mapped.

        Trace messages of one traced message arrive in any order (a downstream server's
        often before its upstream's): mapping waits `link.wait`, so that both sides of a
        hop are known when the downstream span's parent is decided (core/linking.py)."""
        if self.workers is None:
            # Vouching (`vouching`): its ledger, and its peers', may vouch for the gaps in the
            # servers' numbers (`ReportLedger.vouch`, `wholeness`); not a JetStream consumer
            # (redeliveries come out of order).
            received: list[tuple[str, int] | None] | None = None
            streams = None
            # Trace ownership: no evidence to publish (JetStream mode: to the kept stream only);
            # a report forwarded with breaks -1 vouches for nothing.
            sender = (None if self.exchange is None or (self.router is not None and self.exchange.kept_subject is None)
                      else self.exchange.sender)
            if self.vouching:
                received = [(d.source, d.breaks) if d.breaks >= 0 else None for d in deliveries]
                streams = self.wholeness.streams(collected_ns) if sender is not None else None
            shared = await run_on_lane(self._pool, self.processor.observe, raws, sender, received, streams,
                                       inline=len(raws) <= self._inline_limit)
            # What the batch's observation holds through the link window is not walked again
            # by the collector (`gc_tuning`): ~80-100 ms of collections per 60k burst else.
            gc_tuning.after_batch()
            if shared and self.exchange is not None:
                await self.exchange.publish(shared)
        else:
            self.workers.observe(raws)
        # On a read tick: the window closes in a wake-up the reads need anyway.
        return tick_at_or_after(time.monotonic() + self.settings.link.wait, self.settings.nats.read_interval)

    @property
    def _may_vouch(self) -> bool:
        """Core mode, one process: it sees the reports routed to it in order, but for its losses."""
        return self.settings.mode == "core" and self.workers is None

    @property
    def vouching(self) -> bool:
        """`_may_vouch`, and now: while it knows its queue group's members (`members_known`)."""
        return self._may_vouch and members_known(self.exchange, self.settings.queue_group)

    async def _until(self, ripe_at: float) -> None:
        """Sleep until `ripe_at`; not at all once draining (what arrived is observed), but with
        trace ownership (the peers' forwards, and their word, hold only a link window later)."""
        assert self._stopping is not None
        left = ripe_at - time.monotonic()
        if left > 0 and self.router is not None:
            deadline = self._deadline()
            await asyncio.sleep(left if deadline is None else max(0.0, min(left, deadline - time.monotonic())))
        elif left > 0 and not self._stopping.is_set():
            try:
                await asyncio.wait_for(self._stopping.wait(), left)
            except TimeoutError:
                pass

    def _draining(self) -> bool:
        """The intake is done (stopping): what waits goes out without waiting for more."""
        return self._intake_done

    def _past_deadline(self) -> bool:
        deadline = self._deadline()
        return deadline is not None and time.monotonic() >= deadline

    def _drop_waiting(self) -> None:
        """The drain ran out of time: what still waits in the intake is lost; count it."""
        self._drain_lost([self.intake.take(self.intake.qsize())])

    def _drain_lost(self, batches: Iterable[Sequence[Delivery]]) -> None:
        """Messages the drain ran out of time for (in the intake, in the link window's line,
        or held by a worker cancelled after the grace): their room in the intake freed, and
        counted lost, in one count and one log line."""
        lost = 0
        for batch in batches:
            self.intake.release(batch)
            lost += len(batch)
        if lost:
            self._drain_overran = True
            self.metrics.dropped.labels("drain_timeout").inc(lost)
            log.error("drain timed out: trace messages still waiting were dropped",
                      extra={"fields": {"dropped": lost, "reason": "drain_timeout"}})

    async def _collect(self, on_first: Callable[[], None] | None = None) -> list[Delivery]:
        """Up to `max_messages` deliveries; waits at most `max_delay` after the first (draining:
        none), and for the first until it comes or the drain begins (`Intake.stop_waiting`: an
        idle bridge does not poll). `on_first`: as the first is taken (core mode:
        `Wholeness.collecting`)."""
        b = self.settings.batch
        return await self.intake.collect(b.max_messages, lambda: 0 if self._intake_done else b.max_delay,
                                         None, on_first or self.wholeness.collecting)

    # -- the error policy, in one place ------------------------------------------------------

    def _policy(self, deliveries: Sequence[Delivery], outcome: BatchOutcome
                ) -> tuple[list[Delivery], list[Delivery], list[Delivery], list[Delivery]]:
        """Each delivery's fate (`policy.settle`). Core mode settles nothing: what a JetStream
        bridge would nak is lost there, and counted (`dropped{reason="export_failed"}`)."""
        if self.settings.mode != "core":
            return settle(deliveries, outcome)
        if not outcome.exported:
            nak = settle(deliveries, outcome)[1]
            if nak:
                self.metrics.dropped.labels("export_failed").inc(len(nak))
        return [], [], [], []
