"""One batch through the bridge: archive the raw messages, convert, export.

Runs where the work is done: the loop's worker thread, or each worker process
(`workers.py`). Both the loop and the workers import it; it imports neither.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from nats_otel.archive import archive_record
from nats_otel.bridge.export.file import FileExporter
from nats_otel.bridge.export.otlp import make_otlp_exporter
from nats_otel.bridge.export.result import ExportResult
from nats_otel.bridge.observed_batches import ObservedBatches
from nats_otel.bridge.settings import BridgeSettings
from nats_otel.core import accel, engine
from nats_otel.core.decode import DecodeLimits, RawTraceMessage
from nats_otel.core.engine import Converter, encode_request, encode_results, observed, observed_entries
from nats_otel.core.evidence import (
    HopEvidence,
    LinkLatencyEstimate,
    PeerBatch,
    Streams,
    StreamState,
    encode_batch,
    encode_numbers,
    evidence_of,
    observe_evidence,
    observe_ledger,
    observe_numbers,
)
from nats_otel.core.mapping import DEFAULT_HEADER_ALLOWLIST, MappingOptions
from nats_otel.core.network import NetworkSample
from nats_otel.core.pipeline import Converted, Rejected
from nats_otel.core.records import SpanRecord

__all__ = ["BatchOutcome", "BytesExporter", "ConvertedBatch", "Exporter", "Processor", "log_core", "make_exporters"]

log = logging.getLogger("nats_otel.bridge.processor")


class Exporter(Protocol):
    name: str

    def export(self, spans: Sequence[SpanRecord], deadline: float | None = None) -> ExportResult: ...

    def close(self) -> None: ...


@runtime_checkable
class BytesExporter(Exporter, Protocol):
    """An exporter that also sends an already serialized export request (the OTLP ones)."""

    def export_bytes(self, request: bytes, deadline: float | None = None) -> ExportResult: ...


_UNLINKED = frozenset({"unmatched", "ambiguous"})
# Observed messages held through the link window (`ObservedBatches`), as many as the
# converter's own store keeps (`pending_capacity`): past it, the oldest are decoded again.
_HELD_MESSAGES = 200_000


@dataclass(slots=True)
class BatchOutcome:
    """What became of one batch: per message converted or rejected, and the export results."""

    #: Each message's result, in order (an `EncodedBatch` from `convert_encoded`: indexing it
    #: makes them, so the bridge's path reads `tally` and `spans` instead).
    results: Sequence[Converted | Rejected]
    exports: dict[str, ExportResult] = field(default_factory=dict)
    durations: dict[str, float] = field(default_factory=dict)
    #: Hop evidence the linker forgot early (its capacity bound), since the last batch.
    evicted: int = 0
    #: Hop sides the linker let go without their counterpart, by side, since the last batch.
    expired_unmatched: dict[str, int] = field(default_factory=dict)
    spans: int = -1  # set when the results no longer carry their spans (worker processes)
    #: Positions of messages whose spans a backend refused as invalid even when sent alone,
    #: with its error: never to be retried (terminated in JetStream mode), counted as lost.
    poisoned: dict[int, str] = field(default_factory=dict)
    #: Positions of downstream reports not linked while redeliveries may still bring their
    #: upstream's evidence (JetStream mode, after a start): not exported, redelivered later.
    held: frozenset[int] = frozenset()
    #: Messages (batches, for "request") the compiled kernel handed whole to the pure-Python
    #: reference since the last batch, by stage (`engine.handed_to_reference`): what it does
    #: not take. Empty on the pure-Python core, which hands nothing on.
    handed: dict[str, int] = field(default_factory=dict)
    #: What accounting counts of the results (`tally_results`), when the conversion counted
    #: it already (`convert_encoded`); None: counted from the results.
    tally: tuple[int, dict[str, int], list[str], list[NetworkSample]] | None = None
    #: The `Rejected` among the results, with `tally`: logged without the results made.
    rejected: list[Rejected] | None = None

    @property
    def span_count(self) -> int:
        if self.spans >= 0:
            return self.spans
        return sum(r.span_count for r in self.results if isinstance(r, Converted))

    @property
    def exported(self) -> bool:
        """True when every exporter took the spans (or there were none to send)."""
        return all(r.ok for r in self.exports.values())


@dataclass(frozen=True, slots=True)
class ConvertedBatch:
    """A converted batch waiting for its export: the outcome so far, and what to send (one
    serialized export request, or span records for exporters that take records)."""

    outcome: BatchOutcome
    payload: bytes | list[SpanRecord]


class Processor:
    """Archive, convert, export one batch: `observe` and `convert` on the event loop's
    thread where the compiled kernel runs and nothing is archived, else in the conversion
    thread but for a small batch (`processor_lane`), one thread at a time either way;
    `export` in an export thread. Never raises for input."""

    def __init__(self, settings: BridgeSettings, exporters: Sequence[Exporter], release_payloads: bool = False) -> None:
        allow = DEFAULT_HEADER_ALLOWLIST | {h.lower() for h in settings.allow_headers}
        limits = DecodeLimits(**settings.limits.model_dump())
        self.converter = Converter(MappingOptions(settings.service_name, allow), limits, settings.link.core())
        self.exporters = list(exporters)
        # When every exporter sends serialized requests (OTLP), messages are mapped straight
        # into protobuf (`span_bytes`: no span records, the compiled core's fast path); the
        # file exporter needs span records.
        self._encoded = bool(self.exporters) and all(isinstance(e, BytesExporter) for e in self.exporters)
        # Unbuffered, one write per batch: atomic with O_APPEND, so worker processes can share it.
        self._archive = open(settings.archive, "ab", buffering=0) if settings.archive else None  # noqa: SIM115
        self._evicted_seen = 0
        self._expired_seen: dict[str, int] = {}
        # The kernel counts per process: from here on, this processor's (one per process in the bridge).
        self._handed_seen: dict[str, int] = engine.handed_to_reference()
        self.implementation = log_core()
        # What `observe` decoded, held until `convert` (the link window): see observed_batches;
        # there too why a caller that reads no payload after `observe` (`release_payloads`)
        # has them released, unless archived (the archive is written at `convert`).
        self._observed = ObservedBatches(self.converter, _HELD_MESSAGES, release_payloads and self._archive is None)

    def observe(self, raws: Sequence[RawTraceMessage], sender: str | None = None,
                received: Sequence[tuple[str, int] | None] | None = None, streams: Streams | None = None) -> bytes:
        """Record the hop evidence of messages that just arrived (mapped `link.wait` later);
        with the exchange's `sender` name, also the batch of it to publish for the other
        bridges (with the link latencies learned here). `received`: each message's stream and
        its stream's losses before it, when this process receives every report of its
        streams in order: the ledger then vouches for the gaps in the servers' numbers
        (`ReportLedger.vouch`), as it observes each report, and so do the peers, told what
        `streams` say of themselves (`wholeness.Wholeness.streams`)."""
        now = time.monotonic()
        observe_held, release = self.converter.observe_held, self._observed.released
        if received is None or not raws:
            entries = observe_held(raws, now, release)
        else:
            ledger = self.converter.linker.index.sequences.ledger
            try:
                if received.count(received[0]) == len(received):  # the common case: one stream, no loss
                    ledger.receiving = received[0]
                    entries = observe_held(raws, now, release)
                else:  # in runs of one stream and one count of losses, in arrival order
                    entries, start = [], 0
                    for end in range(1, len(raws) + 1):
                        if end == len(raws) or received[end] != received[start]:
                            ledger.receiving = received[start]
                            entries += observe_held(raws[start:end], now, release)
                            start = end
            finally:
                ledger.receiving = None
        self._observed.put(entries)
        if sender is None:
            return b""
        states = [StreamState(name, *state) for name, state in (streams or {}).items()]
        if received is None or not states:
            reports = [evidence_of(p) for _, p in observed_entries(entries)]
        else:
            index = {state.name: at for at, state in enumerate(states)}
            reports = [evidence_of(p) if (got := received[at]) is None
                       else evidence_of(p, index.get(got[0], -1), got[1])
                       for at, p in observed_entries(entries)]
        return encode_batch(sender, reports, self.link_latencies(), states) if reports else b""

    def whole(self, streams: Streams, departures: tuple[float, int] | None = None,
              peers: Sequence[tuple[PeerBatch, bool]] = ()) -> None:
        """What each receiving stream says of its completeness (`ReportLedger.whole`); with
        `departures` (`Wholeness.departures`), the peers fallen silent have left. `peers`: the
        peers' latest heartbeats (trace ownership: `Router.take_states`), each with whether
        the peer routes as this bridge does: then it vouches as it says; else (another view of
        the members) it vouches for nothing until it does."""
        linker = self.converter.linker
        ledger = linker.index.sequences.ledger
        now = time.monotonic()
        for peer, sure in peers:
            if sure:
                observe_evidence(linker, (), now, peer.latencies, peer)
            else:
                for state in peer.streams:
                    ledger.whole(f"{peer.sender}/{state.name}", None, None, None, now, local=False)
        for stream, (breaks, since_ns, until_ns) in streams.items():
            ledger.whole(stream, breaks, since_ns, until_ns, now)
        if departures is not None:
            for peer_name in ledger.depart_silent(*departures):
                log.info("link evidence peer left (silent)", extra={"fields": {"peer": peer_name}})
            ledger.forget_departed(time.time_ns() - int(ledger.retention_s * 2e9))

    def observe_evidence(self, reports: Sequence[HopEvidence], latencies: Sequence[LinkLatencyEstimate] = (),
                         peer: PeerBatch | None = None) -> None:
        """Record other bridges' hop evidence (the link exchange), in this thread."""
        observe_evidence(self.converter.linker, reports, time.monotonic(), latencies, peer)

    def observe_ledger(self, reports: Sequence[HopEvidence]) -> None:
        """Record only the event numbers of reports whose traces another worker links."""
        observe_ledger(self.converter.linker, reports, time.monotonic())

    def report_numbers(self, raws: Sequence[RawTraceMessage]) -> bytes:
        """The event numbers of just-observed messages, for the sibling worker processes."""
        entries = self._observed.peek(raws)
        decoded = observed(self.converter, raws) if entries is None else [p for _, p in observed_entries(entries)]
        return encode_numbers(decoded, self.link_latencies())

    def observe_numbers(self, data: bytes) -> None:
        """Record a sibling worker's `report_numbers` (its latencies where none is known)."""
        observe_numbers(self.converter.linker, data, time.monotonic())

    def link_latencies(self) -> list[tuple[str, str, int, int]]:
        """The link latencies this bridge learned (shared with the evidence)."""
        return self.converter.linker.index.sequences.latency.known()

    def process(self, raws: Sequence[RawTraceMessage], deadline: float | None) -> BatchOutcome:
        """Convert and export one batch (`convert`, then `export`, in this thread)."""
        return self.export(self.convert(raws), deadline)

    def convert(self, raws: Sequence[RawTraceMessage], holdable: frozenset[int] = frozenset()) -> ConvertedBatch:
        """Archive and convert one batch: the part that touches the link state, so always in
        one thread, in order. `export` may then run in another thread while the next batch
        is converted: the conversion never waits for a backend's answer. Of the positions in
        `holdable`, the downstream reports left unlinked are held (`BatchOutcome.held`)."""
        if self._archive is not None:
            self._archive.write(b"".join(archive_record(raw) for raw in raws))
        now = time.monotonic()
        encoded = self._encoded
        # As observed (`observe`), whole batches in order: their entries given back; else
        # (`take` gave them to the converter) the converter finds each message's.
        entries = self._observed.take(raws)
        if encoded and entries is not None and not holdable:
            # The bridge's path: straight into one request, counted as converted; no record a
            # message unless something asks for the results (`EncodedBatch`).
            batch = self.converter.convert_encoded(raws, now, entries)
            outcome = BatchOutcome(batch, spans=batch.spans, rejected=batch.rejected,
                                   tally=(batch.decoded, batch.links, batch.issues, batch.samples))
            self._note_state(outcome)
            return ConvertedBatch(outcome, batch.request)
        results = self.converter.convert_many(raws, now, encoded, entries)
        if entries is None:  # rare: a batch split or reordered, or held past the bound
            self._observed.name_released(raws, results)
        outcome = BatchOutcome(results)
        self._note_state(outcome)
        if holdable:
            outcome.held = frozenset(i for i in holdable if i < len(results)
                                     and getattr(results[i], "link", "") in _UNLINKED)
        held = outcome.held
        if encoded:
            request, outcome.spans = encode_results(results, held)
            return ConvertedBatch(outcome, request)
        spans = [s for i, r in enumerate(results) if isinstance(r, Converted) and i not in held
                 for s in r.spans]
        outcome.spans = len(spans)
        return ConvertedBatch(outcome, spans)

    def _note_state(self, outcome: BatchOutcome) -> None:
        """What the link index and the kernel did since the last batch, into `outcome`."""
        index = self.converter.linker.index
        outcome.evicted, self._evicted_seen = index.evicted - self._evicted_seen, index.evicted
        outcome.expired_unmatched = {side: count - self._expired_seen.get(side, 0)
                                     for side, count in index.expired_unmatched.items()}
        self._expired_seen = dict(index.expired_unmatched)
        handed = engine.handed_to_reference()
        if handed != self._handed_seen:  # rare: the kernel takes what servers send
            outcome.handed = {stage: count - self._handed_seen.get(stage, 0) for stage, count in handed.items()
                              if count != self._handed_seen.get(stage, 0)}
            self._handed_seen = handed

    def export(self, batch: ConvertedBatch, deadline: float | None) -> BatchOutcome:
        """Send a converted batch to every exporter (isolating what a backend refuses as
        invalid); its outcome gets the export results. Runs in up to `batch.exports_in_flight`
        threads at once (the exporters are thread-safe)."""
        outcome, payload = batch.outcome, batch.payload
        if outcome.spans:
            for exporter in self.exporters:
                started = time.monotonic()
                if isinstance(payload, bytes):  # only when every exporter takes bytes (`_encoded`)
                    assert isinstance(exporter, BytesExporter)
                    result = exporter.export_bytes(payload, deadline)
                else:
                    result = exporter.export(payload, deadline)
                if result.invalid:
                    result = self._isolate(exporter, outcome, result, deadline)
                outcome.exports[exporter.name] = result
                outcome.durations[exporter.name] = time.monotonic() - started
        return outcome

    @staticmethod
    def _isolate(exporter: Exporter, outcome: BatchOutcome, failed: ExportResult,
                 deadline: float | None) -> ExportResult:
        """The backend refused the batch's content (HTTP 400, INVALID_ARGUMENT): send it again
        message by message, so that one bad message costs only itself. OTLP forbids retrying a
        refused request, so the messages refused alone are `poisoned`; the rest count as
        exported. Rare, so a request per message is affordable."""
        attempts, refused_spans = failed.attempts, 0
        for position, result in enumerate(outcome.results):
            if (not isinstance(result, Converted) or not result.span_count or position in outcome.poisoned
                    or position in outcome.held):
                continue
            if result.encoded is not None and isinstance(exporter, BytesExporter):
                alone = exporter.export_bytes(encode_request([result.encoded]), deadline)
            else:
                alone = exporter.export(result.spans, deadline)
            attempts += alone.attempts
            if alone.ok:
                refused_spans += alone.rejected_spans
            elif alone.invalid:
                outcome.poisoned[position] = alone.error
                refused_spans += result.span_count
            else:  # now the backend is down: the whole batch again later (duplicates are fine)
                return dataclasses.replace(alone, attempts=attempts)
        return ExportResult.success(attempts, refused_spans)

    def close(self) -> None:
        for exporter in self.exporters:
            exporter.close()
        if self._archive is not None:
            self._archive.close()


def log_core() -> str:
    """Log which core converts in this process (at start, by the bridge and each worker's parent);
    a warning when the compiled core was expected but could not be imported."""
    implementation = engine.implementation()
    fields: dict[str, object] = {"implementation": implementation, "pid": os.getpid()}
    if implementation == "compiled" or accel.NO_EXTENSIONS:
        log.info("core implementation", extra={"fields": fields | {"forced_python": accel.NO_EXTENSIONS}})
    else:
        log.warning("the compiled core is not available: converting with the pure-Python core (correct, slower)",
                    extra={"fields": fields | {"unavailable": engine.unavailable()}})
    return implementation


def make_exporters(settings: BridgeSettings) -> list[Exporter]:
    """The configured exporters (file and/or OTLP). Raises OSError/ValueError on bad files."""
    exporters: list[Exporter] = []
    if settings.output is not None:
        exporters.append(FileExporter(settings.output))
    if settings.export_otlp:
        exporters.append(make_otlp_exporter(settings.otlp))
    return exporters
