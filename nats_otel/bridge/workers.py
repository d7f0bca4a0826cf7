"""Worker processes for the bridge (`batch.workers` > 1): decode, map, encode and export
off the event loop's process, so one bridge uses more than one core.

Each worker is a spawned process running the same `Processor` as the one-thread bridge
(its own `Converter`, exporters and gRPC channel). The parent only receives, routes and
settles. A batch is split by `sharding.shard_key` - the traceparent's trace id, or the
arrival subject for ad-hoc traces and unusable traceparents - so every message of one trace goes
to the same worker, in arrival order, and each worker's linker sees all of them (hop
evidence first, `observe`, then the batch `link.wait` later). A worker answers each
sub-batch with a slim `BatchOutcome` (results without span records, the export results),
so JetStream acks still follow the export.

Pipes carry plain tuples both ways (subject, headers, payload, received_at in; packed
results out): pickling one dataclass per message cost more than converting it. Each
message goes over once, when it is observed: `process` names the observed sub-batch by a
token (the parent's share of the work is what limits `--workers` on few cores). A sender
thread per worker writes them, a reader thread resolves the asyncio futures, so the event
loop never blocks on a full pipe.

Workers are started with the `spawn` method (no inherited sockets, locks or gRPC state), so
a program embedding `Bridge` with workers must guard its entry point with
`if __name__ == "__main__":` (the `nats-otel` CLI does).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import multiprocessing
import os
import queue
import signal
import threading
import zlib
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from nats_otel import gc_tuning
from nats_otel.bridge import cpu_affinity
from nats_otel.bridge.processor import BatchOutcome, ConvertedBatch, Processor, make_exporters
from nats_otel.bridge.settings import BridgeSettings
from nats_otel.bridge.sharding import evidence_shard, shard_key
from nats_otel.core import engine
from nats_otel.core.decode import DecodeLimits, RawTraceMessage
from nats_otel.core.evidence import HopEvidence, LinkLatencyEstimate, decode_batch_with_latencies, encode_batch
from nats_otel.core.network import HopSample, NetworkSample
from nats_otel.core.pipeline import Converted, Rejected

__all__ = ["WorkerDied", "WorkerPool"]

log = logging.getLogger("nats_otel.bridge.workers")

_READY = "ready"
_OBSERVE = "observe"  # a message that only records hop evidence: no answer
_EVIDENCE = "evidence"  # a worker's (evidence batch for the exchange, event numbers for its siblings)
_RECORD = "record"  # other bridges' evidence, for a worker
_NUMBERS = "numbers"  # a sibling worker's event numbers, for a worker's ledger
# Observed sub-batches are sent once: `process` names them by token. The parent remembers
# this many observed batches (older ones are sent whole again), a worker more, so that
# every token the parent sends is still there.
_OBSERVED_KEPT = 4096
_WORKER_KEPT = 2 * _OBSERVED_KEPT
_START_TIMEOUT_S = 60.0


class WorkerDied(RuntimeError):
    """A worker process exited (crash, OOM kill) with batches outstanding."""


# --------------------------------------------------------------------------- the child side


def _worker_main(settings_doc: dict[str, Any], index: int, inbox: Any, outbox: Any, workers: int = 1,
                 sender: str = "", cpus: frozenset[int] | None = None) -> None:
    """A worker process: a `Processor` fed sub-batches until it reads None (or EOF).

    Each worker sees its shard of the traces, but deciding a crowded hop in order needs
    every report a server published (`report_ledger`): so each observed sub-batch's event
    numbers go back to the parent, which hands them to the sibling workers (`_NUMBERS`,
    with the latencies learned here), and so does its evidence with the link exchange
    (`sender`: its name), which the parent publishes; other bridges' evidence (`_RECORD`)
    is recorded whole by the worker of its trace and in the ledger by the others.

    As in the one-process bridge, batches are exported in `batch.exports_in_flight` threads
    while the next one is converted (no more at once: what waits is bounded); those threads
    write the answers, one at a time (`answering`)."""
    # The parent decides when to stop (it drains first); a Ctrl-C to the process group
    # or a stray SIGTERM must not kill a worker in the middle of a batch.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    cpu_affinity.apply(cpus)  # `batch.cpu_affinity`, before this process starts a thread
    settings = BridgeSettings.model_validate(settings_doc)
    processor = Processor(settings, make_exporters(settings))
    if workers > 1:  # the ledger numbers every worker's reports (the window holds this one's)
        processor.converter.linker.index.sequences.ledger.capacity = settings.link.capacity * workers
    gc_tuning.tune_gc_for_throughput()
    outbox.send((_READY, engine.implementation()))  # the parent logs which core each worker runs
    observed: dict[int, list[RawTraceMessage]] = {}
    in_flight = settings.batch.exports_in_flight
    exports = ThreadPoolExecutor(max_workers=in_flight, thread_name_prefix="nats-otel-export")
    exporting: deque[Future[None]] = deque()
    answering = threading.Lock()
    try:
        while True:
            try:
                message = inbox.recv()
            except EOFError:
                return  # the parent is gone
            if message is None:
                return
            if message[0] == _OBSERVE:
                _, token, items = message
                raws = observed[token] = [RawTraceMessage(*item) for item in items]
                shared = processor.observe(raws, sender or None)
                numbers = processor.report_numbers(raws) if workers > 1 else b""
                gc_tuning.after_batch()  # what the window holds is not walked again (as after a conversion)
                if shared or numbers:
                    with answering:
                        outbox.send((_EVIDENCE, (shared, numbers)))
                if len(observed) > _WORKER_KEPT:
                    del observed[next(iter(observed))]
                continue
            if message[0] == _NUMBERS:
                processor.observe_numbers(message[1])
                continue
            if message[0] == _RECORD:
                # Other bridges' (checked by the parent's `LinkExchange`, re-encoded there):
                # every report goes into the ledger, those of this worker's traces (and ad-hoc
                # ones) into the link window too.
                _, reports, latencies = decode_batch_with_latencies(message[1])
                processor.observe_evidence([r for r in reports if evidence_shard(r, workers) in (None, index)],
                                           latencies)
                processor.observe_ledger(reports)
                continue
            batch_id, items, deadline, holdable = message
            converted: ConvertedBatch | str
            try:
                # A token names a sub-batch observed earlier (sent once); else the items themselves.
                raws = observed.pop(items) if isinstance(items, int) else [RawTraceMessage(*item) for item in items]
                converted = processor.convert(raws, holdable)
            except Exception as exc:  # noqa: BLE001 - reported to the parent, which fails the batch
                converted = f"worker {index}: {type(exc).__name__}: {exc}"
            while len(exporting) >= in_flight or (exporting and exporting[0].done()):
                exporting.popleft().result()
            exporting.append(exports.submit(_export_and_answer, processor, batch_id, converted, deadline,
                                            outbox, answering, index))
    finally:
        exports.shutdown(wait=True)
        processor.close()


def _export_and_answer(processor: Processor, batch_id: int, converted: ConvertedBatch | str,
                       deadline: float | None, outbox: Any, answering: threading.Lock, index: int) -> None:
    """Export a converted sub-batch and answer the parent (or pass on why it failed)."""
    answer: Any = converted
    if not isinstance(converted, str):
        try:
            outcome = processor.export(converted, deadline)
            # Span records stay here: the parent needs counts, issues and export results.
            answer = (_pack(outcome.results), outcome.exports, outcome.durations, outcome.evicted,
                      outcome.expired_unmatched, outcome.span_count, outcome.poisoned, outcome.held, outcome.handed)
        except Exception as exc:  # noqa: BLE001 - reported to the parent, which fails the batch
            answer = f"worker {index}: {type(exc).__name__}: {exc}"
    with answering:  # one writer at a time on the pipe
        outbox.send((batch_id, answer))
    gc_tuning.after_batch()


def _pack(results: Sequence[Converted | Rejected]) -> list[Any]:
    """Results as plain values (pickling 500 dataclasses cost more than converting them):
    (network sample as a tuple) for an origin report without issues, (issues, link, network)
    for a downstream or odd one, the `Rejected` itself for a rejection (rare)."""
    out: list[Any] = []
    for r in results:
        if isinstance(r, Rejected):
            out.append(r)
        elif r.issues or r.link:
            out.append((r.issues, r.link, _plain(r.network)))
        else:
            out.append((_plain(r.network),))
    return out


def _plain(network: NetworkSample | None) -> tuple[Any, ...] | None:
    if network is None:
        return None
    hop = network.hop
    return (*network[:5], None if hop is None else tuple(hop), *network[6:])


def _sample(plain: tuple[Any, ...] | None) -> NetworkSample | None:
    if plain is None:
        return None
    hop = plain[5]
    return NetworkSample(plain[0], plain[1], plain[2], plain[3], plain[4],
                         None if hop is None else HopSample(*hop), *plain[6:])


def _unpack(packed: Sequence[Any]) -> list[Converted | Rejected]:
    out: list[Converted | Rejected] = []
    for p in packed:
        if isinstance(p, Rejected):
            out.append(p)
        elif len(p) == 1:
            out.append(Converted([], [], "", _sample(p[0])))
        else:
            out.append(Converted([], p[0], p[1], _sample(p[2])))
    return out


def _outcome(message: tuple[Any, ...]) -> Any:
    packed, exports, durations, evicted, expired_unmatched, spans, poisoned, held, handed = message
    return BatchOutcome(_unpack(packed), exports, durations, evicted, expired_unmatched, spans, poisoned, held,
                        handed)


# --------------------------------------------------------------------------- the parent side


def _item(raw: RawTraceMessage) -> tuple[Any, ...]:
    return (raw.subject, raw.headers, raw.payload, raw.received_at)


class _Worker:
    """One worker process with its pipes, sender thread and reader thread."""

    def __init__(self, ctx: Any, settings_doc: dict[str, Any], index: int, on_death: Callable[[str], object],
                 workers: int, sender: str, on_evidence: Callable[[int, tuple[bytes, bytes]], object]) -> None:
        self.index = index
        self._on_death = on_death
        self._on_evidence = on_evidence
        self._closing = False
        child_in, self._to_child = ctx.Pipe(duplex=False)
        self._from_child, child_out = ctx.Pipe(duplex=False)
        self.process = ctx.Process(target=_worker_main, name=f"nats-otel-worker-{index}", daemon=True,
                                   args=(settings_doc, index, child_in, child_out, workers, sender,
                                         cpu_affinity.worker_cpus(index)))
        self.process.start()
        child_in.close()
        child_out.close()
        self._outgoing: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._pending: dict[int, Future[Any]] = {}
        self._lock = threading.Lock()
        self.dead = False
        self.implementation = "unknown"  # which core the worker runs: told in its ready message

    def wait_ready(self, timeout: float) -> None:
        if not self._from_child.poll(timeout):
            raise WorkerDied(f"worker {self.index} did not start within {timeout:.0f}s")
        try:
            first = self._from_child.recv()
        except EOFError:
            raise WorkerDied(f"worker {self.index} exited while starting (code {self.process.exitcode})") from None
        if not (isinstance(first, tuple) and first[0] == _READY):
            raise WorkerDied(f"worker {self.index} sent {first!r} instead of ready")
        self.implementation = first[1]
        threading.Thread(target=self._send_loop, name=f"nats-otel-worker-{self.index}-tx", daemon=True).start()
        threading.Thread(target=self._recv_loop, name=f"nats-otel-worker-{self.index}-rx", daemon=True).start()

    def submit(self, batch_id: int, items: list[tuple[Any, ...]] | int, deadline: float | None,
               holdable: frozenset[int]) -> Future[Any]:
        future: Future[Any] = Future()
        with self._lock:
            if self.dead:
                future.set_exception(WorkerDied(f"worker {self.index} is not running"))
                return future
            self._pending[batch_id] = future
        self._outgoing.put((batch_id, items, deadline, holdable))
        return future

    def send_observe(self, token: int, items: list[tuple[Any, ...]]) -> None:
        if not self.dead:
            self._outgoing.put((_OBSERVE, token, items))

    def send_evidence(self, kind: str, data: bytes) -> None:
        """`_RECORD` other bridges' evidence, or `_NUMBERS` a sibling's event numbers."""
        if not self.dead:
            self._outgoing.put((kind, data))

    def _send_loop(self) -> None:
        while True:
            message = self._outgoing.get()
            try:
                self._to_child.send(message)
            except (OSError, ValueError):
                self._fail_all()
                return
            if message is None:
                return

    def _recv_loop(self) -> None:
        while True:
            try:
                batch_id, result = self._from_child.recv()
            except (EOFError, OSError):
                self._fail_all()
                return
            if batch_id == _EVIDENCE:
                self._on_evidence(self.index, result)
                continue
            with self._lock:
                future = self._pending.pop(batch_id, None)
            if future is None or not future.set_running_or_notify_cancel():
                continue  # cancelled meanwhile (the drain timed out): nobody waits for it
            if isinstance(result, str):
                future.set_exception(RuntimeError(result))
            else:
                future.set_result(_outcome(result))

    def _fail_all(self) -> None:
        with self._lock:
            if self.dead:
                return
            self.dead = True
            pending, self._pending = self._pending, {}
        self.process.join(1)  # so that the exit code is known
        reason = f"worker {self.index} exited (code {self.process.exitcode})"
        for future in pending.values():
            if future.set_running_or_notify_cancel():
                future.set_exception(WorkerDied(reason))
        if not self._closing:
            self._on_death(reason)

    def close(self, timeout: float) -> None:
        self._closing = True
        self._outgoing.put(None)
        self.process.join(timeout)
        if self.process.is_alive():
            log.warning("worker did not stop in time; killing it", extra={"fields": {"worker": self.index}})
            self.process.kill()
            self.process.join(5)
        self._to_child.close()
        self._from_child.close()


class WorkerPool:
    """N worker processes; `process` shards a batch over them and returns per-worker outcomes."""

    def __init__(self, settings: BridgeSettings, workers: int) -> None:
        self.settings = settings
        self.size = workers
        self.limits = DecodeLimits(**settings.limits.model_dump())
        self._doc = settings.model_dump(mode="json")
        # Each worker sees only its shard of the traces, so its share of the link window
        # covers the same traces as one window of the full size (at 1/N the memory).
        self._doc["link"]["capacity"] = max(100, -(-settings.link.capacity // workers))
        self._ids = itertools.count()
        # Observed batches not yet processed: id of the first message -> (the messages, their
        # shards, each worker's token). `process` of the same batch sends only the tokens.
        self._observed: dict[int, tuple[Sequence[RawTraceMessage], list[list[int]], list[int | None]]] = {}
        self._workers: list[_Worker] = []
        #: Called (from a reader thread) when a worker dies other than by `close`: a crash or
        #: an OOM kill. The bridge stops on it, so that its supervisor restarts it.
        self.on_death: Callable[[str], object] = lambda reason: None
        #: The link exchange's sender name and its `publish_soon` (set before `start`):
        #: called with each worker's evidence batch (from a reader thread).
        self.sender = ""
        self.on_evidence: Callable[[bytes], object] = lambda batch: None

    def start(self) -> None:
        """Spawn the workers and wait until each has built its exporters (blocking)."""
        ctx = multiprocessing.get_context("spawn")
        try:
            self._workers = [_Worker(ctx, self._doc, i, self._died, self.size, self.sender, self._evidence)
                             for i in range(self.size)]
            for worker in self._workers:
                worker.wait_ready(_START_TIMEOUT_S)
        except BaseException:
            self.close(timeout=5)
            raise
        log.info("worker processes started", extra={"fields": {
            "workers": self.size, "pids": [w.process.pid for w in self._workers], "parent": os.getpid(),
            "core": [w.implementation for w in self._workers]}})

    def _evidence(self, index: int, shared: tuple[bytes, bytes]) -> None:
        """A worker's evidence to the exchange, its event numbers to its siblings."""
        evidence, numbers = shared
        if numbers:
            for worker in self._workers:
                if worker.index != index:
                    worker.send_evidence(_NUMBERS, numbers)
        if evidence:
            self.on_evidence(evidence)

    def record_evidence(self, reports: Sequence[HopEvidence], latencies: Sequence[LinkLatencyEstimate],
                        peer: object = None) -> None:
        """Hand other bridges' evidence (checked by the exchange) to every worker, re-encoded
        once: each records whole the reports of its traces (`evidence_shard`) and ad-hoc
        ones, the others in its ledger. (What the `peer`'s streams vouch for is not used:
        worker processes do not vouch, `wholeness`.)"""
        known = [(k.upstream, k.downstream, k.latency_ns, k.tolerance_ns) for k in latencies]
        batch = encode_batch("", reports, known)
        for worker in self._workers:
            worker.send_evidence(_RECORD, batch)

    def _died(self, reason: str) -> None:
        log.error("worker process died", extra={"fields": {"reason": reason}})
        self.on_death(reason)

    @property
    def alive(self) -> bool:
        return bool(self._workers) and not any(w.dead for w in self._workers)

    def pids(self) -> list[int]:
        return [w.process.pid for w in self._workers if w.process.pid is not None]

    def _shards(self, raws: Sequence[RawTraceMessage]) -> list[list[int]]:
        shards: list[list[int]] = [[] for _ in range(self.size)]
        for position, raw in enumerate(raws):
            shards[zlib.crc32(shard_key(raw, self.limits)) % self.size].append(position)
        return shards

    def observe(self, raws: Sequence[RawTraceMessage]) -> None:
        """Send messages that just arrived to their workers' linkers (no answer; the pipe
        keeps the order, so they are there before any later `process`)."""
        if not raws:
            return
        shards = self._shards(raws)
        tokens: list[int | None] = []
        for worker, positions in zip(self._workers, shards, strict=True):
            token = None
            if positions:
                token = next(self._ids)
                worker.send_observe(token, [_item(raws[p]) for p in positions])
            tokens.append(token)
        observed = self._observed
        observed[id(raws[0])] = (raws, shards, tokens)
        if len(observed) > _OBSERVED_KEPT:
            del observed[next(iter(observed))]

    def _recall(self, raws: Sequence[RawTraceMessage]) -> tuple[list[list[int]], list[int | None]] | None:
        """The shards and tokens of `raws` if they were observed as one batch (and not yet processed)."""
        entry = self._observed.pop(id(raws[0]), None) if raws else None
        if entry is None:
            return None
        seen, shards, tokens = entry
        if len(seen) != len(raws) or any(a is not b for a, b in zip(seen, raws, strict=True)):
            return None
        return shards, tokens

    async def process(self, raws: Sequence[RawTraceMessage], deadline: float | None,
                      holdable: frozenset[int] = frozenset()) -> list[tuple[list[int], Any]]:
        """(positions in `raws`, BatchOutcome or the exception) per worker that got some; the
        positions in `holdable` (JetStream mode) may be held (`BatchOutcome.held`, by the
        position in the worker's part)."""
        recalled = self._recall(raws)
        shards, tokens = recalled if recalled is not None else (self._shards(raws), [None] * self.size)
        futures = []
        for worker, positions, token in zip(self._workers, shards, tokens, strict=True):
            if not positions:
                continue
            items = token if token is not None else [_item(raws[p]) for p in positions]
            part_holdable = frozenset(i for i, p in enumerate(positions) if p in holdable) if holdable else holdable
            futures.append((positions, asyncio.wrap_future(worker.submit(next(self._ids), items, deadline,
                                                                         part_holdable))))
        out: list[tuple[list[int], Any]] = []
        for positions, future in futures:
            try:
                out.append((positions, await future))
            except Exception as exc:  # noqa: BLE001 - the caller's policy decides (a failed export)
                out.append((positions, exc))
        return out

    def close(self, timeout: float = 10.0) -> None:
        """Ask every worker to finish (they close their exporters), then reap them."""
        for worker in self._workers:
            worker.close(timeout)
        self._workers = []
