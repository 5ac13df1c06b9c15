"""Which kernel each projection matrix gets: packed int4 from the GGUF's blocks, or dense.

A fused matrix (q/k/v, gate/up) runs int4 only when every part maps onto int4
(:func:`ruvllm_candle_like.int4.int4_codes`); one part in another type (a Q6_K ``attn_v`` in a
Q4_K_M file) makes the whole matrix dense, dequantised exactly, rather than re-quantising the
part that has no int4 mapping.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import numpy as np
import torch

from ruvllm_candle_like import blockmm
from ruvllm_candle_like.int4 import GgufBlocks, Int4Codes, PackedInt4, codes_or_log, concat
from ruvllm_candle_like.projection import Int4Projection, Projection, QuantizedKernel, pack_weight

#: A weight as the loader hands it over: a tensor, or a GGUF tensor's blocks.
Weight = torch.Tensor | GgufBlocks
AnyProjection = Projection | Int4Projection


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
    #: Run projections whose GGUF blocks map onto int4 on the packed int4 kernel (CPU only).
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
                  bias: torch.Tensor | None = None) -> Int4Projection | None:
        """The projection on the parts' own blocks, or None where they run dense: 4-bit types
        as int4 codes, Q8_0 on ruvllm's 8-bit kernel (where it runs)."""
        blocks = [w for _, w in parts if isinstance(w, GgufBlocks)]
        if not self.int4 or self.device.type != "cpu" or len(blocks) != len(parts):
            return None
        if all(b.type_name == "Q8_0" for b in blocks) and blockmm.unavailable() is None:
            rows = sum(b.shape[0] for b in blocks)
            joined = GgufBlocks("Q8_0", blocks[0].type, np.concatenate([b.raw for b in blocks]),
                                (rows, blocks[0].shape[1]))
            return Int4Projection(blockmm.BlockWeights.from_q8_0(joined, int8=self.int8), bias,
                                  dtype=self.dtype)
        codes = [codes_or_log(name, w) for name, w in parts if isinstance(w, GgufBlocks)]
        if all(c is not None for c in codes):
            return self._int4(concat([c for c in codes if c is not None]), bias)
        return None

    def _int4(self, codes: Int4Codes, bias: torch.Tensor | None) -> Int4Projection:
        dense = None
        if self.dense_rows is not None:
            # The dense copy holds llama.cpp's exact weights, not the kernel's bf16-scaled ones.
            plain = torch.from_numpy(np.ascontiguousarray(codes.dequantize())).to(self.dtype)
            dense = (pack_weight(plain) if self.prepack else None)
            dense = plain if dense is None else dense
        return Int4Projection(int4_kernel(codes, int8=self.int8), bias, dtype=self.dtype, dense=dense,
                              dense_rows=self.dense_rows or 1 << 62)


def int4_kernel(codes: Int4Codes, *, int8: bool = False) -> QuantizedKernel:
    """ruvllm's block kernel where this machine runs it (``int8``: on int8 activations), else
    torch's packed int4 kernel."""
    if blockmm.unavailable() is None:
        return blockmm.BlockWeights.from_int4(codes, int8=int8)
    return PackedInt4.pack(codes)
