"""The error policy's per-message part (`policy.settle`): held, terminated, acked, naked."""

from __future__ import annotations

from nats_otel.bridge.export.result import ExportResult
from nats_otel.bridge.policy import settle
from nats_otel.bridge.processor import BatchOutcome
from nats_otel.core.pipeline import Converted, Rejected


def _outcome(ok: bool) -> BatchOutcome:
    results = [Converted([]), Rejected("undecodable", "x"), Converted([]), Converted([])]
    return BatchOutcome(results, {"otlp": ExportResult(ok, error="" if ok else "down", retryable=not ok)},
                        poisoned={2: "invalid"}, held=frozenset({3}))


def test_exported_batch_acks_all_but_the_bad_and_the_held():
    assert settle("abcd", _outcome(True)) == (["a"], [], ["b", "c"], ["d"])


def test_failed_export_naks_what_may_be_retried_and_terminates_what_never_can():
    assert settle("abcd", _outcome(False)) == ([], ["a"], ["b", "c"], ["d"])
