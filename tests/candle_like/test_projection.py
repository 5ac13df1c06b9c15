"""The pre-packed projection computes what F.linear computes, and gradients still flow; where
oneDNN packs nothing (bf16 without native bf16) it falls back to the plain matmul."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from ruvllm.hardware import cpu_info
from ruvllm_candle_like import projection
from ruvllm_candle_like.projection import Projection

TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 2e-2}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 3, 16])
def test_packed_matches_plain_linear(dtype, rows):
    g = torch.Generator().manual_seed(rows)
    w = torch.randn(96, 64, generator=g).to(dtype)
    bias = torch.randn(96, generator=g).to(dtype)
    x = torch.randn(rows, 64, generator=g).to(dtype)
    if not torch.backends.mkldnn.is_available():
        pytest.skip("this torch build has no oneDNN: nothing is packed")
    if dtype == torch.bfloat16 and not cpu_info().native_bf16:
        pytest.skip(f"oneDNN packs no bf16 weights here: {cpu_info().bf16_missing()}")
    proj = Projection(w, bias)
    assert proj.packed is not None
    with torch.inference_mode():
        got = proj(x)
    want = F.linear(x.float(), w.float(), bias.float())
    assert got.dtype == dtype and got.shape == (rows, 96)
    assert (got.float() - want).abs().max() <= TOLERANCE[dtype] * want.abs().max()


def test_gradient_through_the_input_takes_the_plain_weight():
    """SONA trains adapters through the base projections: the packed op has no backward."""
    w = torch.randn(8, 4)
    x = torch.randn(2, 4, requires_grad=True)
    Projection(w)(x).sum().backward()
    assert torch.allclose(x.grad, w.sum(0).expand(2, 4))


def test_prepack_off_keeps_only_the_plain_weight():
    w = torch.randn(8, 4)
    proj = Projection(w, prepack=False)
    assert proj.packed is None
    x = torch.randn(3, 4)
    assert torch.equal(proj(x), F.linear(x, w))


def test_unpackable_dtype_takes_the_plain_matmul(monkeypatch):
    """What an AVX2-only CPU does with bf16 weights (oneDNN refuses to pack them)."""
    monkeypatch.setattr(projection, "packing_unavailable", lambda dtype: "emulated: no native bf16")
    w, x = torch.randn(8, 4).bfloat16(), torch.randn(3, 4).bfloat16()
    proj = Projection(w)
    assert proj.packed is None
    with torch.inference_mode():
        assert torch.equal(proj(x), F.linear(x, w))
