"""The choice between the core's compiled twins and pure Python, made where each is used.

As in aiohttp and multidict: a compiled module (`nats_otel/core/_<name>.pyx`, built by
`pip install`) stands beside the pure-Python module of the same job and is chosen when
that module is imported, unless the environment variable `NATS_OTEL_NO_EXTENSIONS` is set
(to anything but "" or "0"). The pure-Python modules are the reference (the golden files,
and tests that both give the same bytes) and the fallback where the build could not run.

This module imports nothing of the core: the modules that choose import it. Which core
runs, once they all have chosen, is `core.choice`'s to say (it imports them).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from types import ModuleType

__all__ = ["NO_EXTENSIONS", "compiled", "configured", "note_unavailable", "refused"]

#: Read once, at import: the choice holds for the life of the process (and its workers,
#: which inherit the environment).
NO_EXTENSIONS = os.environ.get("NATS_OTEL_NO_EXTENSIONS", "") not in ("", "0")

# Why a compiled twin could not be imported, or is not used (name -> reason).
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


def refused() -> dict[str, str]:
    """The twins not imported or not used so far, with why (`choice.unavailable` once every
    choosing module was imported)."""
    return dict(_unavailable)
