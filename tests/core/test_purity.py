"""The pure core imports no I/O: no NATS client, Spark, gRPC, OTel SDK or exporter,
Prometheus client or asyncio; the layers import one way (core <- bridge, devkit); and no
module of nats_otel or spark_backfill imports itself through others, the compiled modules
(Cython: their imports, cimports and includes read from the source) among them."""

from __future__ import annotations

import ast
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import nats_otel
import nats_otel.core
import spark_backfill

PACKAGE = Path(nats_otel.__file__).parent
# The packages whose imports must not run in a circle (the backfill imports the core).
CHECKED_PACKAGES = (PACKAGE, Path(spark_backfill.__file__).parent)
FORBIDDEN_ROOTS = ("nats", "pyspark", "grpc", "asyncio", "prometheus_client")
FORBIDDEN_PREFIXES = ("opentelemetry.sdk", "opentelemetry.exporter")


def core_modules() -> list[str]:
    return sorted(m.name for m in pkgutil.walk_packages(nats_otel.core.__path__, "nats_otel.core."))


def test_the_core_package_has_the_modules_we_expect():
    # Guards the test below against walking an empty package.
    assert {"nats_otel.core.decode", "nats_otel.core.mapping", "nats_otel.core.encode"} <= set(core_modules())


def test_core_imports_nothing_with_io():
    code = (
        f"import sys\nfor m in {core_modules()!r}: __import__(m)\n"
        f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {FORBIDDEN_ROOTS!r}"
        f" or m.startswith({FORBIDDEN_PREFIXES!r}))\n"
        "print(','.join(bad))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == ""


def _is_module(name: str) -> bool:
    """A module of this repository (a file, or a package's folder)."""
    base = PACKAGE.parent.joinpath(*name.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def imported_modules(path: Path) -> set[str]:
    """Absolute module names a source file imports (relative imports resolved; in
    `from a.b import c`, `a.b.c` too when c is a module of this repository)."""
    tree = ast.parse(path.read_text(), str(path))
    package = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1])
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names if _is_module(f"{base}.{alias.name}"))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in ("import_module", "compiled") and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            # importlib.import_module("a.b") and accel.compiled("_kernel"): imports by name
            name = node.args[0].value
            names.add(name if "." in name or node.func.attr == "import_module" else f"nats_otel.core.{name}")
    return names


_CYTHON_IMPORT = re.compile(r"^(?:from\s+([\w.]+)\s+c?import\b|c?import\s+([\w.]+))", re.M)
_CYTHON_INCLUDE = re.compile(r'^include\s+"([^"]+)"', re.M)


def cython_imports(path: Path) -> set[str]:
    """The modules a compiled module (`.pyx`) imports or cimports, its includes' too."""
    text = path.read_text()
    for include in _CYTHON_INCLUDE.findall(text):
        text += (path.parent / include).read_text()
    return {a or b for a, b in _CYTHON_IMPORT.findall(text)}


def layer_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "nats_otel" or len(parts) < 2:
        return None
    return parts[1]


# Which layers each layer may import. The core imports only itself; tools for tests and
# demos may use everything; nothing but the CLI and devkit imports devkit.
ALLOWED = {
    "core": {"core"},
    "archive": {"core"},
    "gc_tuning": set(),
    "bridge": {"core", "bridge", "archive", "gc_tuning"},
    "devkit": {"core", "bridge", "archive", "devkit"},
    "commands": {"core", "bridge", "archive", "devkit", "gc_tuning", "commands"},
    "cli": {"commands"},
}


def test_layers_import_one_way():
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        own = layer_of(".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts))
        if own is None or own == "__init__":
            continue
        for name in imported_modules(path):
            target = layer_of(name)
            if target is not None and target not in ALLOWED[own]:
                wrong.append(f"{path.relative_to(PACKAGE.parent)} imports {name}")
    assert wrong == []


def module_graph() -> dict[str, set[str]]:
    """Module -> the modules it imports (anywhere in the file, even for the type checker
    alone), over nats_otel and spark_backfill."""
    modules = {".".join(p.relative_to(package.parent).with_suffix("").parts).removesuffix(".__init__"): p
               for package in CHECKED_PACKAGES for suffix in ("*.py", "*.pyx") for p in package.rglob(suffix)}
    tops = {package.name for package in CHECKED_PACKAGES}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        for imported in imported_modules(path) if path.suffix == ".py" else cython_imports(path):
            while imported and imported not in modules:
                imported = imported.rpartition(".")[0]
            if imported and imported != name and imported not in tops:
                targets.add(imported)
        graph[name] = targets
    return graph


def test_no_import_cycle():
    graph = module_graph()
    # The graph is not empty, and `from package import module` names the module.
    assert "nats_otel.bridge.loop" in graph["nats_otel.commands.bridge"]
    assert "nats_otel.core.accel" in graph["nats_otel.core.model"]
    # An import by name is an import: `engine` chooses the kernel so (and `accel` once
    # imported the choosing modules so).
    assert "nats_otel.core._kernel" in graph["nats_otel.core.engine"]
    assert "nats_otel.core._primitives" in graph["nats_otel.core.model"]
    # The compiled modules' imports are read: the kernel imports the pure modules (which
    # must not import it back) and cimports the leaf of primitives.
    assert {"nats_otel.core.pipeline", "nats_otel.core.sequences", "nats_otel.core._primitives"} <= graph[
        "nats_otel.core._kernel"]
    assert graph["nats_otel.core._primitives"] == {"nats_otel.core.timestamps"}
    assert {"spark_backfill.checks", "spark_backfill.report"} <= graph["spark_backfill.__main__"]
    state: dict[str, int] = {}  # 1 on the path, 2 done
    cycles = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append([*path[path.index(nxt):], nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for start in sorted(graph):
        if start not in state:
            visit(start, [start])
    assert cycles == []
