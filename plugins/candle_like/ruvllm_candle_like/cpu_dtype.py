"""The float dtype this CPU computes fast, and the one warning for a bf16 it cannot compute natively.

torch runs bf16 matmuls (and, for SONA's training, their backward) in oneDNN's kernels only on
CPUs with native bf16 (AVX512_BF16, AMX-BF16 or Armv8.6 BF16, not masked by
``ONEDNN_MAX_CPU_ISA``); elsewhere they fall back to a slow single-threaded reference gemm. So
``dtype = "auto"`` asks :mod:`ruvllm.hardware` instead of assuming one machine, and an explicit
bfloat16 on a CPU without native bf16 still runs but says once what it costs: a slow run should
never be a mystery. candle_like and SONA both read :func:`cpu_info` through this module, so a
test emulates another CPU by patching it here.
"""

from __future__ import annotations

import logging

import torch
from ruvllm.hardware import BF16_WITHOUT_NATIVE_COST, cpu_info

log = logging.getLogger(__name__)

#: What was already warned about in this process: one warning each, however many loads.
_warned: set[str] = set()


def warn_once(key: str, message: str, *args: object) -> None:
    """``log.warning(message, *args)`` the first time ``key`` is seen in this process."""
    if key in _warned:
        return
    _warned.add(key)
    log.warning(message, *args)


def fast_cpu_dtype(*, int8_blocks: bool = False) -> torch.dtype:
    """What ``dtype = "auto"`` computes in on this CPU: bfloat16 only where it is native. But a
    model whose projections run on the int8-activation block kernel (``int8_blocks``) stays
    float32 between the kernels: on the AVX-512 kind its integer products outran oneDNN's bf16
    matmuls at every row count. Not on the AMX kind, whose bf16 matmuls run on AMX tiles and
    were not measured against it."""
    info = cpu_info()
    if info.fast_float_dtype() != "bfloat16" or (int8_blocks and info.kind != "amx"):
        return torch.float32
    return torch.bfloat16


def native_on(dtype: torch.dtype, device: torch.device) -> bool:
    """False only for bfloat16 on a CPU without native bf16 (the case torch runs slowly)."""
    return not (device.type == "cpu" and dtype == torch.bfloat16 and not cpu_info().native_bf16)


def bf16_note() -> str | None:
    """For capabilities notes: what auto picks on this CPU and why, when bf16 is not native."""
    missing = cpu_info().bf16_missing()
    if missing is None:
        return None
    return (f"dtype=auto computes in float32 on this CPU: {missing}; an explicit bfloat16 runs, "
            f"slowly: {BF16_WITHOUT_NATIVE_COST}")


def warn_if_slow(dtype: torch.dtype, device: torch.device, subject: str) -> None:
    """Log one warning per ``subject`` and process when ``dtype`` is bf16 on a CPU without native
    bf16, naming the missing CPU feature and the measured cost."""
    if native_on(dtype, device):
        return
    warn_once(f"{subject}: bf16", "%s: dtype=bfloat16 was asked for, but %s, so torch computes bf16 "
              "slowly here: %s. dtype=auto picks float32 on this CPU.", subject,
              cpu_info().bf16_missing(), BF16_WITHOUT_NATIVE_COST)
