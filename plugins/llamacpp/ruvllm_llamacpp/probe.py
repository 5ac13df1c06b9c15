"""llama.cpp's native probe: one token through the installed build, in a child process.

core's :mod:`ruvllm.native_probe` runs :func:`one_token` in a throwaway process before the
llamacpp backend is listed as available or selected, so that a build that cannot run on this
CPU (the AMX build on an Intel Xeon, or a wheel compiled on another machine) shows up as a
reason in ``ruvllm backends`` and ``auto`` moves on, instead of "Illegal instruction" ending the
user's process.
"""

from __future__ import annotations

import signal
from pathlib import Path

from ruvllm.errors import NativeProbeSkipped
from ruvllm.hardware import cpu_info
from ruvllm.native_probe import NativeProbe

from ruvllm_llamacpp import _lib

REBUILD = ("rebuild llama-cpp-python for this CPU: `make setup` in a ruvllm checkout, or "
           "`python -m ruvllm_llamacpp.native_build` (docs/hardware.md); until then pick another "
           "backend (`--backend candle_like`), which `auto` does by itself")


def native_probe() -> NativeProbe | None:
    """The probe for the installed llama-cpp-python, keyed by its version and library files."""
    if _lib.problem() is not None:
        return None
    return NativeProbe(target=f"{__name__}:one_token", build_id=build_id(), fix=fix)


def build_id() -> str:
    """The version and each shared library's size and modification time: a reinstall is probed
    again."""
    module_dir = Path(_lib.lib().__file__).parent
    files = sorted(module_dir.glob("lib/*.so*")) + sorted(module_dir.glob("lib/*.dylib"))
    stats = [f"{f.name}:{f.stat().st_size}:{f.stat().st_mtime_ns}" for f in files]
    return " ".join([_lib.version() or "unknown", *stats])


def system_info() -> str:
    """llama.cpp's own line of what the build uses (``AVX512 = 1 | AMX_INT8 = 1 | ...``)."""
    return _lib.lib().llama_print_system_info().decode("utf-8", errors="replace")


def fix(signum: int) -> str:
    """What to do when the probe died: name AMX when that is what this build runs on this CPU."""
    info = system_info()
    if signum == signal.SIGILL and cpu_info().kind == "amx" and "AMX_INT8 = 1" in info:
        return ("this llama-cpp-python build runs ggml's AMX kernels (AMX_INT8 = 1 in "
                "llama_print_system_info()), whose tile set-up GCC 12 miscompiles; " + REBUILD)
    if signum == signal.SIGILL:
        return f"the build uses instructions this CPU lacks (it may have been built on another); {REBUILD}"
    return REBUILD


def one_token() -> None:
    """Load the embedded model with a small context and decode a short prompt plus one token."""
    from ruvllm.errors import ModelNotFound
    from ruvllm.models import ModelSource
    from ruvllm.registry import embedded_model_path
    from ruvllm.types import GenerationParams

    from ruvllm_llamacpp.backend import LlamaCppBackend

    try:
        path = embedded_model_path()
    except ModelNotFound as exc:
        raise NativeProbeSkipped(str(exc)) from None
    with LlamaCppBackend.load(ModelSource.from_path(path), {"n_ctx": 64}) as backend:
        prompt = backend.tokenizer.encode("The sky is blue because")
        next(iter(backend.generate(prompt, GenerationParams(max_tokens=1))))
