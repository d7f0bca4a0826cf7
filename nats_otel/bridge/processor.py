"""One batch through the bridge: archive the raw messages, convert, export.

Runs where the work is done: the loop's worker thread, or each worker process
(`workers.py`). Both the loop and the workers import it; it imports neither.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from nats_otel.archive import archive_record
from nats_otel.bridge.export.file import FileExporter
from nats_otel.bridge.export.otlp import make_otlp_exporter
from nats_otel.bridge.export.result import ExportResult
from nats_otel.bridge.settings import BridgeSettings
from nats_otel.core.decode import DecodeLimits, RawTraceMessage
from nats_otel.core.mapping import DEFAULT_HEADER_ALLOWLIST, MappingOptions
from nats_otel.core.pipeline import Converted, Converter, Rejected
from nats_otel.core.records import SpanRecord

__all__ = ["BatchOutcome", "Exporter", "Processor", "make_exporters"]


class Exporter(Protocol):
    name: str

    def export(self, spans: Sequence[SpanRecord], deadline: float | None = None) -> ExportResult: ...

    def close(self) -> None: ...


@dataclass(slots=True)
class BatchOutcome:
    """What became of one batch: per message converted or rejected, and the export results."""

    results: list[Converted | Rejected]
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

    @property
    def span_count(self) -> int:
        if self.spans >= 0:
            return self.spans
        return sum(len(r.spans) for r in self.results if isinstance(r, Converted))

    @property
    def exported(self) -> bool:
        """True when every exporter took the spans (or there were none to send)."""
        return all(r.ok for r in self.exports.values())


class Processor:
    """Runs in the worker thread: archive, convert, export one batch. Never raises for input."""

    def __init__(self, settings: BridgeSettings, exporters: Sequence[Exporter]) -> None:
        allow = DEFAULT_HEADER_ALLOWLIST | {h.lower() for h in settings.allow_headers}
        limits = DecodeLimits(**settings.limits.model_dump())
        self.converter = Converter(MappingOptions(settings.service_name, allow), limits, settings.link.core())
        self.exporters = list(exporters)
        # Unbuffered, one write per batch: atomic with O_APPEND, so worker processes can share it.
        self._archive = open(settings.archive, "ab", buffering=0) if settings.archive else None  # noqa: SIM115
        self._evicted_seen = 0
        self._expired_seen: dict[str, int] = {}

    def observe(self, raws: Sequence[RawTraceMessage]) -> None:
        """Record the hop evidence of messages that just arrived (mapped `link.wait` later)."""
        now = time.monotonic()
        for raw in raws:
            self.converter.observe(raw, now)

    def process(self, raws: Sequence[RawTraceMessage], deadline: float | None) -> BatchOutcome:
        if self._archive is not None:
            self._archive.write(b"".join(archive_record(raw) for raw in raws))
        now = time.monotonic()
        outcome = BatchOutcome([self.converter.convert(raw, now) for raw in raws])
        index = self.converter.linker.index
        outcome.evicted, self._evicted_seen = index.evicted - self._evicted_seen, index.evicted
        outcome.expired_unmatched = {side: count - self._expired_seen.get(side, 0)
                                     for side, count in index.expired_unmatched.items()}
        self._expired_seen = dict(index.expired_unmatched)
        spans = [s for r in outcome.results if isinstance(r, Converted) for s in r.spans]
        outcome.spans = len(spans)
        if spans:
            for exporter in self.exporters:
                started = time.monotonic()
                result = exporter.export(spans, deadline)
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
            if not isinstance(result, Converted) or not result.spans or position in outcome.poisoned:
                continue
            alone = exporter.export(result.spans, deadline)
            attempts += alone.attempts
            if alone.ok:
                refused_spans += alone.rejected_spans
            elif alone.invalid:
                outcome.poisoned[position] = alone.error
                refused_spans += len(result.spans)
            else:  # now the backend is down: the whole batch again later (duplicates are fine)
                return dataclasses.replace(alone, attempts=attempts)
        return ExportResult.success(attempts, refused_spans)

    def close(self) -> None:
        for exporter in self.exporters:
            exporter.close()
        if self._archive is not None:
            self._archive.close()


def make_exporters(settings: BridgeSettings) -> list[Exporter]:
    """The configured exporters (file and/or OTLP). Raises OSError/ValueError on bad files."""
    exporters: list[Exporter] = []
    if settings.output is not None:
        exporters.append(FileExporter(settings.output))
    if settings.export_otlp:
        exporters.append(make_otlp_exporter(settings.otlp))
    return exporters
