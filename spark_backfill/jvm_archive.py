"""A class-data archive for the embedded JVM: its start-up shortened on every run after the first.

An embedded Spark loads ~16,000 classes from ~250 jars before its first job: 3-5 s of
a run's wall time, on one core, while the second waits (issue 38: at 200k trace messages
that start was a fifth of a `local[2]` run). Java's class-data sharing (CDS) maps classes
already parsed and verified from an archive instead: 1.5-4 s less per run here (docs/backfill.md).

The archive is made from what a real run loaded, as `git gc --auto` packs a repository:
1. a run with no archive has its JVM list the classes it loads (`-XX:DumpLoadedClassList`,
   a text file: a cut-short list is still a valid one);
2. once that run's job succeeded, a process of its own, detached and at low priority,
   dumps the archive from the list (`java -Xshare:dump`, ~20 CPU-s) under a temporary name
   and renames it into place only if `java` succeeded: a half-written archive is never
   used (the JVM would crash on one: SIGBUS, tried);
3. later runs map it (`-Xshare:auto`: an archive made for another Java or other jars is
   not used, silently, and the run starts as before).

Archives live in `$NATS_OTEL_CACHE` (default `$XDG_CACHE_HOME/nats-otel`, `~/.cache/nats-otel`),
one per Java and pyspark install (~190 MB: delete them at will).
`NATS_OTEL_SPARK_ARCHIVE=off` turns all of it off; so does giving the JVM options
yourself (`--conf spark.driver.extraJavaOptions=...`). Embedded local Spark only: a
cluster's JVMs are the cluster's.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["ENV_SWITCH", "Archive", "after_run", "archive_for", "cache_dir", "dump", "start_dump"]

log = logging.getLogger("spark_backfill")

ENV_SWITCH = "NATS_OTEL_SPARK_ARCHIVE"

# A dump that started this long ago and left its lock is taken as dead.
_STALE_LOCK_S = 600
# The JVM's own messages about the archive (a class it cannot archive, an archive it does
# not use) are not the user's concern.
_QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"


def cache_dir() -> Path:
    """Where archives live: $NATS_OTEL_CACHE, else $XDG_CACHE_HOME/nats-otel, else ~/.cache/nats-otel."""
    if os.environ.get("NATS_OTEL_CACHE"):
        return Path(os.environ["NATS_OTEL_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "nats-otel"


def _java() -> str | None:
    """The `java` pyspark will start: $JAVA_HOME's, else the first on PATH (links resolved)."""
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    return os.path.realpath(found) if found and os.path.exists(found) else None


@dataclass(frozen=True, slots=True)
class Archive:
    """The archive of one Java and one pyspark install; `classes`, the list this run makes."""

    path: Path
    classes: Path

    @property
    def lock(self) -> Path:
        return self.path.with_name(f".{self.path.name}.dumping")

    @property
    def failed(self) -> Path:
        """Left by a dump that failed: no run lists its classes again (delete it to retry)."""
        return self.path.with_name(f"{self.path.name}.failed")

    def java_options(self) -> str:
        """What the run's JVM is given: map the archive, or list its classes to make one."""
        if self.path.exists():
            return f"-XX:SharedArchiveFile={self.path} -Xshare:auto {_QUIET}"
        if self.failed.exists():
            return ""
        return f"-XX:DumpLoadedClassList={self.classes} {_QUIET}"


def archive_for() -> Archive | None:
    """This machine's archive (made or to make), or None: turned off, no `java` found, or
    no cache folder to write (or one whose path has a space: JVM options split on spaces)."""
    if os.environ.get(ENV_SWITCH, "").lower() in ("off", "0", "false", "no"):
        return None
    java = _java()
    folder = cache_dir().absolute()
    if java is None or " " in str(folder):
        return None
    import pyspark

    stat = os.stat(java)
    key = hashlib.sha256(f"{java}\0{stat.st_mtime_ns}\0{pyspark.__version__}\0{pyspark.__file__}".encode())
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        log.debug("no JVM class archive: %s", exc)
        return None
    name = f"spark-{pyspark.__version__}-{key.hexdigest()[:16]}.jsa"
    return Archive(folder / name, folder / f".{name}.{os.getpid()}.classes")


def after_run(archive: Archive | None, spark: Any, succeeded: bool) -> None:
    """Once the run's job is over (its JVM still up): if it listed its classes, make the
    archive from them (`start_dump`), or, if the job failed, forget the list."""
    if archive is None or not archive.classes.exists():
        return
    if not succeeded or archive.path.exists():
        archive.classes.unlink(missing_ok=True)
        return
    system = spark._jvm.System
    java = str(Path(system.getProperty("java.home")) / "bin" / "java")
    start_dump(archive, java, system.getProperty("java.class.path"))


def start_dump(archive: Archive, java: str, class_path: str) -> bool:
    """Make the archive from this run's class list in a process of its own, detached, if
    no other is at it. True if one was started."""
    with contextlib.suppress(FileNotFoundError):
        if time.time() - archive.lock.stat().st_mtime > _STALE_LOCK_S:
            archive.lock.unlink()
    try:
        fd = os.open(archive.lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        archive.classes.unlink(missing_ok=True)
        return False  # another run's dump is under way
    os.close(fd)
    command = [sys.executable, "-m", "spark_backfill.jvm_archive", str(archive.path), str(archive.classes), java,
               class_path]
    subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                     start_new_session=True, close_fds=True)
    log.info("making a class archive for the JVM's start, in the background: %s", archive.path)
    return True


def dump(archive: Archive, java: str, class_path: str) -> int:
    """Make the archive from its class list (`java -Xshare:dump`): under a temporary name,
    renamed into place only if `java` succeeded (else `failed` is left). Returns `java`'s
    exit status."""
    temp = archive.path.with_name(f".{archive.path.name}.{os.getpid()}.tmp")
    try:
        done = subprocess.run(
            [java, "-Xshare:dump", f"-XX:SharedClassListFile={archive.classes}", f"-XX:SharedArchiveFile={temp}",
             "-cp", class_path, *_QUIET.split()],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False)
        if done.returncode == 0 and temp.exists():
            os.replace(temp, archive.path)
        else:
            archive.failed.write_bytes(done.stderr[-4000:])
        return done.returncode
    finally:
        for leftover in (temp, archive.lock, archive.classes):
            leftover.unlink(missing_ok=True)


if __name__ == "__main__":  # the detached dump (`start_dump`)
    os.nice(10)  # a background chore: the user's next work comes first
    sys.exit(dump(Archive(Path(sys.argv[1]), Path(sys.argv[2])), sys.argv[3], sys.argv[4]))
