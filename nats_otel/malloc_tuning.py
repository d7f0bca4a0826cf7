"""The C allocator's settings for the bridge's processes: freed memory kept for reuse.

What a trace message's bytes need that is larger than pymalloc's 512-byte blocks (its
payload, each read from the socket, each export request of a batch: ~1-4 MB) comes from
glibc's malloc. By default glibc gives such blocks back to the operating system as they
are freed: a block over its `mmap` threshold is unmapped at once, and the free top of a
heap is trimmed past its trim threshold, which start at 128 KiB and move with what was
freed last. The next burst, or the next batch's request, then touches fresh pages again:
each a page fault, the page cleared by the kernel, and the memory cgroup charged (a
profile of issue 48's 60k burst, docs/performance.md, session 43: the kernel ~28 % of the
bridge's CPU, page faults about half of it, most of them the link window's growth, which
no allocator setting avoids).

`keep_freed_memory` fixes both thresholds instead (which also stops glibc moving them):
blocks under 32 MiB come from the heaps and are reused when freed, and up to `keep_bytes`
of a heap's free top stays mapped; each heap grows 16 MiB at a time, not by what one
block asks. The memory a burst grew to stays the process's for the next one (bounded by
`batch.malloc_keep_mib` beyond what is in use). In issue 48's 60k burst: ~5 % fewer page
faults (0.95 a trace message against 1.00-1.04), and a few percent less CPU a message
(medians of 20 alternated bursts 13.30 against 13.65 µs; paired runs read 0.92 to 1.12:
docs/performance.md, session 43); a second burst on the same bridge 0.16 faults a message
against 0.25.

glibc only (`mallopt`); elsewhere (musl, macOS) nothing changes and the reason is returned.
Only in processes that asked for throughput tuning (the CLI's bridge, its workers), as
`gc_tuning`: a program embedding `Bridge` keeps its allocator as it is.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import platform

__all__ = ["MMAP_THRESHOLD", "TOP_PAD", "keep_freed_memory", "tune_malloc_for_throughput"]

log = logging.getLogger("nats_otel.bridge")

# mallopt's parameters (glibc's malloc.h)
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3

#: Blocks under this come from the heaps (glibc's largest fixed threshold: HEAP_MAX / 2 on
#: 64-bit), so a batch's request is reused once freed rather than mapped and unmapped.
MMAP_THRESHOLD = 32 << 20
#: How much a heap grows beyond what one allocation needs: fewer `brk` calls in a burst.
TOP_PAD = 16 << 20


def keep_freed_memory(keep_bytes: int) -> str | None:
    """Keep up to `keep_bytes` of freed memory per heap for reuse (0: glibc's defaults, as
    they are). None when applied; otherwise why not (not glibc, or mallopt refused)."""
    if keep_bytes <= 0:
        return "off (batch.malloc_keep_mib: 0)"
    libc_name, _ = platform.libc_ver()
    if libc_name != "glibc":
        return f"the C library is not glibc ({libc_name or 'unknown'}): its allocator is left as it is"
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        mallopt = libc.mallopt
    except (OSError, AttributeError) as exc:
        return f"glibc's mallopt is not available: {exc}"
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    # The mmap threshold first: setting any of the three stops glibc moving the others.
    for param, value in ((_M_MMAP_THRESHOLD, MMAP_THRESHOLD), (_M_TRIM_THRESHOLD, keep_bytes),
                         (_M_TOP_PAD, min(TOP_PAD, keep_bytes))):
        if mallopt(param, min(value, 2**31 - 1)) != 1:
            return f"glibc's mallopt refused parameter {param} = {value}"
    return None


def tune_malloc_for_throughput(keep_mib: int) -> None:
    """`batch.malloc_keep_mib` in this process: call once, before the message loop. Where it
    cannot apply (not glibc), the bridge runs on with the allocator as it is, and says so."""
    not_applied = keep_freed_memory(keep_mib << 20)
    if not_applied is not None and keep_mib > 0:
        log.info("batch.malloc_keep_mib not applied: %s", not_applied)
