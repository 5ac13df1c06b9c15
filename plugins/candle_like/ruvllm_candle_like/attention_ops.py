"""Grouped-query attention on top of ``scaled_dot_product_attention`` without copying K/V.

With G query heads per KV head, the G queries of one KV head are laid out as G*T "positions"
of a single head: ``q[T, Hkv*G, D] -> [Hkv, G*T, D]``. Then K/V of shape ``[Hkv, L, D]`` are used
as they are (no ``repeat_interleave``), and the causal mask of ``[T, L]`` is tiled G times. Head
``h`` attends with KV head ``h // G``, exactly as Hugging Face's ``repeat_kv`` arranges it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def causal_mask(t: int, start: int, length: int, device: torch.device) -> torch.Tensor:
    """Bool [T, L]: query i (at position start+i) may see keys 0 .. start+i."""
    q_pos = torch.arange(start, start + t, device=device).unsqueeze(1)
    k_pos = torch.arange(length, device=device).unsqueeze(0)
    return k_pos <= q_pos


def attend_sequence(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int) -> torch.Tensor:
    """One sequence: ``q`` [T, H, D] at positions start.., ``k``/``v`` [Hkv, L, D] holding
    positions 0..L-1 (L = start + T). Returns [T, H*D]."""
    t, h, d = q.shape
    h_kv, length = k.shape[0], k.shape[1]
    if t > 1 and start == 0 and length == t:
        # A whole prompt: plain causal attention, where the fused kernel skips the masked half.
        out = F.scaled_dot_product_attention(q.transpose(0, 1).unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0),
                                             is_causal=True, enable_gqa=h != h_kv)
        return out[0].transpose(0, 1).reshape(t, h * d)
    g = h // h_kv
    # A leading batch dimension of 1: PyTorch's fused CPU attention kernel takes only 4-D
    # inputs; 3-D ones fall back to the unfused math path (2-2.5x slower here, same result).
    qg = q.view(t, h_kv, g, d).permute(1, 2, 0, 3).reshape(1, h_kv, g * t, d)
    k, v = k.unsqueeze(0), v.unsqueeze(0)
    if t == 1:
        out = F.scaled_dot_product_attention(qg, k, v)
    else:
        mask = causal_mask(t, start, length, q.device).repeat(g, 1)
        out = F.scaled_dot_product_attention(qg, k, v, attn_mask=mask)
    return out.view(h_kv, g, t, d).permute(2, 0, 1, 3).reshape(t, h * d)


def attend_decode_batch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        valid: torch.Tensor | None) -> torch.Tensor:
    """B sequences, one query each: ``q`` [B, H, D], ``k``/``v`` [B, Hkv, L, D] padded to the
    longest sequence, ``valid`` bool [B, L] (None when nothing is padding). Returns [B, H*D]."""
    b, h, d = q.shape
    h_kv = k.shape[1]
    g = h // h_kv
    qg = q.view(b, h_kv, g, d)
    mask = None if valid is None else valid[:, None, None, :]
    out = F.scaled_dot_product_attention(qg, k, v, attn_mask=mask)
    return out.reshape(b, h * d)
