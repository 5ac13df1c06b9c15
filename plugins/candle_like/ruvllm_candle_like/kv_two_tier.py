"""The two-tier KV cache: recent tokens in an FP16 "hot" tail, older ones packed in a Q8 or Q4
"cold" store, attention over both.

Why: decode attention reads the whole past each step; most of it is old context whose exact
values matter little, while the most recent tokens matter most. Keeping only a short tail at
16 bits and the rest at 4 bits (plus one FP16 scale and minimum per head per group of
``group_size`` channels, for K and V separately) cuts KV memory by more than 3x.

Mechanics, per layer:

- new K/V go to the hot tail (``[Hkv, hot_tokens, D]`` float16);
- when the tail would overflow, its oldest tokens move to the cold store in batches of
  ``migrate_tokens``: asymmetric quantisation per (head, token, group), real ``uint8`` storage
  (two 4-bit codes per byte for Q4);
- attention dequantises the cold store and attends over ``cold ++ hot ++ new`` in one
  ``scaled_dot_product_attention`` call;
- past ``max_tokens`` retained tokens the oldest cold tokens are evicted. Keys keep the RoPE
  rotation of their absolute positions, so the retained window stays consistent.
"""

from __future__ import annotations

import attrs
import torch
from ruvllm.errors import InvalidRequest

from ruvllm_candle_like.attention_ops import attend_sequence
from ruvllm_candle_like.config import ModelConfig


@attrs.frozen(kw_only=True)
class TwoTierSettings:
    hot_tokens: int = 64
    migrate_tokens: int = 32
    bits: int = 4
    group_size: int = 64
    max_tokens: int = 8192

    @classmethod
    def from_options(cls, opts, cfg: ModelConfig, context_length: int) -> TwoTierSettings:
        group = opts.group_size or cfg.head_dim
        if cfg.head_dim % group or (opts.cold_bits == 4 and group % 2):
            raise InvalidRequest("group_size",
                                 f"must divide head_dim ({cfg.head_dim}) and be even; got {group}")
        max_tokens = opts.max_kv_tokens or context_length
        if max_tokens <= opts.hot_tokens:
            raise InvalidRequest("max_kv_tokens",
                                 f"must exceed hot_tokens ({opts.hot_tokens}); got {max_tokens}")
        return cls(hot_tokens=opts.hot_tokens, migrate_tokens=opts.migrate_tokens, bits=opts.cold_bits,
                   group_size=group, max_tokens=max_tokens)


@attrs.define
class PackedTensor:
    """Quantised ``[Hkv, n, D]`` values: codes, and per-group scale and minimum (FP16)."""

    codes: torch.Tensor  # uint8 [Hkv, n, D * bits / 8]
    scale: torch.Tensor  # float16 [Hkv, n, D / group]
    minimum: torch.Tensor  # float16 [Hkv, n, D / group]

    @property
    def length(self) -> int:
        return self.codes.shape[1]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.codes, self.scale, self.minimum))

    def drop_front(self, n: int) -> PackedTensor:
        return PackedTensor(self.codes[:, n:].contiguous(), self.scale[:, n:].contiguous(),
                            self.minimum[:, n:].contiguous())

    def append(self, other: PackedTensor) -> PackedTensor:
        return PackedTensor(torch.cat([self.codes, other.codes], 1), torch.cat([self.scale, other.scale], 1),
                            torch.cat([self.minimum, other.minimum], 1))


def quantize(x: torch.Tensor, bits: int, group: int) -> PackedTensor:
    """Asymmetric round-to-nearest quantisation of ``x`` [Hkv, n, D] per group of channels."""
    h, n, d = x.shape
    levels = (1 << bits) - 1
    g = x.float().view(h, n, d // group, group)
    lo = g.amin(dim=-1)
    hi = g.amax(dim=-1)
    scale = ((hi - lo) / levels).clamp_min(1e-8).half()
    lo = lo.half()
    # Quantise against the FP16-rounded scale/min that dequantisation will use.
    q = ((g - lo.float().unsqueeze(-1)) / scale.float().unsqueeze(-1)).round().clamp(0, levels)
    q = q.to(torch.uint8).view(h, n, d)
    if bits == 4:
        q = q[..., 0::2] | (q[..., 1::2] << 4)
    return PackedTensor(q.contiguous(), scale, lo)


def dequantize(p: PackedTensor, bits: int, group: int, dtype: torch.dtype) -> torch.Tensor:
    codes = p.codes
    if bits == 4:
        codes = torch.stack([codes & 0x0F, codes >> 4], dim=-1).flatten(-2)
    h, n, d = codes.shape
    g = codes.view(h, n, d // group, group).to(torch.float32)
    x = g * p.scale.float().unsqueeze(-1) + p.minimum.float().unsqueeze(-1)
    return x.view(h, n, d).to(dtype)


class TwoTierCache:
    """One request's KV in the two tiers (request-level path, ``kv_cache = "two_tier"``)."""

    def __init__(self, cfg: ModelConfig, settings: TwoTierSettings, *, compute_dtype: torch.dtype,
                 device: torch.device):
        self.cfg = cfg
        self.settings = settings
        self._compute = compute_dtype
        self._device = device
        shape = (cfg.num_kv_heads, settings.hot_tokens, cfg.head_dim)
        self.hot_k = [torch.empty(shape, dtype=torch.float16, device=device) for _ in range(cfg.num_layers)]
        self.hot_v = [torch.empty(shape, dtype=torch.float16, device=device) for _ in range(cfg.num_layers)]
        empty = self._empty_packed()
        self.cold_k: list[PackedTensor] = [empty] * cfg.num_layers
        self.cold_v: list[PackedTensor] = [empty] * cfg.num_layers
        self.n_hot = 0
        self.n_cold = 0
        self.position = 0
        self.evicted = 0
        self._new = 0

    def _empty_packed(self) -> PackedTensor:
        s, cfg = self.settings, self.cfg
        h, d = cfg.num_kv_heads, cfg.head_dim
        return PackedTensor(
            torch.empty((h, 0, d * s.bits // 8), dtype=torch.uint8, device=self._device),
            torch.empty((h, 0, d // s.group_size), dtype=torch.float16, device=self._device),
            torch.empty((h, 0, d // s.group_size), dtype=torch.float16, device=self._device),
        )

    @property
    def length(self) -> int:
        """Tokens held (hot + cold)."""
        return self.n_hot + self.n_cold

    def nbytes(self) -> int:
        """Bytes of every tensor holding this cache's K and V (hot buffers, codes, scales)."""
        hot = sum(t.numel() * t.element_size() for t in (*self.hot_k, *self.hot_v))
        return hot + sum(p.nbytes() for p in (*self.cold_k, *self.cold_v))

    def _plan(self, n_new: int) -> tuple[int, int]:
        """(tokens moved hot -> cold, cold tokens evicted) after appending ``n_new``."""
        s = self.settings
        total = self.n_hot + n_new
        move = 0
        if total > s.hot_tokens:
            over = total - s.hot_tokens
            move = -(-over // s.migrate_tokens) * s.migrate_tokens
        cold_cap = s.max_tokens - s.hot_tokens
        evict = max(0, self.n_cold + move - cold_cap)
        return move, evict

    def begin(self, n_new: int) -> None:
        self._new = n_new

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        s = self.settings
        k_new, v_new = k.transpose(0, 1), v.transpose(0, 1)
        hot_k = self.hot_k[layer][:, : self.n_hot]
        hot_v = self.hot_v[layer][:, : self.n_hot]
        parts_k = [hot_k.to(self._compute), k_new]
        parts_v = [hot_v.to(self._compute), v_new]
        if self.n_cold:
            parts_k.insert(0, dequantize(self.cold_k[layer], s.bits, s.group_size, self._compute))
            parts_v.insert(0, dequantize(self.cold_v[layer], s.bits, s.group_size, self._compute))
        keys, values = torch.cat(parts_k, 1), torch.cat(parts_v, 1)
        out = attend_sequence(q, keys, values, self.length)
        self._store(layer, k_new, v_new)
        return out

    def _store(self, layer: int, k_new: torch.Tensor, v_new: torch.Tensor) -> None:
        s = self.settings
        move, evict = self._plan(k_new.shape[1])
        for hot, cold, new in ((self.hot_k, self.cold_k, k_new), (self.hot_v, self.cold_v, v_new)):
            tail = torch.cat([hot[layer][:, : self.n_hot], new.to(torch.float16)], 1)
            if move:
                packed = quantize(tail[:, :move], s.bits, s.group_size)
                c = cold[layer].append(packed)
                cold[layer] = c.drop_front(evict) if evict else c
            kept = tail[:, move:]
            hot[layer][:, : kept.shape[1]] = kept

    def advance(self) -> None:
        move, evict = self._plan(self._new)
        self.n_cold += move - evict
        self.n_hot += self._new - move
        self.evicted += evict
        self.position += self._new
        self._new = 0
