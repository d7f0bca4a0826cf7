"""Where span batches go: OTLP (gRPC or HTTP/protobuf) and OTLP/JSON lines files.

Every exporter has a blocking `export(spans, deadline) -> ExportResult` that never raises
for a downstream failure, and `close()`. The bridge calls them from a worker thread.
"""

from nats_otel.bridge.export.result import ExportResult

__all__ = ["ExportResult"]
