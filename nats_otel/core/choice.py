"""Which core runs: the compiled twins, or the pure-Python reference (`accel` chooses).

Each module of the hot path chooses its twin when it is imported; importing them all here
makes the record complete before it is read. Nothing in the core imports this module: the
bridge's log line and metric, the workers' hello and the tests ask it.
"""

from __future__ import annotations

from nats_otel.core import (  # noqa: F401 - imported for their choice, which they record in accel
    accel,
    ids,
    linking,
    model,
    network,
    otlp_wire,
    pipeline,
    span_bytes,
    timestamps,
)

__all__ = ["TWINS", "implementation", "unavailable"]

# The compiled twins of the core (setup.py builds the same list).
TWINS = ("_otlp_wire", "_timestamps", "_model", "_ids", "_mapping", "_linking", "_prepare", "_network",
         "_pipeline")


def implementation() -> str:
    """"compiled" when every compiled twin of the core is in use, else "python"."""
    refused = accel.refused()
    return "python" if accel.NO_EXTENSIONS or any(name in refused for name in TWINS) else "compiled"


def unavailable() -> dict[str, str]:
    """Compiled twins not imported (with the import error) or not used (with why); empty when
    forced off."""
    return accel.refused()
