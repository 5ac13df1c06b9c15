"""Which device MLX runs on here, and why (shown by ``ruvllm backends``)."""

from __future__ import annotations

import platform
import sys


def import_error() -> str | None:
    """Why MLX cannot be imported here, or None."""
    try:
        import ruvllm_mlx.mlx_core  # noqa: F401
    except Exception as exc:  # ImportError, or a missing shared library (OSError)
        hint = "pip install 'mlx[cpu]'" if sys.platform == "linux" else "pip install mlx"
        return f"MLX is not importable ({type(exc).__name__}: {exc}); {hint}"
    return None


def metal_available() -> bool:
    from ruvllm_mlx.mlx_core import mx

    return bool(mx.metal.is_available())


def device_and_notes() -> tuple[str, tuple[str, ...]]:
    """("metal" | "cpu", reasons a user might want to know)."""
    if import_error() is not None:
        return "cpu", ("MLX is not installed; the backend is unavailable",)
    if metal_available():
        return "metal", ("running on the Apple Silicon GPU through Metal",)
    from ruvllm_mlx import cpu_blas

    where = "on Linux" if sys.platform == "linux" else f"on {sys.platform}/{platform.machine()}"
    return "cpu", (
        f"Metal unavailable {where}; running on the CPU (mlx[cpu]), where weights are "
        f"dequantized to float32 by default because MLX's CPU quantized matmul is slower",
        *([cpu_blas.status] if cpu_blas.status else []),
    )
