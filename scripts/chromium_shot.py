"""Headless Chromium screenshots for the docs' images (the scripts beside this one)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--hide-scrollbars",
                  "--virtual-time-budget=10000"]


def find_chromium() -> str:
    """Debian's chromium, or exit with the install hint."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        sys.exit("chromium not found (apt-get install -y chromium)")
    return chromium


def screenshot(chromium: str, page: str, output: Path, window_size: str, workdir: Path) -> None:
    """Photograph `page` into `output` (a fresh browser profile under `workdir`)."""
    output.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={workdir / 'chromium'}",
                    f"--window-size={window_size}", f"--screenshot={output}", page],
                   check=True, timeout=120, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    print(f"{page}\n-> {output}")
