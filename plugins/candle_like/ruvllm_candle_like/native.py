"""ruvllm's native CPU kernels (``csrc/``), built into one library when the plugin is installed.

``setup.py`` builds it on x86-64 (optional: no compiler, no library); it has no Python API and
is loaded with ctypes. Each kernel family says what it needs from the CPU through its own
``*_supported()`` entry point, and its Python module falls back to PyTorch with the reason.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
from typing import Any

#: The extension module setup.py builds.
LIBRARY = "ruvllm_candle_like._native"


def library_path() -> str | None:
    """The built library's file, found without loading it; None when it was not built."""
    spec = importlib.util.find_spec(LIBRARY)
    return None if spec is None else spec.origin


@functools.cache
def library() -> ctypes.CDLL | str:
    """The loaded library, or why there is none."""
    path = library_path()
    if path is None:
        return ("ruvllm's native kernels were not built (plugins/candle_like/setup.py builds them on x86-64 "
                "with a C++ compiler; reinstall the plugin to build them)")
    # torch loads its OpenMP runtime first; the library's libgomp.so.1 then resolves to the same
    # one, so both share one thread pool.
    return ctypes.CDLL(path)


def kernel(name: str, *, supported: str, needs: str, argtypes: list) -> Any:
    """The library's function ``name`` (returning an int status) with its argument types set, or
    why it cannot run here: no library, or ``supported()`` says this CPU lacks ``needs``."""
    lib = library()
    if isinstance(lib, str):
        return lib
    if not getattr(lib, supported)():
        return f"ruvllm's {name} kernel needs {needs}, which this CPU lacks"
    fn = getattr(lib, name)
    fn.argtypes = argtypes
    fn.restype = ctypes.c_int
    return fn
