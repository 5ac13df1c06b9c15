"""The GGUF -> codes mapping (ruvllm_candle_like.block_codes) against llama.cpp's dequantisation.

``gguf.quants.dequantize`` is llama.cpp's reference (the ``gguf`` package ships with llama.cpp).
Every type mapped as stored gives its weights bit for bit (``code * scale`` is exact in float32,
so both sides round once, in the same place); Q6_K, re-quantised, stays within half a step of
its 8-bit grid.
"""

from __future__ import annotations

import numpy as np
import pytest
from ruvllm.gguf_file import read_gguf_file
from ruvllm.registry import embedded_model_path
from ruvllm_candle_like.auto_claim import KERNEL_BYTES, REQUANTISED_TYPES
from ruvllm_candle_like.block_codes import GROUP, GgufBlocks, block_codes, concat

#: The types mapped as stored, and their code width.
AS_STORED = {"Q4_0": 4, "Q4_1": 4, "Q4_K": 4, "Q5_0": 5, "Q5_1": 5, "Q5_K": 5, "Q8_0": 8}
#: Where each type's float16 scale (and min) sit in its block, for random blocks.
SCALE_OFFSETS = {"Q4_0": (0,), "Q4_1": (0, 2), "Q4_K": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2),
                 "Q5_K": (0, 2), "Q8_0": (0,), "Q6_K": (208,)}


def _blocks(f, t) -> GgufBlocks:
    return GgufBlocks(t.type_name, t.type, f.tensor_data(t), tuple(reversed(t.shape)))


def _random_blocks(type_name: str, rows: int, cols: int,
                   d_offsets: tuple[int, ...] | None = None) -> GgufBlocks:
    """Random codes, scales and mins in ``type_name``'s layout, its f16 scales at ``d_offsets``
    (by default where the type keeps them)."""
    import gguf

    qtype = gguf.GGMLQuantizationType[type_name]
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(0)
    raw = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
    for at in SCALE_OFFSETS[type_name] if d_offsets is None else d_offsets:
        d = (rng.random((rows, cols // block)) * 0.02 + 1e-3).astype(np.float16)
        raw[..., at:at + 2] = d.view(np.uint8).reshape(rows, cols // block, 2)
    return GgufBlocks(type_name, int(qtype), raw.reshape(rows, -1), (rows, cols))


def test_every_type_the_kernel_runs_is_mapped_as_stored_or_requantised():
    assert set(KERNEL_BYTES) == set(AS_STORED) | set(REQUANTISED_TYPES)


def test_every_quantised_tensor_of_the_embedded_model_maps_exactly():
    f = read_gguf_file(embedded_model_path())
    quantized = [t for t in f.tensors if t.type_name not in ("F32", "F16")]
    # 30 layers x q/k/v/o/gate/up/down in Q4_1, and token_embd in Q8_0.
    assert sorted({t.type_name for t in quantized}) == ["Q4_1", "Q8_0"] and len(quantized) == 211
    for t in quantized:
        blocks = _blocks(f, t)
        codes = block_codes(blocks)
        assert codes is not None and codes.bits == (8 if t.type_name == "Q8_0" else 4)
        assert np.array_equal(codes.dequantize(), blocks.dequantize()), t.name


@pytest.mark.parametrize("type_name", sorted(AS_STORED))
def test_every_type_mapped_as_stored_maps_exactly(type_name):
    """Random blocks of each type (every code, fifth bit and K-quant scale/min slot exercised):
    Q4_0's zero is -8 d, Q5_0's codes are q - 16, the K-quants' 8 groups of 32 per super-block
    take their 6-bit scales and mins, Q5's fifth bits come from their own bytes."""
    blocks = _random_blocks(type_name, 64, 512)
    codes = block_codes(blocks)
    assert codes is not None and codes.scale.shape == codes.offset.shape == (64, 512 // GROUP)
    assert codes.bits == AS_STORED[type_name]
    assert np.array_equal(codes.dequantize(), blocks.dequantize())
    # The kernels' int8 layout shifts a group with negative codes by 128 and needs its offset zero.
    groups = codes.codes.reshape(64, -1, GROUP)
    assert not codes.offset[(groups < 0).any(axis=-1)].any()


def test_q6_k_is_requantised_to_8_bits_within_half_a_step():
    """Its groups of 16 have their own scales: per 32, d = f16(max|w| / 127), codes round(w / d),
    each weight within d / 2 of Q6_K's (a mistaken group order or scale would be whole steps off)."""
    assert REQUANTISED_TYPES == ("Q6_K",)
    blocks = _random_blocks("Q6_K", 32, 512)
    codes = block_codes(blocks)
    assert codes is not None and codes.bits == 8
    stored = blocks.dequantize()
    groups = stored.reshape(32, -1, GROUP)
    want_d = (np.abs(groups).max(axis=-1) / np.float32(127)).astype(np.float16).astype(np.float32)
    assert np.array_equal(codes.scale, want_d) and not codes.offset.any()
    err = np.abs(codes.dequantize() - stored).reshape(32, -1, GROUP)
    assert (err <= codes.scale[..., None] * (0.5 + 2.0**-10)).all()
    assert np.abs(codes.codes).max() <= 127


def test_other_types_have_no_mapping():
    assert block_codes(_random_blocks("Q3_K", 4, 256, (108,))) is None
    assert block_codes(_random_blocks("Q2_K", 4, 256, (80,))) is None


@pytest.mark.parametrize(("qk", "v", "bits", "dtype"), [
    ("Q4_1", "Q5_0", 5, np.uint8),
    ("Q4_K", "Q6_K", 8, np.int8),  # as in Q4_K_M files
    ("Q5_0", "Q8_0", 8, np.int8),  # as in Q4_K_M files of models whose widths are not multiples of 256
])
def test_a_fused_matrix_takes_its_widest_part_s_width_with_every_part_s_weights(qk, v, bits, dtype):
    """q/k in one type and v in another: one matrix, one kernel call, the same weights."""
    first, second = block_codes(_random_blocks(qk, 64, 256)), block_codes(_random_blocks(v, 32, 256))
    assert first is not None and second is not None
    joined = concat([first, second])
    assert joined.bits == bits and joined.codes.dtype == dtype
    assert np.array_equal(joined.dequantize(), np.concatenate([first.dequantize(), second.dequantize()]))
