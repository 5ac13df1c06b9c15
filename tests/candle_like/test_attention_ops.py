"""One sequence's attention (ruvllm_candle_like.attention_ops.attend_sequence) against float64:
a whole prompt, one decode row, and a chunk after cached positions, whose two parts (the cached
keys, the chunk's own causal square) run apart and merge by their log-sum-exps."""

from __future__ import annotations

import pytest
import torch
from ruvllm_candle_like.attention_ops import attend_sequence

HEADS, KV_HEADS, DIM = 9, 3, 64


def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int) -> torch.Tensor:
    t, length, g = q.shape[0], k.shape[1], HEADS // KV_HEADS
    keys, values = k.double().repeat_interleave(g, 0), v.double().repeat_interleave(g, 0)
    scores = torch.einsum("thd,hld->htl", q.double(), keys) / DIM ** 0.5
    visible = torch.arange(length)[None, :] <= (start + torch.arange(t))[:, None]
    weights = scores.masked_fill(~visible[None], float("-inf")).softmax(-1)
    return torch.einsum("htl,hld->thd", weights, values).reshape(t, HEADS * DIM)


@pytest.mark.parametrize(("rows", "start"), [(40, 0), (1, 700), (2, 5), (30, 1), (200, 1500)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_float64_attention(rows: int, start: int, dtype: torch.dtype):
    gen = torch.Generator().manual_seed(rows + start)
    q = torch.randn(rows, HEADS, DIM, generator=gen).to(dtype)
    # As the executor reads the pool: [positions, KV heads, dim], viewed head-major.
    k, v = (torch.randn(start + rows, KV_HEADS, DIM, generator=gen).to(dtype).transpose(0, 1)
            for _ in range(2))
    got = attend_sequence(q, k, v, start)
    assert got.shape == (rows, HEADS * DIM) and got.dtype == dtype
    # Convex sums of values under 5: float32 keeps ~1e-6 of them, bfloat16 inputs ~1e-2.
    tolerance = 2e-5 if dtype == torch.float32 else 3e-2
    assert torch.allclose(got.double(), _reference(q, k, v, start), rtol=0, atol=tolerance)
