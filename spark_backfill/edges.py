"""An edge of the observed network: what the report computes and its picture draws.

A module of its own so that `report` (which computes the edges and has them drawn) and
`network` (which draws them) both import it, and neither imports the other.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Edge"]


@dataclass(frozen=True, slots=True)
class Edge:
    """Forwardings from one server to another over one connection kind."""

    source: str
    target: str
    kind: str
    count: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
