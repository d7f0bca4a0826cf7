"""What became of each batch, in metrics and logs: rejections, mapping issues, hop links,
the network view, exports. One place, so the core and JetStream loops count alike."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable

from nats_otel.bridge.network_metrics import NetworkMetrics
from nats_otel.bridge.processor import BatchOutcome
from nats_otel.bridge.readiness import BackendReadiness
from nats_otel.bridge.settings import TelemetrySettings
from nats_otel.bridge.telemetry import Metrics
from nats_otel.core.engine import tally_results
from nats_otel.core.pipeline import Rejected

__all__ = ["BatchAccounting"]

log = logging.getLogger("nats_otel.bridge")


class BatchAccounting:
    """Counts batches into the bridge's metrics (the network view included)."""

    def __init__(self, metrics: Metrics, telemetry: TelemetrySettings, backend: BackendReadiness,
                 exporter_names: Iterable[str] = ()) -> None:
        self.metrics = metrics
        self.backend = backend
        for name in exporter_names:  # at 0 from the start: dashboards and alerts see each series
            metrics.spans_exported.labels(name)
            metrics.spans_rejected.labels(name)
            metrics.export_failures.labels(name)
        self.network = NetworkMetrics(metrics.registry, telemetry.network_labels, telemetry.network_max_series)
        self._handed_logged: set[str] = set()  # stages whose hand-off to the reference was logged
        for stage in ("prepare", "map", "network", "request"):  # at 0 from the start, as above
            metrics.core_reference.labels(stage)

    def account(self, outcome: BatchOutcome) -> None:
        """Count one batch's results and export results; log what was lost or odd."""
        m = self.metrics
        results = outcome.results
        if outcome.held:  # counted when they are finally mapped (redelivered)
            results = [r for i, r in enumerate(results) if i not in outcome.held]
        # Counted as the batch was converted (`convert_encoded`: the bridge's path), else one
        # pass over the batch, compiled with the core (`tally_results`): this runs for every
        # message on the event loop's thread (issues 39, 48).
        tally = outcome.tally if outcome.tally is not None and not outcome.held else None
        decoded, links, issue_list, samples = tally_results(results) if tally is None else tally
        # Every result is converted or rejected: look for the rejected only when some are
        # missing. (An isinstance that fails is the slow one: msgspec's metaclass is asked,
        # ~3x a match; it was the costliest pass of this method in py-spy, issue 39.)
        if decoded != len(results):
            # Rare. The bridge's path lists them (an `EncodedBatch` makes its results only when asked).
            for result in (outcome.rejected if tally is not None and outcome.rejected is not None else results):
                if isinstance(result, Rejected):
                    m.rejected.labels(result.reason).inc()
                    log.warning("trace message rejected", extra={"fields": {
                        "reason": result.reason, "subject": result.subject, "detail": result.detail[:300]}})
        issues = Counter([issue.split(":", 1)[0] for issue in issue_list])
        self.network.record(samples, outcome.expired_unmatched)
        m.decoded.inc(decoded)
        for kind, count in issues.items():
            m.issues.labels(kind).inc(count)
        for link, count in links.items():
            m.hop_links.labels(link).inc(count)
        if outcome.evicted:
            m.link_evicted.inc(outcome.evicted)
            log.warning("link window full: hop evidence forgotten early (raise link.capacity)",
                        extra={"fields": {"evicted": outcome.evicted}})
        for stage, count in outcome.handed.items():
            m.core_reference.labels(stage).inc(count)
            if stage not in self._handed_logged:  # once per stage: the metric counts the rest
                self._handed_logged.add(stage)
                log.info("the compiled kernel handed trace messages to the pure-Python reference (converted all the "
                         "same; counted in nats_otel_core_reference_total)",
                         extra={"fields": {"stage": stage, "count": count}})
        for error in outcome.poisoned.values():
            m.dropped.labels("export_invalid").inc()
            log.warning("trace message dropped: the backend refused its spans as invalid",
                        extra={"fields": {"error": error[:300]}})
        spans = outcome.span_count
        for name, export in outcome.exports.items():
            m.export_latency.labels(name).observe(outcome.durations.get(name, 0.0))
            if export.ok:
                m.spans_exported.labels(name).inc(spans - export.rejected_spans)
                if export.rejected_spans:
                    m.spans_rejected.labels(name).inc(export.rejected_spans)
            else:
                m.export_failures.labels(name).inc()
                log.warning("export failed", extra={"fields": {
                    "exporter": name, "error": export.error, "attempts": export.attempts, "spans": spans,
                    "retryable": export.retryable}})
            self.backend.note_export(name, export)


