"""Hand the heap that closed mistral.rs models freed back to the operating system before a load.

On CPU, mistral.rs refuses to load a model when its estimate (weights, KV cache for 4096 tokens,
activations) exceeds the machine's *available* memory at that moment: "This model does not fit
on the devices". It frees a closed model on its own engine and worker threads, into glibc's
per-thread malloc arenas, which keep the pages; the kernel counts them as used. Measured with the
embedded model converted to float32: 690 MB of anonymous memory with the LoRA runtime loaded,
361 MB after ``close()``, 69 MB after ``malloc_trim(0)``. A process that had closed a few models
(a test session, a server or benchmark that swaps models) so looked up to about a gigabyte short
of memory it actually had free, and the next load could be refused or not depending on what else
the machine was doing. Trimming right before each load makes the check see what is really free.
"""

from __future__ import annotations

import ctypes
import functools
import sys
from collections.abc import Callable


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        trim = ctypes.CDLL(None).malloc_trim  # glibc; absent from other C libraries
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


def release_freed_heap() -> None:
    """Return free heap pages to the OS (glibc ``malloc_trim(0)``); a no-op elsewhere."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
