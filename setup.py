"""The optional compiled modules of the hot path (Cython): the core's kernel and its leaf of
primitives (`nats_otel/core/_kernel.pyx`, which includes its stages, `_stage_*.pxi`, and
`_primitives.pyx`), and the bridge's `nats_otel/bridge/sources/_frames.pyx` and
`nats_otel/bridge/_network_metrics.pyx`.

Everything else is configured in pyproject.toml. The build is optional, as in aiohttp and
multidict: without Cython or a C compiler, or with NATS_OTEL_NO_EXTENSIONS=1, the install
still succeeds on the pure-Python core and says so in a warning (`pip install -v` shows it;
the bridge logs which core it runs at start and exports `nats_otel_core_info`).
"""

from __future__ import annotations

import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

# The compiled core (`core/accel.py`): the leaf of primitives and the kernel, which cimports it.
COMPILED = ("_primitives", "_kernel")
# Compiled twins outside the core: the bridge's NATS frame scanner and network-view counting.
BRIDGE_TWINS = ("nats_otel.bridge.sources._frames", "nats_otel.bridge._network_metrics")
NO_EXTENSIONS = os.environ.get("NATS_OTEL_NO_EXTENSIONS", "") not in ("", "0")


def _warn(text: str) -> None:
    print(f"WARNING: nats-otel: {text}; the pure-Python core will be used (correct, slower).", file=sys.stderr)


class OptionalBuildExt(build_ext):
    """build_ext whose failure is a warning, not a failed install."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # noqa: BLE001 - any build failure falls back to pure Python
            _warn(f"the compiled core could not be built ({type(exc).__name__}: {exc})")

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:  # noqa: BLE001 - as above, one module at a time
            _warn(f"{ext.name} could not be compiled ({type(exc).__name__}: {exc})")


def _extensions() -> list[Extension]:
    if NO_EXTENSIONS:
        _warn("NATS_OTEL_NO_EXTENSIONS is set: the compiled core is not built")
        return []
    try:
        from Cython.Build import cythonize
    except ImportError:
        _warn("Cython is not installed: the compiled core is not built")
        return []
    names = [f"nats_otel.core.{name}" for name in COMPILED] + list(BRIDGE_TWINS)
    modules = [Extension(name, [name.replace(".", "/") + ".pyx"]) for name in names]
    return cythonize(modules, compiler_directives={"language_level": "3"}, quiet=True)


setup(ext_modules=_extensions(), cmdclass={"build_ext": OptionalBuildExt})
