"""torch's packed int4 weights (``aten._weight_int4pack_mm_for_cpu``): the fallback for 4-bit
codes (block_codes.py) where ruvllm's block kernel (blockmm.py) cannot run.

torch's kernel computes ``w = (code - 8) * scale + zero`` (``zero = offset + 8 scale``, its scales
and zeros ``[K / 32, N, 2]``, checked against its output in tests/candle_like/test_int4.py).
Its only vectorised path in torch 2.13 (AVX2 and AVX-512) takes
bfloat16 activations, scales and zeros: float32 or float16 activations run a scalar loop 10-40x
slower. So its packed weights carry bfloat16 scales and zeros, and the rounding of ``d`` and
``m + 8 d`` to 8 significant bits is the one difference from llama.cpp's weights: at most
``2^-8 (8 |d| + |zero|)`` per weight.

:func:`requantize` (per group of 32, round to nearest between the group's min and max) makes
4-bit codes of any weights: the tests' random ones, and how Q6_K's int4 error was measured
(docs/backends/candle_like.md) before choosing 8 bits for it.
"""

from __future__ import annotations

import functools

import attrs
import numpy as np
import torch

from ruvllm_candle_like.block_codes import GROUP, BlockCodes


def requantize(w: np.ndarray) -> BlockCodes:
    """Round-to-nearest asymmetric int4 per group of 32 between the group's min and max."""
    rows, cols = w.shape
    g = w.reshape(rows, cols // GROUP, GROUP)
    lo, hi = g.min(axis=-1), g.max(axis=-1)
    scale = ((hi - lo) / np.float32(15)).astype(np.float32)
    safe = np.where(scale == 0, np.float32(1), scale)
    codes = np.clip(np.rint((g - lo[..., None]) / safe[..., None]), 0, 15).astype(np.uint8)
    return BlockCodes(codes=codes.reshape(rows, cols), scale=scale, offset=lo.astype(np.float32), bits=4)


@attrs.frozen(eq=False)
class PackedInt4:
    """Codes in the kernel's packed layout (``[N, K / 2]`` bytes, CPU-specific) with bfloat16
    ``[K / 32, N, 2]`` scales and zeros."""

    packed: torch.Tensor
    scales_zeros: torch.Tensor

    @classmethod
    def pack(cls, codes: BlockCodes) -> PackedInt4:
        assert codes.bits == 4, "torch's kernel takes 4-bit codes only"
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(
            torch.from_numpy(codes.codes.astype(np.int32)), 1)
        sz = np.stack([codes.scale.T, codes.zero.T], axis=-1)
        return cls(packed=packed, scales_zeros=torch.from_numpy(np.ascontiguousarray(sz)).to(torch.bfloat16))

    @property
    def shape(self) -> tuple[int, int]:
        """``[out, in]``."""
        return self.packed.shape[0], self.packed.shape[1] * 2

    @property
    def held(self) -> str:
        return "torch's int4 kernel"

    @property
    def nbytes(self) -> int:
        return self.packed.nbytes + self.scales_zeros.nbytes

    def dequantize(self) -> torch.Tensor:
        """The float32 weights the kernel computes with (its output on an identity: exact)."""
        return self.matmul(torch.eye(self.shape[1], dtype=torch.bfloat16)).T.float()

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """``x @ w.T`` in bfloat16 (float32 accumulation inside the kernel)."""
        # torch's own binding of the op: 2 us less per call than the torch.ops.aten packet, which
        # goes through Python (120 calls a decode step).
        return torch._weight_int4pack_mm_for_cpu(x.to(torch.bfloat16), self.packed, GROUP, self.scales_zeros)


@functools.cache
def unavailable() -> str | None:
    """Why this torch cannot run packed int4 weights, or None when it can."""
    try:
        PackedInt4.pack(requantize(np.ones((32, 64), dtype=np.float32))).matmul(torch.ones(1, 64))
    except (RuntimeError, AttributeError) as exc:
        return f"torch {torch.__version__} has no CPU int4 kernel ({str(exc).strip().splitlines()[0]})"
    return None
