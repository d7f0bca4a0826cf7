"""The core's hot path in pure Python: the reference, and the fallback where the kernel is
not built (or not used). `engine` chooses between this and the compiled kernel
(`_kernel.pyx`), which exports the same names, with the same records, bytes and errors.

Nothing here is new code: each name is the pure module's own, gathered so that both
implementations can be handed around as one (`engine.IMPLEMENTATIONS`, the tests' `core`
fixture).
"""

from __future__ import annotations

from nats_otel.core.ids import event_span_id, parse_traceparent, server_span_id
from nats_otel.core.linking import PythonLinkIndex as LinkIndex
from nats_otel.core.network import network_sample
from nats_otel.core.otlp_wire import python_encode_request as encode_spans
from nats_otel.core.pipeline import PythonConverter as Converter
from nats_otel.core.pipeline import PythonLinker as Linker
from nats_otel.core.pipeline import (
    convert_batch,
    encode_results,
    finish,
    observed,
    observed_entries,
    prepare,
    tally_results,
)
from nats_otel.core.span_bytes import python_encode_request as encode_request
from nats_otel.core.span_bytes import python_map_encode as map_encode

__all__ = ["IMPLEMENTATION", "Converter", "LinkIndex", "Linker", "convert_batch", "encode_request", "encode_results",
           "encode_spans", "event_span_id", "finish", "handed_to_reference", "map_encode", "network_sample",
           "observed", "observed_entries", "parse_traceparent", "prepare", "server_span_id", "tally_results"]

IMPLEMENTATION = "python"


def handed_to_reference() -> dict[str, int]:
    """The kernel's count of what it handed here; the reference hands nothing on."""
    return {}
