"""nats-otel: NATS message-path traces (ADR-41) as OpenTelemetry spans."""

from importlib.metadata import PackageNotFoundError, version


def _version() -> str:
    """The version is written in one place, pyproject.toml; this reads it back.

    Installed (a wheel, an sdist, `pip install -e .`), the package metadata has it. A checkout
    used through PYTHONPATH without an install (Spark executors given the source tree) reads
    the pyproject.toml beside the package, so spans carry the same scope version either way.
    """
    try:
        return version("nats-otel")
    except PackageNotFoundError:
        import tomllib
        from pathlib import Path

        pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
        try:
            with pyproject.open("rb") as f:
                return str(tomllib.load(f)["project"]["version"])
        except (OSError, KeyError, tomllib.TOMLDecodeError):
            return "0+unknown"


__version__ = _version()
