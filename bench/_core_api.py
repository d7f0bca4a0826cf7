"""The core's hot path as this checkout chooses it, for benchmarks that also run older
checkouts (`core_ab.py`, `bridge_throughput.py --baseline`): `nats_otel.core.engine` since
the compiled kernel (issue 30); before it, the pure modules' names, which chose their
compiled twins themselves."""

from __future__ import annotations

from types import ModuleType, SimpleNamespace
from typing import Any


def hot_path() -> ModuleType | Any:
    """`Converter`, `Linker`, `prepare`, `finish`, `convert_batch`, `map_encode`,
    `encode_request` (encoded spans), `network_sample` and `implementation()`."""
    try:
        from nats_otel.core import engine
    except ImportError:
        from nats_otel.core import network, pipeline

        try:
            from nats_otel.core import choice

            implementation = choice.implementation
        except ImportError:
            from nats_otel.core import accel

            implementation = accel.implementation  # type: ignore[attr-defined]
        api = SimpleNamespace(Converter=pipeline.Converter, Linker=pipeline.Linker, prepare=pipeline.prepare,
                              finish=pipeline.finish, convert_batch=pipeline.convert_batch,
                              network_sample=network.network_sample, implementation=implementation)
        try:
            from nats_otel.core import span_bytes

            api.map_encode, api.encode_request = span_bytes.map_encode, span_bytes.encode_request
        except ImportError:  # before the encoded path
            pass
        return api
    return engine
