"""Which kernel each projection matrix gets: the GGUF's blocks as codes, or dense.

A fused matrix (q/k/v, gate/up) runs on its codes when every part maps onto codes
(:func:`ruvllm_candle_like.block_codes.block_codes`), in the widest part's width; one part in a
type with no mapping (a Q3_K ``attn_v``) makes the whole matrix dense, dequantised exactly.
5-bit and 8-bit codes need ruvllm's block kernel; where it cannot run, only 4-bit ones take torch's.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import numpy as np
import torch

from ruvllm_candle_like import blockmm
from ruvllm_candle_like.block_codes import BlockCodes, GgufBlocks, codes_or_log, concat
from ruvllm_candle_like.cpu_dtype import warn_once
from ruvllm_candle_like.int4 import PackedInt4
from ruvllm_candle_like.projection import BlockProjection, Projection, QuantizedKernel, pack_weight

#: A weight as the loader hands it over: a tensor, or a GGUF tensor's blocks.
Weight = torch.Tensor | GgufBlocks
AnyProjection = Projection | BlockProjection


def as_tensor(weight: Weight) -> torch.Tensor:
    """The weight as a float tensor (GGUF blocks dequantised exactly, as llama.cpp does)."""
    return torch.from_numpy(weight.dequantize()) if isinstance(weight, GgufBlocks) else weight


@attrs.frozen(kw_only=True)
class ProjectionFactory:
    """Builds the model's projections on one device and dtype."""

    dtype: torch.dtype
    device: torch.device
    #: Keep oneDNN-packed copies of dense weights (projection.py).
    prepack: bool = True
    #: Run projections whose GGUF blocks map onto codes (block_codes.py) on them (CPU only): on
    #: ruvllm's block kernel, else torch's int4 kernel.
    int4: bool = False
    #: With int4: also keep a dense copy, taken by calls of at least this many rows (None: no copy).
    dense_rows: int | None = None
    #: With int4 on ruvllm's block kernel: quantise activations to int8 (blockmm.py).
    int8: bool = False

    def __call__(self, parts: Sequence[tuple[str, Weight]],
                 bias: torch.Tensor | None = None) -> AnyProjection:
        """The projection of the row-wise concatenation of ``parts`` (name, weight)."""
        quantized = self.quantized(parts, bias)
        if quantized is not None:
            return quantized
        weight = torch.cat([as_tensor(w) for _, w in parts]).to(device=self.device, dtype=self.dtype)
        return Projection(weight, bias, prepack=self.prepack)

    def quantized(self, parts: Sequence[tuple[str, Weight]],
                  bias: torch.Tensor | None = None) -> BlockProjection | None:
        """The projection on the parts' own codes, or None where it runs dense."""
        if not self.int4 or self.device.type != "cpu" or not all(isinstance(w, GgufBlocks) for _, w in parts):
            return None
        codes = [codes_or_log(name, w) for name, w in parts if isinstance(w, GgufBlocks)]
        if any(c is None for c in codes):
            return None
        joined = concat([c for c in codes if c is not None])
        why = blockmm.unavailable()
        if joined.bits != 4 and why is not None:
            warn_once(f"codes {joined.bits}-bit", "candle_like: %s-bit codes (first: %s) run dense: %s",
                      joined.bits, parts[0][0], why)
            return None
        dense = None
        if self.dense_rows is not None:
            # The dense copy holds llama.cpp's exact weights, not torch's kernel's bf16-scaled ones.
            plain = torch.from_numpy(np.ascontiguousarray(joined.dequantize())).to(self.dtype)
            dense = (pack_weight(plain) if self.prepack else None)
            dense = plain if dense is None else dense
        return BlockProjection(block_kernel(joined, int8=self.int8), bias, dtype=self.dtype, dense=dense,
                              dense_rows=self.dense_rows or 1 << 62)


def block_kernel(codes: BlockCodes, *, int8: bool = False) -> QuantizedKernel:
    """ruvllm's block kernel where this machine runs it (``int8``: on int8 activations), else
    torch's packed int4 kernel (4-bit codes only)."""
    if blockmm.unavailable() is None:
        return blockmm.BlockWeights.from_codes(codes, int8=int8)
    return PackedInt4.pack(codes)
