"""Output folders: written beside their final place, moved there only when every sink succeeded.

A job that fails (or is interrupted) half-way must leave neither a partial folder nor an
empty one, and `--overwrite` must not destroy the old output before the new one exists.
So each sink writes into a hidden sibling (`.NAME.incomplete-XXXXXXXX`: Spark and Hadoop
readers skip names starting with a dot), and `commit` moves them into place after the last
sink: part files renamed `part-00000.jsonl` (`.jsonl.gz`) where the sink writes JSON Lines,
checksum files (`.crc`, the local file system's own) removed. `abort` deletes the siblings
and any parent folder the run created.

The renames go through Hadoop's `FileSystem` in the driver's JVM, so they work on every
file system Spark writes to (local, HDFS, S3A, ...). A Spark Connect client has no JVM:
`DirectOutputs` lets Spark write straight into place, with its own file names.
"""

from __future__ import annotations

import contextlib
import logging
import re
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from spark_backfill.checks import UsageError

__all__ = [
    "DEFAULT_TARGET_FILE_BYTES",
    "DirectOutputs",
    "Outputs",
    "StagedOutputs",
    "jsonl_name",
    "local_folder",
    "open_outputs",
    "otlp_json_files",
]

log = logging.getLogger("spark_backfill")

# A file per 64 MiB of OTLP/JSON: large enough that a year of traces is not a million files,
# small enough for an editor, `jq`, or one task of the next job.
DEFAULT_TARGET_FILE_BYTES = 64 << 20


def otlp_json_files(estimated_bytes: int, target_bytes: int = DEFAULT_TARGET_FILE_BYTES) -> int:
    """How many OTLP/JSON files for about `estimated_bytes` of output: one per `target_bytes`."""
    return max(1, -(-estimated_bytes // max(1, target_bytes)))


# Spark's names for text and JSON part files: part-00003-<job uuid>-c000.txt[.gz]
_SPARK_PART = re.compile(r"^part-(\d+)-.*?\.(?:txt|json)(\.[a-z0-9]+)?$")


def jsonl_name(spark_name: str) -> str | None:
    """`part-00003.jsonl[.gz]` for a Spark text/JSON part file's name; None for other files."""
    match = _SPARK_PART.match(spark_name)
    if match is None:
        return None
    return f"part-{int(match.group(1)):05d}.jsonl{match.group(2) or ''}"


class Outputs(Protocol):
    """Where each sink writes, and what happens to it at the end."""

    mode: str  # the Spark save mode for the paths `stage` returns

    def stage(self, final: str, jsonl: bool = False) -> str: ...

    def commit(self) -> None: ...

    def abort(self) -> None: ...


@dataclass(slots=True)
class _Staged:
    final: Any  # org.apache.hadoop.fs.Path
    temp: Any
    jsonl: bool
    created: Any  # the topmost parent folder this run creates, or None


class StagedOutputs:
    """Outputs staged in hidden siblings, through the driver JVM's Hadoop `FileSystem`."""

    mode = "error"  # each staged folder is new (Spark Connect knows "error", not "errorifexists")

    def __init__(self, spark: Any, overwrite: bool) -> None:
        self._jvm = spark._jvm
        self._conf = spark._jsc.hadoopConfiguration()
        self._overwrite = overwrite
        self._staged: list[_Staged] = []
        self._run = uuid.uuid4().hex[:8]

    def _fs(self, path: Any) -> Any:
        fs = path.getFileSystem(self._conf)
        # The local file system writes a `.crc` beside every file; its raw twin moves and lists
        # the files alone.
        return fs.getRawFileSystem() if fs.getScheme() == "file" else fs

    def stage(self, final: str, jsonl: bool = False) -> str:
        """The folder a sink writes to instead of `final`; `UsageError` if `final` is in the way."""
        path = self._jvm.org.apache.hadoop.fs.Path(final)
        fs = self._fs(path)
        path = fs.makeQualified(path)
        if fs.exists(path):
            if not fs.getFileStatus(path).isDirectory():
                raise UsageError(f"output {final} is a file; give a folder")
            if len(fs.listStatus(path)) and not self._overwrite:
                raise UsageError(f"output {final} exists; pass --overwrite to replace it")
        created = None
        parent = path.getParent()
        while parent is not None and not fs.exists(parent):
            created, parent = parent, parent.getParent()
        temp = self._jvm.org.apache.hadoop.fs.Path(path.getParent(), f".{path.getName()}.incomplete-{self._run}")
        self._staged.append(_Staged(path, temp, jsonl, created))
        return temp.toString()

    def commit(self) -> None:
        """Move every staged folder into place (replacing what `--overwrite` allows)."""
        for staged in self._staged:
            fs = self._fs(staged.temp)
            if not fs.exists(staged.temp):
                continue  # the sink wrote nothing (it never ran)
            for status in fs.listStatus(staged.temp):
                name = status.getPath().getName()
                if name.endswith(".crc"):
                    fs.delete(status.getPath(), False)
                elif staged.jsonl and (new := jsonl_name(name)) is not None:
                    fs.rename(status.getPath(), self._jvm.org.apache.hadoop.fs.Path(staged.temp, new))
            if fs.exists(staged.final):
                # Checked by `stage`: empty, or --overwrite was given.
                fs.delete(staged.final, True)
            if not fs.rename(staged.temp, staged.final):
                raise OSError(f"could not move {staged.temp} to {staged.final}")
            log.info("output %s in place", staged.final)
        self._staged.clear()

    def abort(self) -> None:
        """Delete every staged folder, and the parent folders this run created if still empty."""
        for staged in self._staged:
            fs = self._fs(staged.temp)
            try:
                fs.delete(staged.temp, True)
                if staged.created is not None and fs.exists(staged.created) and _empty_tree(fs, staged.created):
                    fs.delete(staged.created, True)
            except Exception as exc:  # noqa: BLE001 - cleaning up after a failure: report, go on
                log.warning("could not remove %s: %s", staged.temp, exc)
        self._staged.clear()


def _empty_tree(fs: Any, path: Any) -> bool:
    """True if `path` holds folders only (no file anywhere below it)."""
    return all(s.isDirectory() and _empty_tree(fs, s.getPath()) for s in fs.listStatus(path))


class DirectOutputs:
    """Spark Connect: Spark writes into place under its own names (the client has no JVM to
    rename with); an existing folder is refused unless --overwrite."""

    def __init__(self, spark: Any, overwrite: bool) -> None:
        self._spark = spark
        self.mode = "overwrite" if overwrite else "error"

    def stage(self, final: str, jsonl: bool = False) -> str:
        if self.mode != "overwrite" and _exists_remotely(self._spark, final):
            raise UsageError(f"output {final} exists; pass --overwrite to replace it")
        return final

    def commit(self) -> None:
        pass

    def abort(self) -> None:
        pass


def _exists_remotely(spark: Any, path: str) -> bool:
    """Whether the Connect server sees `path`: a text source over it is resolved (no data read)."""
    from pyspark.errors import AnalysisException

    try:
        spark.read.text(path).schema  # noqa: B018 - resolving the relation is the check
    except AnalysisException as exc:
        if "PATH_NOT_FOUND" in str(exc):
            return False
        raise
    return True


def open_outputs(spark: Any, overwrite: bool) -> Outputs:
    """Staged outputs where the driver has a JVM, direct ones under Spark Connect."""
    from spark_backfill.session import is_remote

    return DirectOutputs(spark, overwrite) if is_remote(spark) else StagedOutputs(spark, overwrite)


@contextlib.contextmanager
def local_folder(final: str, overwrite: bool) -> Iterator[Path]:
    """A folder of this machine to fill in place of `final` (the report, written by Python):
    moved to `final` if the block succeeds, deleted if it fails."""
    target = Path(final).absolute()
    if target.exists() and any(target.iterdir()) and not overwrite:
        raise UsageError(f"output {final} exists; pass --overwrite to replace it")
    created = target.parent
    while not created.parent.exists():
        created = created.parent
    fresh = not created.exists()
    target.parent.mkdir(parents=True, exist_ok=True)
    temp = Path(tempfile.mkdtemp(prefix=f".{target.name}.incomplete-", dir=target.parent))
    try:
        yield temp
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        if fresh:
            shutil.rmtree(created, ignore_errors=True)
        raise
    if target.exists():
        shutil.rmtree(target)
    temp.chmod(0o755)  # mkdtemp's 0700 is not what a report folder needs
    temp.rename(target)
