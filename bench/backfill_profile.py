"""Where the backfill's time goes: per Spark stage, JVM against Python workers.

Not a test. Runs one `spark_backfill convert` in this process with Spark's event log on,
samples the CPU time of the JVM and of the Python workers (`/proc`, every 0.2 s) while it
runs, then prints one row per stage: its tasks, wall time, the executors' run and CPU
time (Spark's own task metrics), shuffle bytes, and the JVM's and the Python workers' CPU
seconds while the stage ran (stages that overlap share a sample; local[1] runs one at a time).

    python bench/backfill_profile.py --input DIR --master 'local[1]' [--out DIR] [-- convert flags]

`--python N` instead times each Python step of the transform on N lines in one process
(no Spark): the key pass, the conversion pass and the batches they build.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_TICK = os.sysconf("SC_CLK_TCK")


def _cpu(pid: int) -> float:
    """User + system CPU seconds of a process and its reaped children."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return -1.0
    return sum(int(v) for v in fields[11:15]) / _TICK


def _descendants(root: int) -> dict[int, str]:
    parents: dict[int, list[int]] = {}
    names: dict[int, str] = {}
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            text = Path(stat).read_text()
        except OSError:
            continue
        pid = int(stat.split("/")[2])
        names[pid] = text[text.index("(") + 1 : text.rindex(")")]
        parents.setdefault(int(text.rsplit(")", 1)[1].split()[1]), []).append(pid)
    found, todo = {}, [root]
    while todo:
        for kid in parents.get(todo.pop(), []):
            found[kid] = names[kid]
            todo.append(kid)
    return found


class Sampler(threading.Thread):
    """(time, JVM CPU s, Python workers' CPU s, driver CPU s) every `period` seconds."""

    def __init__(self, period: float = 0.2) -> None:
        super().__init__(daemon=True)
        self.period, self.samples, self.stop = period, [], threading.Event()
        self._last: dict[int, float] = {}

    def run(self) -> None:
        while not self.stop.wait(self.period):
            jvm = workers = 0.0
            for pid, name in _descendants(os.getpid()).items():
                cpu = _cpu(pid)
                if cpu < 0:  # gone: keep what it had
                    cpu = self._last.get(pid, 0.0)
                self._last[pid] = cpu
                if name == "java":
                    jvm += cpu
                elif name not in ("bash", "sh"):  # the JVM's Python daemon and workers
                    workers += cpu
            self.samples.append((time.time(), jvm, workers, _cpu(os.getpid())))


def _between(samples: list, start: float, end: float, column: int) -> float:
    inside = [s for s in samples if start <= s[0] <= end]
    before = [s for s in samples if s[0] < start]
    if not inside:
        return 0.0
    first = before[-1][column] if before else 0.0
    return max(s[column] for s in inside) - first


def _event_lines(log_dir: str) -> list[str]:
    """The event log's lines (rolling or not, zstd-compressed or not: Spark 4's defaults)."""
    lines: list[str] = []
    for path in sorted(glob.glob(os.path.join(log_dir, "**", "*events*"), recursive=True)):
        data = Path(path).read_bytes()
        if path.endswith(".zstd"):
            import zstandard

            data = zstandard.ZstdDecompressor().stream_reader(data).read()
        lines.extend(data.decode().splitlines())
    return lines


def stage_table(log_dir: str, samples: list) -> list[dict]:
    """One dict per completed stage, from the event log and the CPU samples."""
    rows = []
    for line in _event_lines(log_dir):
        event = json.loads(line)
        if event.get("Event") != "SparkListenerStageCompleted":
            continue
        info = event["Stage Info"]
        acc = {a["Name"]: a.get("Value") for a in info.get("Accumulables", [])}

        def metric(name: str, acc: dict = acc) -> float:
            return float(acc.get(f"internal.metrics.{name}", 0) or 0)

        start, end = info["Submission Time"] / 1000, info["Completion Time"] / 1000
        rows.append({
            "stage": info["Stage ID"], "name": info["Stage Name"].split(" at ")[0], "tasks": info["Number of Tasks"],
            "wall_s": end - start, "run_s": metric("executorRunTime") / 1000,
            "cpu_s": metric("executorCpuTime") / 1e9,
            "shuffle_write_mb": metric("shuffle.write.bytesWritten") / 1e6,
            "shuffle_read_mb": (metric("shuffle.read.remoteBytesRead") + metric("shuffle.read.localBytesRead")) / 1e6,
            "input_mb": metric("input.bytesRead") / 1e6,
            "jvm_cpu_s": _between(samples, start, end, 1), "python_cpu_s": _between(samples, start, end, 2),
        })
    return rows


def profile_spark(input_dir: str, master: str, out: str, flags: list[str], conf: dict[str, str]) -> None:
    if "PYTHONPATH" not in os.environ:  # else: the spark_backfill it names (another version's, for a baseline)
        sys.path.insert(0, str(ROOT))
    from spark_backfill.__main__ import run
    from spark_backfill.session import build_session

    log_dir = tempfile.mkdtemp(prefix="backfill-events-")
    sampler = Sampler()
    sampler.start()
    started = time.time()
    spark = build_session(master, extra_conf={"spark.ui.enabled": "false", "spark.eventLog.enabled": "true",
                                              "spark.eventLog.dir": log_dir, **conf})
    ready = time.time()
    status = run(spark, ["convert", "--input", input_dir, "--otlp-json-out", out, "--overwrite", *flags])
    done = time.time()
    spark.stop()
    sampler.stop.set()
    sampler.join()
    samples = sampler.samples
    Path(log_dir, "cpu-samples.json").write_text(json.dumps(samples))
    print(f"event log and CPU samples in {log_dir}")
    # The workers are gone by the last sample: their most is what they used.
    print(f"status {status}; session start {ready - started:.1f}s, job {done - ready:.1f}s; "
          f"CPU in all: JVM {max(s[1] for s in samples):.1f}s, Python workers {max(s[2] for s in samples):.1f}s, "
          f"driver {samples[-1][3]:.1f}s")
    print("| stage | what | tasks | wall s | task run s | task CPU s | JVM CPU s | Python CPU s | shuffle write MB "
          "| shuffle read MB |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in stage_table(log_dir, samples):
        print(f"| {r['stage']} | {r['name']} | {r['tasks']} | {r['wall_s']:.1f} | {r['run_s']:.1f} | {r['cpu_s']:.1f} "
              f"| {r['jvm_cpu_s']:.1f} | {r['python_cpu_s']:.1f} | {r['shuffle_write_mb']:.0f} "
              f"| {r['shuffle_read_mb']:.0f} |")


def profile_python(input_dir: str, n: int) -> None:
    """Seconds per 1,000 lines of each Python step of the transform, in one process."""
    import pyarrow as pa

    if "PYTHONPATH" not in os.environ:
        sys.path.insert(0, str(ROOT))
    import pyarrow.compute

    from nats_otel.archive import expand_inputs
    from nats_otel.core.decode import DecodeError, parse_archive_line
    from nats_otel.core.engine import convert_batch, prepare
    from spark_backfill import keys, transform

    lines: list[str] = []
    for path in expand_inputs([input_dir]):
        with open(path) as f:
            lines.extend(line.rstrip("\n") for line in f)
        if len(lines) >= n:
            break
    lines = lines[:n]
    settings = keys.ConvertSettings()

    def timed(label: str, fn) -> None:
        start = time.process_time()
        fn()
        took = time.process_time() - start
        print(f"{label:48} {took * 1e6 / len(lines):8.1f} us/line")

    def parse_only() -> None:
        for line in lines:
            parse_archive_line(line)

    def prepare_all() -> None:
        for line in lines:
            try:
                prepare(parse_archive_line(line), settings.limits)
            except DecodeError:
                pass

    batch = pa.RecordBatch.from_arrays([pa.array(lines), pa.array(["src"] * len(lines))], names=["value", "source"])
    timed("parse_archive_line", parse_only)
    timed("parse + prepare (decode)", prepare_all)
    keyed: list = []
    timed("key pass (keys._key_batches)", lambda: keyed.extend(keys._key_batches([batch], settings)))
    timed("convert_batch (whole input, one call)", lambda: convert_batch([parse_archive_line(x) for x in lines]))
    # The conversion's input: the keyed records sorted by context, as the shuffle gives them.
    table = pa.Table.from_batches(keyed).select(transform._GROUP_COLUMNS)
    table = table.take(pa.compute.sort_indices(table, [("ctx_key", "ascending")]))
    grouped = table.to_batches(max_chunksize=10_000)
    for label, columns in (("lean", transform.LEAN_COLUMNS), ("span table", transform.ROW_COLUMNS)):
        timed(f"conversion pass, {label} columns (_convert_groups)",
              lambda columns=columns: list(transform._convert_groups(grouped, settings, None, columns)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input", required=True)
    parser.add_argument("--master", default="local[1]")
    parser.add_argument("--out", default=None)
    parser.add_argument("--python", type=int, metavar="N", help="time the Python steps on N lines instead")
    parser.add_argument("--conf", action="append", default=[], metavar="K=V", help="a setting of the session")
    parser.add_argument("flags", nargs="*", help="extra convert flags (after --)")
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if args.python:
        profile_python(args.input, args.python)
    else:
        profile_spark(args.input, args.master, args.out or tempfile.mkdtemp(prefix="backfill-out-") + "/otlp",
                      args.flags, dict(item.split("=", 1) for item in args.conf))


if __name__ == "__main__":
    main()
