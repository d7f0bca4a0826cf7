"""Backfill throughput: local[1] vs local[2], driver memory as input grows, vs one process.

Not a test. Generates --messages trace messages by replicating the corpus with fresh trace
ids (and fresh ad-hoc subjects).

`--per-core 200000 1000000` (the issue-38 scenario): whole commands as a user runs them,
start-up included - `nats-otel convert IN -o OUT`, then `python -m spark_backfill convert
--input IN --otlp-json-out D` at `--master local[1]` and `local[2]` - in turns, `--rounds`
times per size; each Spark run as a ratio of the convert of its own turn, and per core;
peak RSS of the driver, the JVM and the Python workers; the outputs compared byte for byte.

Otherwise it runs, each in its own process so memory figures are its own:

- `spark_backfill` convert -> OTLP/JSON at local[2] on 1/4, 1/2 and all of the input
  (driver RSS as input grows), and at local[1] on all of it (the local[2]/local[1] ratio);
- `convert_batch` + OTLP/JSON lines in one process (what `nats-otel convert` does).

Times exclude JVM and Python-worker start-up (a warm-up run on the corpus comes first).

    python bench/backfill_throughput.py                  # 1M messages (~25 min on 2 cores)
    python bench/backfill_throughput.py --messages 20000 # quick check
    python bench/backfill_throughput.py --output-files --messages 200000  # file layouts
    python bench/backfill_throughput.py --per-core 200000 1000000 --rounds 2  # whole commands
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import glob
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "tests" / "data" / "corpus"


# --- input generation --------------------------------------------------------------------


def _templates() -> list[tuple[str, str, str]]:
    """(subject template, payload JSON template, original trace id) per corpus record.

    In the templates {T} is the trace id and {R} the replica number.
    """
    from nats_otel.core.decode import DecodeLimits, decode, decompress, parse_archive_line
    from nats_otel.core.ids import trace_context

    out = []
    for path in sorted(glob.glob(str(CORPUS / "*.jsonl"))):
        with open(path, "rb") as f:
            for line in f:
                raw = parse_archive_line(line)
                text = decompress(raw.payload, raw.header("Content-Encoding"), DecodeLimits()).decode()
                ctx = trace_context(decode(raw), raw.subject)
                subject = raw.subject or ""
                if ctx.adhoc_key is None:
                    text = text.replace(ctx.trace_id.hex(), "{T}")
                else:
                    text = text.replace(ctx.adhoc_key, ctx.adhoc_key + ".r{R}")
                    subject = subject.replace(ctx.adhoc_key, ctx.adhoc_key + ".r{R}")
                text = text.replace("{", "{{").replace("}", "}}").replace("{{T}}", "{T}").replace("{{R}}", "{R}")
                out.append((subject, text, ctx.trace_id.hex()))
    return out


def generate(folder: Path, messages: int, files: int = 16) -> int:
    """Write `messages` archive lines into `files` JSONL files; returns bytes written."""
    templates = _templates()
    folder.mkdir(parents=True, exist_ok=True)
    written = replica = count = 0
    with contextlib.ExitStack() as stack:
        outs = [stack.enter_context(open(folder / f"part-{i:03d}.jsonl", "wb")) for i in range(files)]
        while count < messages:
            fresh: dict[str, str] = {}
            for subject, template, original in templates:
                if count >= messages:
                    break
                # A fresh trace id per corpus trace and replica: same trace structure, new traces.
                trace = fresh.setdefault(original, os.urandom(16).hex())
                payload = template.format(T=trace, R=replica).encode()
                line = orjson.dumps({"subject": subject.format(R=replica) if "{R}" in subject else subject,
                                     "headers": {}, "payload_b64": base64.b64encode(payload).decode()}) + b"\n"
                outs[count % files].write(line)
                written += len(line)
                count += 1
            replica += 1
    return written


# --- one measured run (a child process) --------------------------------------------------


def _rss_kib(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of a process in KiB."""
    values = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(("VmRSS:", "VmHWM:")):
                values[line.split(":")[0]] = int(line.split()[1])
    except OSError:
        return 0, 0
    return values.get("VmRSS", 0), values.get("VmHWM", 0)


def _children(pid: int) -> list[int]:
    kids = []
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            fields = Path(stat).read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            kids.append(int(stat.split("/")[2]))
    return kids


def _java_pids() -> list[int]:
    todo, found = [os.getpid()], []
    while todo:
        pid = todo.pop()
        for kid in _children(pid):
            todo.append(kid)
            try:
                if "java" in Path(f"/proc/{kid}/comm").read_text():
                    found.append(kid)
            except OSError:
                pass
    return found


def child_spark(folder: str, master: str, out: str, *flags: str) -> dict:
    """One measured convert; `flags` are extra convert flags, `--spark-default-shuffle` first
    for Spark's own shuffle partitions (200) instead of two per core."""
    sys.path.insert(0, str(ROOT))
    from spark_backfill.__main__ import run
    from spark_backfill.session import build_session

    shuffle = None if flags[:1] == ("--spark-default-shuffle",) else int(master[6:-1]) * 2
    flags = flags[1:] if shuffle is None else flags
    spark = build_session(master, shuffle_partitions=shuffle, extra_conf={"spark.ui.enabled": "false"})
    # Warm-up on the corpus: Python workers start and import their modules once (~20s).
    run(spark, ["convert", "--input", *sorted(glob.glob(str(CORPUS / "*.jsonl"))), "--otlp-json-out", out + "-warmup",
                "--overwrite"])
    start = time.monotonic()
    status = run(spark, ["convert", "--input", folder, "--otlp-json-out", out, "--overwrite", *flags])
    elapsed = time.monotonic() - start
    jvm = [_rss_kib(p) for p in _java_pids()]
    spark.stop()
    files = [p for p in Path(out).iterdir() if p.name.startswith("part-")]
    return {"status": status, "seconds": elapsed, "files": len(files),
            "out_bytes": sum(p.stat().st_size for p in files),
            "driver_py_maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "driver_jvm_rss_mib": sum(r for r, _ in jvm) / 1024, "driver_jvm_hwm_mib": sum(h for _, h in jvm) / 1024}


def child_single(folder: str, out: str) -> dict:
    from _core_api import hot_path

    from nats_otel.archive import expand_inputs, read_archive
    from nats_otel.core.encode import split_by_trace, to_otlp_json_line
    from nats_otel.core.pipeline import Converted

    convert_batch = hot_path().convert_batch

    start = time.monotonic()
    results = convert_batch(read_archive(expand_inputs([folder])))
    spans = [s for r in results if isinstance(r, Converted) for s in r.spans]
    with open(out, "wb") as f:
        for trace in split_by_trace(spans):
            f.write(to_otlp_json_line(trace))
    return {"status": 0, "seconds": time.monotonic() - start,
            "driver_py_maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def _load() -> str:
    """The 1-minute load average and the busiest processes not ours: this box is shared."""
    load = Path("/proc/loadavg").read_text().split()[0]
    top = subprocess.run(["top", "-bn1", "-w", "200"], capture_output=True, text=True).stdout.splitlines()
    mine = {os.getpid(), *(_children(os.getpid()))}
    busy = []
    for line in top[7:12]:
        cols = line.split(None, 11)
        if len(cols) == 12 and float(cols[8]) >= 20 and int(cols[0]) not in mine:
            busy.append(f"{cols[11][:40]} {cols[8]}%")
    return f"load {load}" + (f"; busy: {', '.join(busy)}" if busy else "")


def measure(kind: str, *args: str) -> dict:
    before = _load()
    proc = subprocess.run([sys.executable, __file__, "--child", kind, *args], capture_output=True, text=True)
    if proc.returncode != 0:
        # The JVM's own error (OutOfMemoryError, say) comes long before the Python traceback
        # that ends stderr: show the first such lines too, not only the tail.
        causes = [line for line in proc.stderr.splitlines() if "Error" in line and not line.startswith((" ", "\t"))]
        raise SystemExit(f"{kind} {args} failed; first errors:\n" + "\n".join(dict.fromkeys(causes[:5]))
                         + f"\n... last of stderr:\n{proc.stderr[-3000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["load_before"], result["load_after"] = before, _load()
    return result


def output_files(work: Path, n: int, rounds: int = 2) -> None:
    """The OTLP/JSON output as a user's default run gets it (Spark's 200 shuffle partitions):
    files by trace range over the shuffle partitions (the old default, the baseline), by size
    (the default now), and by size gzip-compressed; same input, as ratios. The machine is
    shared: the layouts take turns, `rounds` times, and each keeps its best run."""
    folder = work / f"in-{n}"
    written = generate(folder, n)
    print(f"generated {n} messages ({written / 1e6:.0f} MB)", flush=True)
    layouts = (("200 files (shuffle partitions)", ["--otlp-json-files", "200"]),
               ("by size (64 MiB files)", []),
               ("by size, gzip", ["--compress", "gzip"]))
    best: dict[str, dict] = {}
    for turn in range(rounds):
        for index, (label, flags) in enumerate(layouts):
            out = str(work / f"out-{index}")
            result = measure("spark", str(folder), "local[2]", out, "--spark-default-shuffle", *flags)
            result.update(label=label, rate=n / result["seconds"], turn=turn)
            print(f"{label:32} {result['seconds']:7.1f}s {result['rate']:7.0f} msg/s  {result['files']:4d} files "
                  f"{result['out_bytes'] / 1e6:8.1f} MB  [{result['load_before']} | after: {result['load_after']}]",
                  flush=True)
            if label not in best or result["rate"] > best[label]["rate"]:
                best[label] = result
    base = best[layouts[0][0]]["rate"]
    print("best of each, throughput vs 200 files: "
          + ", ".join(f"{label}: {best[label]['rate'] / base:.2f}" for label, _ in layouts[1:]))
    (work / "output-files.json").write_text(json.dumps(list(best.values()), indent=2))


# --- whole commands, as a user runs them -------------------------------------------------


_TICK = os.sysconf("SC_CLK_TCK")


def _tree(root: int) -> dict[int, tuple[str, int, float]]:
    """pid -> (role, RSS KiB, CPU s) for a process tree now: the driver (`root`), the JVMs,
    the Python workers. A process's own CPU only (a reaped child's is in its parent's
    `cutime`, and also in our last sample of it: counted once)."""
    out = {}
    todo = [(root, "driver")]
    while todo:
        pid, role = todo.pop()
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        if pid != root:
            role = "jvm" if name == "java" else "workers" if name.startswith("python") else "other"
        cpu = sum(int(v) for v in stat.rsplit(")", 1)[1].split()[11:13]) / _TICK
        out[pid] = (role, _rss_kib(pid)[0], cpu)
        todo.extend((kid, role) for kid in _children(pid))
    return out


def whole(command: list[str]) -> dict:
    """Run one command as a whole process: wall seconds, peak RSS (MiB) of its driver, its
    JVM and its Python workers, and their CPU seconds (the driver's from the kernel; the
    others sampled every 0.2 s: what they used after our last look is missed)."""
    start = time.monotonic()
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    peak = {"driver": 0, "jvm": 0, "workers": 0}
    cpu: dict[int, tuple[str, float]] = {}
    while True:
        reaped, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if reaped:
            break
        rss: dict[str, int] = {}
        for pid, (role, kib, seconds) in _tree(proc.pid).items():
            rss[role] = rss.get(role, 0) + kib
            cpu[pid] = (role, seconds)
        for role in peak:
            peak[role] = max(peak[role], rss.get(role, 0))
        time.sleep(0.2)
    seconds = time.monotonic() - start
    # The driver's own, from the kernel (pyspark does not wait for its JVM: not in it).
    cpu[proc.pid] = ("driver", usage.ru_utime + usage.ru_stime)
    proc.returncode = os.waitstatus_to_exitcode(status)
    stderr = proc.stderr.read() if proc.stderr else ""
    if proc.returncode != 0:
        raise SystemExit(f"{command} failed ({proc.returncode}):\n{stderr[-3000:]}")
    totals = {f"{role}_cpu_s": sum(c for r, c in cpu.values() if r == role) for role in ("driver", "jvm", "workers")}
    return {"seconds": seconds, **{f"{k}_mib": v / 1024 for k, v in peak.items()}, **totals}


def commands(folder: str, out: Path) -> dict[str, list[str]]:
    """The issue's scenario: `nats-otel convert` and the backfill at local[1] and local[2],
    each writing OTLP/JSON, each a whole process (start-up included)."""
    bin_dir = Path(sys.executable).parent
    spark = [sys.executable, "-m", "spark_backfill", "convert", "--input", folder, "--overwrite", "--otlp-json-out"]
    return {
        "convert": [str(bin_dir / "nats-otel"), "convert", folder, "-o", str(out / "convert.jsonl"), "--quiet"],
        "local[1]": [*spark, str(out / "local1"), "--master", "local[1]"],
        "local[2]": [*spark, str(out / "local2"), "--master", "local[2]"],
    }


def _wait_for_dump(cache: Path) -> None:
    """Until the JVM class archive's background dump (after a cold run) is over: its CPU
    must not count against the next command."""
    while cache.exists() and any(cache.glob(".*.dumping")):
        time.sleep(0.5)


def per_core(work: Path, sizes: list[int], rounds: int) -> None:
    """Whole commands in turns (convert, local[1], local[2]), `rounds` times per size: each
    Spark run beside the convert of its own round, as a ratio (the machine is shared and its
    speed drifts), and per core (local[n] / n x convert). Same spans checked by bytes."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # The JVM's class archive (spark_backfill/jvm_archive.py) in a folder of the bench's own:
    # the first Spark run starts without one (and makes it), every later run from it.
    cache = work / "jvm-cache"
    os.environ["NATS_OTEL_CACHE"] = str(cache)
    os.environ.pop("NATS_OTEL_SPARK_ARCHIVE", None)
    results = []
    for size in sizes:
        folder = work / f"in-{size}"
        if not folder.exists():
            generate(folder, size)
        for turn in range(rounds):
            out = work / f"out-{size}"
            out.mkdir(exist_ok=True)
            row: dict = {"messages": size, "turn": turn, "load_before": _load()}
            for label, command in commands(str(folder), out).items():
                warm = cache.exists() and any(cache.glob("spark-*.jsa"))
                row[label] = whole(command)
                row[label]["archive"] = "-" if label == "convert" else "warm" if warm else "cold"
                _wait_for_dump(cache)
            reference = (out / "convert.jsonl").read_bytes()
            for label in ("local[1]", "local[2]"):
                produced = b"".join(p.read_bytes() for p in sorted((out / label.replace("[", "").replace("]", ""))
                                                                   .glob("part-*")))
                row[label]["same_bytes"] = produced == reference
            row["load_after"] = _load()
            results.append(row)
            base, base_cpu = row["convert"]["seconds"], row["convert"]["driver_cpu_s"]
            print(f"{size:>9} msgs turn {turn}: convert {base:6.1f}s ({size / base:7.0f} msg/s, "
                  f"{base_cpu:.1f} CPU-s, {row['convert']['driver_mib']:.0f} MiB)", flush=True)
            for label, cores in (("local[1]", 1), ("local[2]", 2)):
                r = row[label]
                ratio = base / r["seconds"]
                cpu = r["driver_cpu_s"] + r["jvm_cpu_s"] + r["workers_cpu_s"]
                print(f"{'':>9}      {label}: {r['seconds']:6.1f}s ({size / r['seconds']:7.0f} msg/s) "
                      f"= {ratio:.2f}x convert, {ratio / cores:.2f} per core; same bytes {r['same_bytes']}; "
                      f"CPU-s {cpu:.1f} (JVM {r['jvm_cpu_s']:.1f}, Python workers {r['workers_cpu_s']:.1f}, "
                      f"driver {r['driver_cpu_s']:.1f}): convert/this {base_cpu / cpu:.2f}; "
                      f"peak RSS driver {r['driver_mib']:.0f} MiB, JVM {r['jvm_mib']:.0f} MiB, "
                      f"Python workers {r['workers_mib']:.0f} MiB; JVM class archive {r['archive']}", flush=True)
            print(f"{'':>9}      [{row['load_before']} | after: {row['load_after']}]", flush=True)
    (work / "per-core.json").write_text(json.dumps(results, indent=2))
    print(f"results in {work / 'per-core.json'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--workdir", help="keep generated input and outputs here (default: a temp dir)")
    parser.add_argument("--output-files", action="store_true",
                        help="compare the OTLP/JSON file layouts instead (output_files)")
    parser.add_argument("--per-core", nargs="+", type=int, metavar="N",
                        help="whole commands at these sizes instead: convert, local[1], local[2] (per_core)")
    parser.add_argument("--rounds", type=int, default=2, help="turns of each command per size (--per-core)")
    parser.add_argument("--child", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, *rest = args.child
        result = child_spark(*rest) if kind == "spark" else child_single(*rest)
        print(json.dumps(result))
        return
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="backfill-bench-"))
    if args.per_core:
        per_core(work, args.per_core, args.rounds)
        return
    n = args.messages
    if args.output_files:
        output_files(work, n)
        return
    sizes = sorted({max(1, n // 4), max(1, n // 2), n})
    inputs = {}
    for size in sizes:
        start = time.monotonic()
        written = generate(work / f"in-{size}", size)
        inputs[size] = str(work / f"in-{size}")
        print(f"generated {size} messages ({written / 1e6:.0f} MB) in {time.monotonic() - start:.1f}s", flush=True)
    rows = []
    for label, kind, size, extra in (
        *[("spark local[2]", "spark", s, ["local[2]"]) for s in sizes],
        ("spark local[1]", "spark", n, ["local[1]"]),
        ("convert_batch, 1 process", "single", n, []),
    ):
        out = str(work / f"out-{label.split()[-1].strip('[],')}-{size}")
        result = measure(kind, inputs[size], *extra, out + (".jsonl" if kind == "single" else ""))
        result.update(label=label, kind=kind, messages=size, rate=size / result["seconds"])
        rows.append(result)
        print(f"{label:26} {size:>9} msgs {result['seconds']:8.1f}s {result['rate']:9.0f} msg/s  "
              f"driver py maxrss {result['driver_py_maxrss_mib']:7.0f} MiB  "
              f"jvm rss {result.get('driver_jvm_rss_mib', 0):6.0f} MiB (hwm {result.get('driver_jvm_hwm_mib', 0):.0f})"
              f"  [{result['load_before']} | after: {result['load_after']}]", flush=True)
    one = next(r for r in rows if r["label"] == "spark local[1]")
    two = next(r for r in rows if r["label"] == "spark local[2]" and r["messages"] == n)
    print(f"local[2]/local[1] throughput ratio: {two['rate'] / one['rate']:.2f}")
    single = next(r for r in rows if r["kind"] == "single")
    print(f"local[2]/convert_batch throughput ratio: {two['rate'] / single['rate']:.2f}")
    growth = [r for r in rows if r["label"] == "spark local[2]"]
    print("driver memory by input size (local[2]): "
          + ", ".join(f"{r['messages']}: python {r['driver_py_maxrss_mib']:.0f} MiB, "
                      f"jvm {r['driver_jvm_hwm_mib']:.0f} MiB" for r in growth))
    (work / "results.json").write_text(json.dumps(rows, indent=2))
    print(f"results in {work / 'results.json'}")


if __name__ == "__main__":
    main()
