"""Grouped-query attention on top of ``scaled_dot_product_attention`` without copying K/V.

With G query heads per KV head, the G queries of one KV head are laid out as G*T "positions"
of a single head: ``q[T, Hkv*G, D] -> [Hkv, G*T, D]``. Then K/V of shape ``[Hkv, L, D]`` are used
as they are (no ``repeat_interleave``) wherever every query sees the same keys: a decode row, and
a chunk's cached positions (its own keys, a causal square, are repeated per head). Head ``h``
attends with KV head ``h // G``, exactly as Hugging Face's ``repeat_kv`` arranges it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


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
    if t > 1:
        return _chunk_after_prefix(q, k, v, start)
    out = F.scaled_dot_product_attention(_by_kv_head(q, h_kv), k.unsqueeze(0), v.unsqueeze(0))
    return _by_position(out, h_kv, t)


def _by_kv_head(q: torch.Tensor, h_kv: int) -> torch.Tensor:
    """``q`` [T, Hkv*G, D] -> [1, Hkv, G*T, D]: each KV head's G queries as one head's rows. The
    leading batch dimension of 1: PyTorch's fused CPU attention kernel takes only 4-D inputs; 3-D
    ones fall back to the unfused math path (2-2.5x slower here, same result)."""
    t, h, d = q.shape
    return q.view(t, h_kv, h // h_kv, d).permute(1, 2, 0, 3).reshape(1, h_kv, h // h_kv * t, d)


def _by_position(out: torch.Tensor, h_kv: int, t: int) -> torch.Tensor:
    """The inverse of _by_kv_head for an attention output holding [Hkv, G, T, D]: [T, Hkv*G*D]."""
    return out.reshape(h_kv, -1, t, out.shape[-1]).permute(2, 0, 1, 3).reshape(t, -1)


def _chunk_after_prefix(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int) -> torch.Tensor:
    """A chunk of T > 1 queries after ``start`` cached positions, as attend_sequence.

    Over the cached keys every query sees them all; over the chunk's own T keys the mask is
    causal and square. Each part runs as mask-free fused attention, and the two merge by their
    log-sum-exps, which the fused CPU kernel returns beside its output. One call with a [G*T, L]
    boolean mask applied the mask at every tile: 1.10-1.39x the time for 512 rows after
    1,024-7,000 positions, where a long prompt's first token spends most of its time (a 4,000-token
    prompt's first token 7.5 -> 6.6 s). Small chunks after short prefixes (4-128 rows after 300-500)
    take 0.04-0.2 ms more a layer for the second call."""
    t, h, d = q.shape
    h_kv = k.shape[0]
    g = h // h_kv
    past, past_lse = _flash_attention(_by_kv_head(q, h_kv), k[None, :, :start], v[None, :, :start],
                                      causal=False)
    own, own_lse = _flash_attention(q.transpose(0, 1)[None], k[None, :, start:].repeat_interleave(g, 1),
                                    v[None, :, start:].repeat_interleave(g, 1), causal=True)
    parts = torch.stack([past.reshape(h_kv, g, t, d), own.reshape(h_kv, g, t, d)]).float()
    weights = torch.stack([past_lse.reshape(h_kv, g, t), own_lse.reshape(h_kv, g, t)]).float().softmax(0)
    out = (parts * weights[..., None]).sum(0)
    return _by_position(out, h_kv, t).to(q.dtype)


def _flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """PyTorch's fused CPU attention (what ``scaled_dot_product_attention`` runs here without a
    mask): the output [1, H, T, D] and each query's log-sum-exp of its scores [1, H, T]."""
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal)


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
