"""torch's packed int4 kernel (ruvllm_candle_like.int4) on the GGUF's 4-bit codes, against
llama.cpp's dequantisation (``gguf.quants.dequantize``, its reference). Two things are proved on
every Q4_1 tensor of the embedded model:

1. its zero point: ``(code - 8) * d + (m + 8 d)`` in float32 equals the reference bit for bit
   (``(code - 8) * d`` is exact, so both sides round once, in the same place);
2. the kernel: ``_weight_int4pack_mm_for_cpu`` on an identity returns, bit for bit, the bfloat16
   of ``(code - 8) * bf16(scale) + bf16(zero)`` computed in float32. That pins its formula and
   the packed layout. Its vectorised path takes bfloat16 activations, scales and zeros only
   (int4.py), so the weights it computes with differ from llama.cpp's by the bfloat16 rounding of
   ``d`` and ``m + 8 d``: bounded here, relative to the block's scale.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from ruvllm.gguf_file import read_gguf_file
from ruvllm.registry import embedded_model_path
from ruvllm_candle_like.block_codes import GROUP, BlockCodes, block_codes
from ruvllm_candle_like.int4 import PackedInt4, requantize

from .test_block_codes import _blocks, _random_blocks

#: bf16 keeps 8 significant bits: |d - bf16(d)| <= 2^-8 |d| (round to nearest), so a weight the
#: kernel computes with is off llama.cpp's by at most 2^-8 (8 |d| + |m + 8 d|) (|code - 8| <= 8),
#: plus float32's own rounding of the sum.
BF16_HALF_ULP = 2.0**-8


def _kernel_formula(codes: BlockCodes) -> torch.Tensor:
    s = torch.from_numpy(codes.scale).bfloat16().float().repeat_interleave(GROUP, 1)
    z = torch.from_numpy(codes.zero).bfloat16().float().repeat_interleave(GROUP, 1)
    return ((torch.from_numpy(codes.codes).float() - 8) * s + z).bfloat16()


def test_every_q4_tensor_of_the_embedded_model_maps_exactly():
    f = read_gguf_file(embedded_model_path())
    quantized = [t for t in f.tensors if t.type_name == "Q4_1"]
    assert len(quantized) == 210  # 30 layers x q/k/v/o/gate/up/down; token_embd is Q8_0
    worst = 0.0
    for t in quantized:
        blocks = _blocks(f, t)
        codes = block_codes(blocks)
        assert codes is not None
        reference = blocks.dequantize()
        assert np.array_equal((codes.codes.astype(np.float32) - 8).reshape(codes.shape[0], -1, GROUP)
                              * codes.scale[..., None] + codes.zero[..., None],
                              reference.reshape(codes.shape[0], -1, GROUP)), t.name
        packed = PackedInt4.pack(codes)
        got = packed.matmul(torch.eye(codes.shape[1])).T
        assert torch.equal(got, _kernel_formula(codes)), t.name
        # What the bf16 scales and zeros change (before the output's own bf16 rounding).
        s = torch.from_numpy(codes.scale).bfloat16().float()
        z = torch.from_numpy(codes.zero).bfloat16().float()
        q = torch.from_numpy(codes.codes).float().view(codes.shape[0], -1, GROUP) - 8
        used = (q * s[..., None] + z[..., None]).view(codes.shape)
        err = (used - torch.from_numpy(reference)).abs().view(codes.shape[0], -1, GROUP).amax(-1)
        bound = 8 * torch.from_numpy(codes.scale).abs() + torch.from_numpy(codes.zero).abs()
        worst = max(worst, float((err / bound).max()))
    # Measured: 0.00388 (the bound, 0.00391, is nearly reached: d = 0.03137 runs as 0.03125).
    assert worst <= BF16_HALF_ULP * (1 + 2.0**-20)
    logging.getLogger(__name__).info("worst |error| / (8 |d| + |zero|) from bf16 scales: %.6f", worst)


@pytest.mark.parametrize("type_name", ["Q4_0", "Q4_1", "Q4_K"])
def test_every_4_bit_type_runs_the_kernel_formula(type_name):
    """On random blocks (the embedded model has no Q4_0 or Q4_K): Q4_0's zero is 0."""
    codes = block_codes(_random_blocks(type_name, 64, 512))
    assert codes is not None
    assert torch.equal(PackedInt4.pack(codes).matmul(torch.eye(512)).T, _kernel_formula(codes))


def test_the_int4_kernel_gives_a_row_the_same_bits_at_every_row_count():
    """M = 1..64: the batch-invariant mode runs int4 projections on this kernel (invariant.py)."""
    gen = torch.Generator().manual_seed(1)
    packed = PackedInt4.pack(requantize(torch.randn(256, 576, generator=gen).numpy()))
    x = torch.randn(64, 576, generator=gen)
    alone = torch.cat([packed.matmul(x[i:i + 1]) for i in range(64)])
    for rows in range(1, 65):
        assert torch.equal(packed.matmul(x[:rows]), alone[:rows]), rows
