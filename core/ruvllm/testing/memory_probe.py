"""How much memory this process holds, measured from outside any backend.

Two readings, for the conformance suite's state-growth test (and how it judges them,
:func:`growth_beyond_largest_step`):

- :func:`heap_in_use_bytes`: bytes the C allocator has handed out and not taken back (glibc's
  ``malloc_info``, every arena plus its mmapped chunks). PyTorch, llama.cpp, MLX and Rust's
  default allocator all allocate through it. This is the probe that sees a leak the size of a
  small model's KV: a process that has freed a lot (weights dequantized at load, prefill
  temporaries) serves new allocations from its free chunks, so a cache kept alive per request
  can grow the heap in use by tens of MiB while the resident set does not move at all
  (measured: candle_like keeping every request's cache, 49 calls: heap +10.7 MiB, RSS +0.00 MiB).
- :func:`rss_bytes`: resident memory, where the allocator cannot be asked (musl, macOS,
  Windows); it sees only leaks larger than the process's free pool.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import sys
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from typing import Any

_LIBC: Any = None


def _glibc() -> Any:
    """The C library with ``malloc_info`` and ``open_memstream``, or None (not glibc)."""
    global _LIBC
    if _LIBC is None:
        _LIBC = False
        if sys.platform.startswith("linux"):
            try:
                libc = ctypes.CDLL(None)
                libc.open_memstream.restype = ctypes.c_void_p
                libc.open_memstream.argtypes = [ctypes.POINTER(ctypes.c_void_p),
                                                ctypes.POINTER(ctypes.c_size_t)]
                libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
                libc.fclose.argtypes = [ctypes.c_void_p]
                libc.free.argtypes = [ctypes.c_void_p]
                _LIBC = libc
            except (OSError, AttributeError):
                pass
    return _LIBC or None


def heap_in_use_bytes() -> int | None:
    """Bytes allocated through the C allocator and not freed, or None where it cannot be read."""
    libc = _glibc()
    if libc is None:
        return None
    buf, size = ctypes.c_void_p(), ctypes.c_size_t()
    stream = libc.open_memstream(ctypes.byref(buf), ctypes.byref(size))
    if not stream:
        return None
    try:
        libc.malloc_info(0, stream)
    finally:
        libc.fclose(stream)
    try:
        text = ctypes.string_at(buf, size.value)
    finally:
        libc.free(buf)
    try:
        root = ET.fromstring(text)
        total = {e.get("type"): int(e.get("size", 0)) for e in root.findall("total")}
        system = {e.get("type"): int(e.get("size", 0)) for e in root.findall("system")}
        return system["current"] - total.get("fast", 0) - total.get("rest", 0) + total.get("mmap", 0)
    except (ET.ParseError, KeyError, ValueError):
        return None


def rss_bytes() -> int | None:
    """Resident memory of this process now, or None where it cannot be read."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        pass
    try:
        import psutil  # optional: macOS and Windows
    except ImportError:
        return None
    return int(psutil.Process().memory_info().rss)


def growth_beyond_largest_step(readings: Sequence[int]) -> int:
    """How much ``readings`` (memory after each call) grew from the first to the last, less the
    single largest rise between two consecutive readings.

    A leak is judged by what it adds up to, whatever its shape: one that grows every call and
    one that grows in lumps (every k-th call, or whenever a kept buffer is copied to a bigger
    one) both keep their total here, less one lump. A runtime that holds a buffer at some call
    boundaries and not at others (mistral.rs: 5.65 MiB, in 17 of 49 steps up or down), or that
    grows once, loses that one step and leaves only its noise. The median growth per call, which
    this replaces, is 0 for any leak that grows in fewer than half of the calls."""
    steps = [b - a for a, b in itertools.pairwise(readings)]
    return readings[-1] - readings[0] - max(0, *steps) if steps else 0
