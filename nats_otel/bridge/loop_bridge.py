"""What both modes' loops (`core_loop`, `jetstream_loop`) read of `loop.Bridge`: named here,
not imported (loop.py runs them); each loop's own protocol adds what only it reads."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from nats_otel.bridge.exchange import LinkExchange
from nats_otel.bridge.intake import Intake
from nats_otel.bridge.routing import Router
from nats_otel.bridge.settings import BridgeSettings
from nats_otel.bridge.sources.delivery import Delivery

__all__ = ["LoopBridge"]


class LoopBridge(Protocol):
    """The bridge as a mode's loops see it: its settings, intake and ownership, and the steps
    of a batch (collect, observe, wait out the link window, convert and export)."""

    settings: BridgeSettings
    intake: Intake
    router: Router | None
    exchange: LinkExchange | None
    _intake_done: bool

    @property
    def _inflight(self) -> int: ...

    async def _collect(self, on_first: Callable[[], None] | None = None) -> list[Delivery]: ...

    async def _observe(self, deliveries: Sequence[Delivery], raws: list[Any],
                       collected_ns: int | None = None) -> float: ...

    async def _process(self, deliveries: Sequence[Delivery], raws: list[Any], holdable: frozenset[int] = ...
                       ) -> tuple[list[Delivery], list[Delivery], list[Delivery], list[Delivery]]: ...

    async def _until(self, ripe_at: float) -> None: ...

    def _past_deadline(self) -> bool: ...

    def _draining(self) -> bool: ...
