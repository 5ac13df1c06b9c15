"""Attention read straight from the paged float16 pool (``csrc/paged_attention.cpp``).

The PyTorch path of a decode step gathers each sequence's K/V out of the pool, widens them to
float32 and pads the batch to its longest sequence before SDPA: three passes over the K/V. On the
2-core AVX2 kind, at 16 sequences of ~160 positions that was ~14 ms of a ~60 ms step. The native
kernel reads each position's K and V once from its slot. It serves every decode row and every row
of the chunks ``executor.on_native_kernel`` gives it (:class:`PoolRows`) when the pool is float16
(the default beside float32 compute) and the library runs here; else, and inside a compiled graph,
the PyTorch path does.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np
import torch

from ruvllm_candle_like import native

_POINTER = ctypes.c_void_p


@functools.cache
def _kernel() -> Any:
    return native.kernel("paged_attention_rows", supported="avx2_fma_f16c_supported",
                         needs="AVX2, FMA and F16C", argtypes=[
                             _POINTER, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                             ctypes.c_int64, _POINTER, _POINTER, ctypes.c_int64, _POINTER, _POINTER, _POINTER,
                             ctypes.c_int])


def unavailable(pool: torch.Tensor, head_dim: int) -> str | None:
    """Why attention over ``pool`` cannot use the kernel, or None when it can."""
    fn = _kernel()
    if isinstance(fn, str):
        return fn
    if pool.dtype != torch.float16 or pool.device.type != "cpu":
        return f"the native decode attention reads a float16 CPU pool, not {pool.dtype} on {pool.device.type}"
    if head_dim % 8:
        return f"the native decode attention needs a head size that is a multiple of 8, not {head_dim}"
    return None


@attrs.frozen
class PoolRows:
    """Which pool slots each row of a step attends over, for the kernel: row ``r`` reads the
    ``lengths[r]`` slots at ``slots[starts[r]:]``, in position order; a length of 0 leaves the row
    to another kernel (the rows of a long prompt chunk). All int64 CPU tensors."""

    #: Every entry's slots, one after another.
    slots: torch.Tensor
    starts: torch.Tensor
    lengths: torch.Tensor

    @classmethod
    def of_entries(cls, gathers: Sequence[np.ndarray], starts: Sequence[int], counts: Sequence[int],
                   native: Sequence[bool]) -> PoolRows:
        """Rows of entries given, each, as the slots of its positions 0..``start + count - 1``,
        its first new position ``start`` and its ``count`` new rows; an entry not ``native``
        gets length 0 on each of them (someone else attends it)."""
        row_starts: list[np.ndarray] = []
        row_lengths: list[np.ndarray] = []
        offset = 0
        for gather, start, count, here in zip(gathers, starts, counts, native, strict=True):
            row_starts.append(np.full(count, offset, dtype=np.int64))
            lengths = np.arange(start + 1, start + count + 1, dtype=np.int64)
            row_lengths.append(lengths if here else np.zeros(count, dtype=np.int64))
            offset += len(gather)
        return cls(torch.from_numpy(np.concatenate(gathers)), torch.from_numpy(np.concatenate(row_starts)),
                   torch.from_numpy(np.concatenate(row_lengths)))


def attend(q: torch.Tensor, pool: torch.Tensor, rows: PoolRows) -> torch.Tensor:
    """``q`` [T, H, D], one query a row (a strided view of a wider row is read in place), against
    ``pool`` [slots, 2, Hkv, D] as ``rows`` says -> float32 [T, H * D]. Rows of length 0 are left
    uninitialised, for the caller to fill."""
    fn = _kernel()
    assert not isinstance(fn, str), fn
    t, h, d = q.shape
    if q.dtype != torch.float32 or q.stride(2) != 1 or q.stride(1) != d:
        q = q.to(torch.float32).contiguous()
    out = torch.empty(t, h * d)
    rc = fn(q.data_ptr(), q.stride(0), t, h, pool.shape[2], d, pool.data_ptr(), rows.slots.data_ptr(),
            rows.slots.shape[0], rows.starts.data_ptr(), rows.lengths.data_ptr(), out.data_ptr(),
            torch.get_num_threads())
    if rc == -3:
        # Checked in the kernel's own pass over the rows: no extra reduction a layer.
        raise ValueError(f"a row's slots run past the {rows.slots.shape[0]} slots given")
    if rc != 0:
        raise MemoryError(f"paged attention could not allocate scores for {t} rows")
    return out
