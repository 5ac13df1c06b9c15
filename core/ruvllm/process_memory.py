"""Handing the memory a model load freed back to the operating system.

Loading a model allocates far more than it keeps: a GGUF's tensors are repacked, a tokenizer is
built from Python lists, and the transients are freed. glibc keeps freed memory in its arenas
for reuse, so it stays resident: the load runs on the engine's model thread, whose own arena
then held ~20 MB of nothing for the server's whole life (candle_like on the embedded model,
measured on an idle server). ``malloc_trim(0)`` returns the free pages of every arena.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
from typing import Any

log = logging.getLogger(__name__)


@functools.cache
def _libc() -> Any:
    name = ctypes.util.find_library("c")
    return None if name is None else ctypes.CDLL(name)


def release_freed_memory() -> None:
    """Give the allocator's free pages back to the OS, where the C library offers it (glibc's
    ``malloc_trim``); a no-op elsewhere (musl, macOS, Windows), whose allocators return memory
    on their own terms."""
    libc = _libc()
    trim = getattr(libc, "malloc_trim", None) if libc is not None else None
    if trim is None:
        return
    trim.argtypes = [ctypes.c_size_t]
    trim(0)
    log.debug("returned the allocator's free pages to the OS (malloc_trim)")
