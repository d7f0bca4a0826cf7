"""The core's hot path, chosen once: the compiled kernel when built, else the pure-Python
reference. What the bridge, `convert`, the backfill and the benchmarks call.

As in yarl's `_quoting.py`: two modules export the same names, `_kernel` (Cython: prepare,
link, map and encode, network, in one extension) and `reference` (the pure modules'
own functions and classes), and this one picks. `NATS_OTEL_NO_EXTENSIONS` (`accel`)
forces the reference. The pure modules never import this one or the kernel; the kernel
imports them. So the core's imports run one way, and a tool can follow a message from
here into either implementation.
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING

from nats_otel.core import accel, reference

__all__ = [
    "IMPLEMENTATION",
    "IMPLEMENTATIONS",
    "Converter",
    "LinkIndex",
    "Linker",
    "convert_batch",
    "encode_request",
    "encode_results",
    "encode_spans",
    "event_span_id",
    "finish",
    "handed_to_reference",
    "implementation",
    "map_encode",
    "network_sample",
    "observed",
    "observed_entries",
    "parse_traceparent",
    "prepare",
    "server_span_id",
    "tally_results",
    "unavailable",
]

_kernel = accel.compiled("_kernel")
_primitives = accel.compiled("_primitives")

#: Each implementation that can run here, by name ("python" always; "compiled" when built
#: and not forced off): the tests run the core's tests over both.
IMPLEMENTATIONS: dict[str, ModuleType] = {"python": reference}
if _kernel is not None:
    IMPLEMENTATIONS["compiled"] = _kernel

_chosen: ModuleType = reference if _kernel is None else _kernel

if TYPE_CHECKING:  # one interface: type checkers see the reference
    from nats_otel.core.reference import (
        IMPLEMENTATION,
        Converter,
        Linker,
        LinkIndex,
        convert_batch,
        encode_request,
        encode_results,
        encode_spans,
        event_span_id,
        finish,
        handed_to_reference,
        map_encode,
        network_sample,
        observed,
        observed_entries,
        parse_traceparent,
        prepare,
        server_span_id,
        tally_results,
    )
else:
    IMPLEMENTATION = _chosen.IMPLEMENTATION
    Converter, LinkIndex, Linker = _chosen.Converter, _chosen.LinkIndex, _chosen.Linker
    prepare, finish, convert_batch = _chosen.prepare, _chosen.finish, _chosen.convert_batch
    observed, observed_entries = _chosen.observed, _chosen.observed_entries
    map_encode, network_sample = _chosen.map_encode, _chosen.network_sample
    encode_request, encode_results, encode_spans = _chosen.encode_request, _chosen.encode_results, _chosen.encode_spans
    tally_results = _chosen.tally_results
    parse_traceparent, server_span_id, event_span_id = (_chosen.parse_traceparent, _chosen.server_span_id,
                                                        _chosen.event_span_id)
    handed_to_reference = _chosen.handed_to_reference


def implementation() -> str:
    """"compiled" when the kernel and the leaf of primitives both run, else "python"."""
    return "compiled" if _kernel is not None and _primitives is not None else "python"


def unavailable() -> dict[str, str]:
    """The compiled modules not imported, with why (empty when both run, or when forced off)."""
    return accel.refused()
