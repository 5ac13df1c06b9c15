"""Optional faster CPU matmul for MLX on Linux: interpose an optimized ``sgemm_``.

The ``mlx[cpu]`` Linux wheel links the reference (netlib) BLAS: its ``cblas_sgemm`` calls a
plain Fortran ``sgemm_`` that ran at ~2-4 GFLOP/s here, and its cost grows linearly with the
batch, so batching sequences gained almost nothing (benchmarks/mlx_decode.py). The reference
``cblas_sgemm`` resolves ``sgemm_`` through the dynamic linker's global scope, so loading a
library that exports an optimized ``sgemm_`` (PyTorch's CPU library, which carries MKL and is
pinned in this project's set-up) with ``RTLD_GLOBAL`` *before* MLX is imported makes MLX's
matmuls use it: measured 30x faster at 16 rows with identical results (within float rounding).

It must run before the first ``import mlx.core`` of the process. It is the default when torch
is installed (``RUVLLM_MLX_BLAS=auto``); ``=bundled`` keeps MLX's own BLAS, ``=torch`` requires
torch's, and ``=/path/lib.so`` names another library exporting ``sgemm_``. The conformance suite on
mlx ran 2.5x faster with it (188 s vs 470 s, same machine and load). An earlier test process
aborted on the import after torch, llama.cpp and mistral.rs had been imported; with the pinned
versions, importing each of them (and all three) first, and generating with candle_like, llamacpp
and mistralrs before loading mlx in one process, all worked. MKL is limited to one thread
(``MKL_NUM_THREADS=1`` unless set) because its OpenMP workers spin-wait.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import sys
from pathlib import Path

ENV = "RUVLLM_MLX_BLAS"

#: What happened, for capabilities notes: None until :func:`preload` ran.
status: str | None = None


def _torch_library() -> Path | None:
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        return None
    lib = Path(spec.origin).parent / "lib" / "libtorch_cpu.so"
    return lib if lib.is_file() else None


def preload() -> str:
    """Interpose the optimized ``sgemm_`` if possible; return a one-line status."""
    global status
    if status is not None:
        return status
    choice = os.environ.get(ENV, "auto")
    if sys.platform != "linux" or choice == "bundled":
        status = f"CPU matmul: MLX's bundled BLAS (unset {ENV} to interpose torch's MKL sgemm, ~3x at C=16)"
        return status
    if "mlx.core" in sys.modules:
        status = "CPU matmul: MLX's bundled BLAS (MLX was imported before ruvllm_mlx could interpose)"
        return status
    lib = _torch_library() if choice in ("auto", "torch") else Path(choice)
    if lib is None:
        status = "CPU matmul: MLX's bundled reference BLAS (slow; install torch to interpose MKL's sgemm)"
        return status
    # MKL's OpenMP threads spin-wait; on a shared 2-core machine two of them collapsed decode
    # to ~1 tok/s, one thread did not. A user's MKL_NUM_THREADS still wins.
    os.environ.setdefault("MKL_NUM_THREADS", "1")
    try:
        ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
    except OSError as exc:
        status = f"CPU matmul: MLX's bundled BLAS ({lib.name} could not be loaded: {exc})"
        return status
    status = f"CPU matmul: sgemm_ interposed from {lib.name} (set {ENV}=bundled to disable)"
    return status
