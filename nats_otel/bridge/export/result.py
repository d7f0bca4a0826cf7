"""The outcome of one export: failures are results, not exceptions."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ExportResult"]


@dataclass(frozen=True, slots=True)
class ExportResult:
    """`ok`: the backend took the batch. Otherwise `retryable` says whether trying the same
    batch later may work (backend down, overloaded) or never will (bad request), and
    `invalid` whether the backend refused the request's content (HTTP 400, gRPC
    INVALID_ARGUMENT) rather than us (401, 403, 404...: a configuration problem, which a
    fixed configuration and a redelivery cure). `kind` names a failure for `/readyz`:
    unreachable, timeout, authorization, not_found, unavailable, invalid or refused."""

    ok: bool
    attempts: int = 1
    error: str = ""
    retryable: bool = False
    rejected_spans: int = 0  # OTLP partial success: spans the backend refused
    invalid: bool = False
    kind: str = ""

    @classmethod
    def success(cls, attempts: int = 1, rejected_spans: int = 0) -> ExportResult:
        return cls(True, attempts, "", False, rejected_spans)
