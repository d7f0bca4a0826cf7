"""Whether a compiled module may run, and the import of one: the one place the choice between
compiled code and pure Python is made.

As in aiohttp and multidict: the compiled modules (`nats_otel/core/_kernel.pyx` and the
leaf of primitives `_primitives.pyx`; the bridge's `_frames` and `_network_metrics`) are
built by `pip install` and imported where they are chosen (`engine` for the kernel; the
decoding modules for the leaf's hooks), unless the environment variable
`NATS_OTEL_NO_EXTENSIONS` is set (to anything but "" or "0"). The pure-Python modules are
the reference (the golden files, and tests that both give the same bytes) and the
fallback where the build could not run, or where a compiled module refuses to import
(the kernel does when a record is not laid out as it reads it).

This module imports nothing of the core.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

__all__ = ["NO_EXTENSIONS", "compiled", "refused"]

#: Read once, at import: the choice holds for the life of the process (and its workers,
#: which inherit the environment).
NO_EXTENSIONS = os.environ.get("NATS_OTEL_NO_EXTENSIONS", "") not in ("", "0")

# Why a compiled module could not be imported (name -> reason).
_unavailable: dict[str, str] = {}


def compiled(name: str) -> ModuleType | None:
    """The compiled module `nats_otel.core.<name>` (or the module `name`, when dotted: the
    bridge's), or None: forbidden, not built, or refusing to import (`refused` says why)."""
    if NO_EXTENSIONS:
        return None
    try:
        return importlib.import_module(name if "." in name else f"nats_otel.core.{name}")
    except ImportError as exc:
        _unavailable[name] = str(exc)
        return None


def refused() -> dict[str, str]:
    """The compiled modules not imported so far, with why."""
    return dict(_unavailable)
