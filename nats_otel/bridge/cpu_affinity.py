"""Which CPUs the bridge's processes run on (`batch.cpu_affinity`): all it may use (the
default), or one each.

A bridge of one worker keeps every thread on one CPU at a time anyway (the interpreter's
lock): its conversion, its event loop and its export threads hand the lock and the data
they share back and forth. Left to the scheduler, those threads land on different CPUs and
each hand-off moves the data between caches; held on one CPU, the bridge spent ~6 % less
CPU per trace message in issue 48's burst (the median of 29 paired rounds, 22 cheaper; the
rounds spread 0.7-1.4) and ~9 % less paced, with the same sustained rate
(docs/performance.md, session 40). Since the compiled kernel's batches are converted on the
event loop's thread (`processor_lane`), most of those hand-offs are gone, and so is most of
the gain: held on one CPU, 1.03 (6 paired rounds, 0.97-1.11, 4 cheaper; session 45).
Off by default: a bridge held on one CPU cannot move off
it when something else keeps that CPU busy, so it is for a host or container whose CPUs
the operator places (a dedicated core, Kubernetes' static CPU manager).

`plan` is pure: from the setting, the CPUs the process may use and the number of worker
processes, the CPU of each process (the bridge's own first, then each worker's, in turn
over the list; auto lists the highest CPU first). `apply` pins the calling thread, which
threads started later inherit: the CLI calls it before the bridge starts any (as it tunes
the collector), each worker process at its start. A program embedding `Bridge` keeps its
own placement.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["AffinityPlan", "apply", "check_setting", "parse_cpus", "plan", "process_cpus", "use_plan", "worker_cpus"]

OFF = "off"
AUTO = "auto"


@dataclass(frozen=True)
class AffinityPlan:
    """The CPU set of the bridge's own process and of each worker process (None: unpinned)."""

    bridge: frozenset[int] | None
    workers: tuple[frozenset[int] | None, ...]


def parse_cpus(text: str) -> tuple[int, ...]:
    """CPU numbers in the kernel's list form ("3", "0-3", "0,2-3"), in the order written,
    each once; ValueError for anything else."""
    cpus: list[int] = []
    for part in text.split(","):
        first, dash, last = part.strip().partition("-")
        if not first.isdigit() or (dash and not last.isdigit()):
            raise ValueError(f"not a CPU list: {text!r} (CPU numbers and ranges, e.g. 2 or 0-3 or 0,2-3)")
        low, high = int(first), int(last) if dash else int(first)
        if high < low:
            raise ValueError(f"not a CPU list: {text!r} (the range {part.strip()} runs backwards)")
        if high - low >= 4096:
            raise ValueError(f"not a CPU list: {text!r} (the range {part.strip()} is larger than any machine)")
        cpus += [cpu for cpu in range(low, high + 1) if cpu not in cpus]
    return tuple(cpus)


def check_setting(value: str) -> str:
    """`batch.cpu_affinity`'s form: off, auto or a CPU list (ValueError otherwise)."""
    value = value.strip().lower()
    if value not in (OFF, AUTO):
        parse_cpus(value)
    return value


def plan(setting: str, allowed: frozenset[int], workers: int = 1) -> AffinityPlan:
    """Each process's CPU: off, nothing pinned; auto, the CPUs this process may use, the
    highest first (CPU 0 is where a machine's device interrupts usually go: held on it here
    the bridge saved less, and lost in some rounds); a list, those,
    in that order (each must be one it may use: ValueError naming them otherwise). The
    bridge's own process gets the first, worker i the (i + 1)-th, round the list."""
    setting = check_setting(setting)
    if setting == OFF:
        return AffinityPlan(None, (None,) * (workers if workers > 1 else 0))
    if not allowed:
        raise ValueError("batch.cpu_affinity: this process may run on no CPU at all")
    cpus = sorted(allowed, reverse=True) if setting == AUTO else list(parse_cpus(setting))
    outside = [cpu for cpu in cpus if cpu not in allowed]
    if outside:
        raise ValueError(f"batch.cpu_affinity: CPU {', '.join(map(str, outside))} not among the CPUs this "
                         f"process may use ({_listed(allowed)})")
    picks = [frozenset({cpus[i % len(cpus)]}) for i in range(1 + (workers if workers > 1 else 0))]
    return AffinityPlan(picks[0], tuple(picks[1:]))


def process_cpus() -> frozenset[int]:
    """The CPUs this process may run on now; empty where the platform does not say."""
    getter = getattr(os, "sched_getaffinity", None)
    return frozenset(getter(0)) if getter is not None else frozenset()


def apply(cpus: frozenset[int] | None) -> None:
    """Pin the calling thread (and the threads it starts later) to `cpus`; None: nothing.
    OSError where the platform cannot (no `sched_setaffinity`) or refuses."""
    if cpus is None:
        return
    setter = getattr(os, "sched_setaffinity", None)
    if setter is None:
        raise OSError("batch.cpu_affinity: this platform cannot pin a process to CPUs (no sched_setaffinity)")
    setter(0, cpus)


# The plan the CLI applied in this process, for the worker processes it starts (None: the
# bridge runs where the scheduler puts it, as when it is embedded).
_applied: AffinityPlan | None = None


def use_plan(chosen: AffinityPlan) -> None:
    """Pin this process to the plan's bridge CPU and keep the plan for its workers."""
    global _applied
    apply(chosen.bridge)
    _applied = chosen


def worker_cpus(index: int) -> frozenset[int] | None:
    """The CPU set worker `index` pins itself to, per the applied plan (None: unpinned)."""
    if _applied is None or index >= len(_applied.workers):
        return None
    return _applied.workers[index]


def _listed(cpus: frozenset[int]) -> str:
    return ",".join(map(str, sorted(cpus)))
