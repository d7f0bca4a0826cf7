"""The bridge's allocator settings (`malloc_tuning`): a freed large block is kept and reused,
not unmapped; off leaves glibc as it is; elsewhere, a reason and nothing changed."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

from nats_otel.bridge.settings import SettingsError, load_settings
from nats_otel.malloc_tuning import keep_freed_memory

glibc_only = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's (not this C library)")

# Allocator settings are process-wide: measured in a fresh interpreter. glibc's `mallinfo2`
# says how many blocks are mapped on their own (`hblks`) and how much free memory the main
# heap keeps (`fordblks`). A 4 MiB block is over glibc's starting mmap threshold (128 KiB):
# by default it is mapped alone, and unmapped when freed; kept, it comes from the heap and
# the next one reuses it.
_PROBE = """
import ctypes, sys
from nats_otel.malloc_tuning import keep_freed_memory

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = (ctypes.c_size_t,)
libc.free.argtypes = (ctypes.c_void_p,)
keep = int(sys.argv[1])
why = keep_freed_memory(keep)
size = 4 << 20
before = libc.mallinfo2()
first = libc.malloc(size)
mapped_alone = libc.mallinfo2().hblks - before.hblks
ctypes.memset(first, 1, size)
libc.free(first)
kept_free = libc.mallinfo2().fordblks - before.fordblks
second = libc.malloc(size)
reused = second == first
libc.free(second)
print(mapped_alone, kept_free >= size, reused)
print(why)
"""


def probe(keep: int) -> tuple[str, str, str, str]:
    """(why not applied, blocks mapped alone, the freed block kept, the same block reused)"""
    done = subprocess.run([sys.executable, "-c", _PROBE, str(keep)], capture_output=True, text=True, check=True)
    counts, why = done.stdout.splitlines()
    mapped_alone, kept, reused = counts.split()
    return why, mapped_alone, kept, reused


@glibc_only
def test_kept_a_freed_block_stays_in_the_heap_and_is_reused():
    why, mapped_alone, kept, reused = probe(64 << 20)
    assert why == "None"
    assert mapped_alone == "0"  # from the heap, not a mapping of its own
    assert kept == "True"       # freed, still the process's
    assert reused == "True"     # the next block of its size takes the same memory


@glibc_only
def test_off_leaves_glibc_as_it_is():
    why, mapped_alone, kept, _ = probe(0)
    assert why.startswith("off")
    assert mapped_alone == "1"  # glibc's own threshold: 4 MiB is mapped alone...
    assert kept == "False"      # ...and given back when freed


def test_not_glibc_says_why_and_changes_nothing(monkeypatch):
    monkeypatch.setattr(platform, "libc_ver", lambda *a, **k: ("musl", ""))
    why = keep_freed_memory(64 << 20)
    assert why is not None and "not glibc" in why and "musl" in why


def settings(**batch: object) -> object:
    source = {"name": "a", "urls": ["nats://127.0.0.1:4222"], "subjects": ["trace.a"]}
    return load_settings(overrides={"sources": [source], "batch": batch}, env={})


def test_setting_defaults_and_bounds():
    assert settings().batch.malloc_keep_mib == 256
    assert settings(malloc_keep_mib=0).batch.malloc_keep_mib == 0
    for wrong in (-1, 2048):  # mallopt takes an int: at most 2,047 MiB
        with pytest.raises(SettingsError, match="malloc_keep_mib"):
            settings(malloc_keep_mib=wrong)
