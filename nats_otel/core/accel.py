"""Which implementation of the core's hot path runs: the compiled twins or pure Python.

As in aiohttp and multidict: a compiled module (`nats_otel/core/_<name>.pyx`, built by
`pip install`) stands beside the pure-Python module of the same job and is chosen when
that module is imported, unless the environment variable `NATS_OTEL_NO_EXTENSIONS` is set
(to anything but "" or "0"). The pure-Python modules are the reference (the golden files,
and tests that both give the same bytes) and the fallback where the build could not run.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from types import ModuleType

__all__ = ["NO_EXTENSIONS", "compiled", "configured", "implementation", "note_unavailable", "unavailable"]

#: Read once, at import: the choice holds for the life of the process (and its workers,
#: which inherit the environment).
NO_EXTENSIONS = os.environ.get("NATS_OTEL_NO_EXTENSIONS", "") not in ("", "0")

# The compiled twins the core uses, and why one could not be imported (name -> error).
TWINS = ("_otlp_wire", "_timestamps", "_model", "_ids", "_mapping", "_linking", "_prepare", "_network",
         "_pipeline")
_unavailable: dict[str, str] = {}


def compiled(name: str) -> ModuleType | None:
    """The compiled twin `nats_otel.core.<name>` (or the module `name`, when dotted: the
    bridge's twins), or None: forbidden, or not built."""
    if NO_EXTENSIONS:
        return None
    try:
        return importlib.import_module(name if "." in name else f"nats_otel.core.{name}")
    except ImportError as exc:
        _unavailable[name] = str(exc)
        return None


def note_unavailable(name: str, reason: str) -> None:
    """A compiled twin that was built but is not used (its module says why)."""
    _unavailable[name] = reason


def configured(name: str, configure: Callable[[ModuleType], None],
               refusals: tuple[type[Exception], ...] = ()) -> ModuleType | None:
    """`compiled(name)`, handed what it uses by `configure`; None when it is not built, or
    when `configure` refuses it with a TypeError (a record not laid out as the twin reads
    it) or one of `refusals`: then the reference is used, and `unavailable()` says why."""
    module = compiled(name)
    if module is None:
        return None
    refused: tuple[type[Exception], ...] = (TypeError, *refusals)
    try:
        configure(module)
    except refused as exc:
        note_unavailable(name, f"not used: {exc}")
        return None
    return module


def _load_all() -> None:
    # The modules that choose a twin at import: importing them makes the record complete.
    importlib.import_module("nats_otel.core.otlp_wire")
    importlib.import_module("nats_otel.core.timestamps")
    importlib.import_module("nats_otel.core.model")
    importlib.import_module("nats_otel.core.ids")
    importlib.import_module("nats_otel.core.span_bytes")
    importlib.import_module("nats_otel.core.linking")
    importlib.import_module("nats_otel.core.network")
    importlib.import_module("nats_otel.core.pipeline")


def implementation() -> str:
    """"compiled" when every compiled twin of the core is in use, else "python"."""
    _load_all()
    return "python" if NO_EXTENSIONS or any(name in _unavailable for name in TWINS) else "compiled"


def unavailable() -> dict[str, str]:
    """Compiled twins that could not be imported, with the import error (empty if forced off)."""
    _load_all()
    return dict(_unavailable)
