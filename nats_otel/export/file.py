"""OTLP/JSON lines (the Collector's file-exporter format), one request per trace."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

from ..encode import split_by_trace, to_otlp_json_line
from ..records import SpanRecord
from .result import ExportResult

__all__ = ["FileExporter"]


class FileExporter:
    """Appends each batch's traces to a file; flushed per batch so a crash loses little."""

    name = "file"

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._out = open(path, "ab")  # noqa: SIM115 - open for the exporter's life

    def export(self, spans: Sequence[SpanRecord], deadline: float | None = None) -> ExportResult:
        """Write the spans as OTLP/JSON lines (sorted by trace, like `convert`)."""
        try:
            with self._lock:
                for trace in split_by_trace(spans):
                    self._out.write(to_otlp_json_line(trace))
                self._out.flush()
        except OSError as exc:
            return ExportResult(False, error=f"{self.path}: {exc}", retryable=True)
        return ExportResult.success()

    def close(self) -> None:
        with self._lock:
            self._out.close()
