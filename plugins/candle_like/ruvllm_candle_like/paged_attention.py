"""Decode attention read straight from the paged float16 pool (``csrc/paged_attention.cpp``).

The PyTorch path of a decode step gathers each sequence's K/V out of the pool, widens them to
float32 and pads the batch to its longest sequence before SDPA: three passes over the K/V. On the
2-core AVX2 kind, at 16 sequences of ~160 positions that was ~14 ms of a ~60 ms step. The native
kernel reads each position's K and V once from its slot. It serves the executor's decode rows
when the pool is float16 (the default beside float32 compute) and the library runs here; else,
and inside a compiled graph, the PyTorch path does.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

import torch

from ruvllm_candle_like import native

_POINTER = ctypes.c_void_p


@functools.cache
def _kernel() -> Any:
    return native.kernel("paged_decode_attention", supported="paged_attention_supported",
                         needs="AVX2, FMA and F16C", argtypes=[
                             _POINTER, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                             _POINTER, _POINTER, ctypes.c_int64, ctypes.c_int64, _POINTER, _POINTER,
                             ctypes.c_int])


def unavailable(pool: torch.Tensor, head_dim: int) -> str | None:
    """Why decode steps over ``pool`` cannot use the kernel, or None when they can."""
    fn = _kernel()
    if isinstance(fn, str):
        return fn
    if pool.dtype != torch.float16 or pool.device.type != "cpu":
        return f"the native decode attention reads a float16 CPU pool, not {pool.dtype} on {pool.device.type}"
    if head_dim % 8:
        return f"the native decode attention needs a head size that is a multiple of 8, not {head_dim}"
    return None


def decode(q: torch.Tensor, pool: torch.Tensor, gather: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """``q`` [B, H, D], one query per row, against pool slots ``gather`` [B, >= lengths[b]] (row
    b's first ``lengths[b]`` positions, in order) of ``pool`` [slots, 2, Hkv, D]; returns float32
    [B, H * D]. ``gather`` may be one sequence's slots expanded over the rows of its chunk."""
    fn = _kernel()
    assert not isinstance(fn, str), fn
    assert gather.dtype == torch.int64 and lengths.dtype == torch.int64 and lengths.is_contiguous()
    assert gather.stride(1) == 1
    b, h, d = q.shape
    q = q.to(torch.float32).contiguous()
    out = torch.empty(b, h * d)
    rc = fn(q.data_ptr(), b, h, pool.shape[2], d, pool.data_ptr(), gather.data_ptr(), gather.stride(0),
            gather.shape[1], lengths.data_ptr(), out.data_ptr(), torch.get_num_threads())
    if rc == -3:
        # Checked in the kernel's own pass over the lengths: no extra reduction a layer.
        raise ValueError(f"a sequence length is outside 1..{gather.shape[1]}, the positions gathered")
    if rc != 0:
        raise MemoryError(f"paged decode attention could not allocate scores for {gather.shape[1]} positions")
    return out


def chunk(q: torch.Tensor, pool: torch.Tensor, gather: torch.Tensor, start: int) -> torch.Tensor:
    """The rows of one sequence's chunk at positions ``start``.. (``q`` [T, H, D]), each over its
    own causal prefix of ``gather`` [>= start + T], exactly as if each were decoded alone."""
    t = q.shape[0]
    lengths = torch.arange(start + 1, start + t + 1, dtype=torch.int64)
    return decode(q, pool, gather[None, :].expand(t, -1), lengths)
