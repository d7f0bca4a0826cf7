"""OTLP/JSON lines (the Collector's file-exporter format), one request per trace."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

from nats_otel.bridge.export.result import ExportResult
from nats_otel.core.encode import split_by_trace, to_otlp_json_line
from nats_otel.core.records import SpanRecord

__all__ = ["FileExporter"]


class FileExporter:
    """Appends each batch's traces to a file; flushed per batch so a crash loses little."""

    name = "file"

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        # Unbuffered, one write per batch: with O_APPEND that write is atomic, so several
        # worker processes (`batch.workers`) can append to one file without tearing lines.
        self._out = open(path, "ab", buffering=0)  # noqa: SIM115 - open for the exporter's life

    def export(self, spans: Sequence[SpanRecord], deadline: float | None = None) -> ExportResult:
        """Write the spans as OTLP/JSON lines (sorted by trace, like `convert`)."""
        try:
            chunk = b"".join(to_otlp_json_line(trace) for trace in split_by_trace(spans))
            with self._lock:
                self._out.write(chunk)
        except OSError as exc:
            return ExportResult(False, error=f"{self.path}: {exc}", retryable=True)
        return ExportResult.success()

    def close(self) -> None:
        with self._lock:
            self._out.close()
