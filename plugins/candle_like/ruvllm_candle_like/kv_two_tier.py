"""The two-tier KV cache: recent tokens in an FP16 "hot" tail, older ones packed in a Q8 or Q4
"cold" store, attention over both.

Why: decode attention reads the whole past each step; most of it is old context whose exact
values matter little, while the most recent tokens matter most. Keeping only a short tail at
16 bits and the rest at 4 bits (plus one FP16 scale and minimum per head per group of
``group_size`` channels, for K and V separately) cuts KV memory by more than 3x.

Mechanics, per layer (this module is the request-level cache; the paged executor's cold tier,
over the engine's blocks, is :mod:`ruvllm_candle_like.kv_paged_two_tier`):

- new K/V go to the hot tail (``[Hkv, hot_tokens, D]`` float16);
- when the tail would overflow, its oldest tokens move to the cold store in batches of
  ``migrate_tokens``: asymmetric quantisation per (head, token, group), real ``uint8`` storage
  (two 4-bit codes per byte for Q4). The cold store is preallocated (sized from the request's
  prompt + ``max_tokens`` when the caller says so) and written in place, so a migration
  quantises and copies only the tokens it moves: the total work is linear in the tokens
  generated. Past its capacity it grows by doubling (amortised linear);
- attention dequantises the cold store and attends over ``cold ++ hot ++ new`` in one
  ``scaled_dot_product_attention`` call;
- past ``max_tokens`` retained tokens the oldest cold tokens are evicted: the full cold store
  is a ring buffer whose oldest entries the next migration overwrites. Keys keep the RoPE
  rotation of their absolute positions, and every cold key precedes every query, so the order
  of the cold keys inside the buffer does not change the attention result.
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

    def describe(self) -> str:
        return f"Q{self.bits} (group {self.group_size})"


@attrs.define
class PackedTensor:
    """Quantised ``[A, B, D]`` values (one code per element, grouped along D): codes, and per
    group scale and minimum (FP16)."""

    codes: torch.Tensor  # uint8 [A, B, D * bits / 8]
    scale: torch.Tensor  # float16 [A, B, D / group]
    minimum: torch.Tensor  # float16 [A, B, D / group]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.codes, self.scale, self.minimum))


def packed_width(head_dim: int, bits: int, group: int) -> tuple[int, int]:
    """(bytes of codes, number of groups) per (head, token)."""
    return head_dim * bits // 8, head_dim // group


def empty_packed(a: int, b: int, head_dim: int, bits: int, group: int,
                 device: torch.device) -> PackedTensor:
    """Zero storage for ``[a, b, head_dim]`` packed values (zeros dequantise to 0.0)."""
    width, groups = packed_width(head_dim, bits, group)
    return PackedTensor(torch.zeros((a, b, width), dtype=torch.uint8, device=device),
                        torch.zeros((a, b, groups), dtype=torch.float16, device=device),
                        torch.zeros((a, b, groups), dtype=torch.float16, device=device))


def quantize(x: torch.Tensor, bits: int, group: int) -> PackedTensor:
    """Asymmetric round-to-nearest quantisation of ``x`` [A, B, D] per group of channels."""
    h, n, d = x.shape
    levels = (1 << bits) - 1
    g = x.float().reshape(h, n, d // group, group)
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
    g = codes.reshape(h, n, d // group, group).to(torch.float32)
    x = g * p.scale.float().unsqueeze(-1) + p.minimum.float().unsqueeze(-1)
    return x.view(h, n, d).to(dtype)


class TwoTierCache:
    """One request's KV in the two tiers (request-level path, ``kv_cache = "two_tier"``).

    ``capacity``: the tokens the request may reach (prompt + max_tokens), used to size the cold
    store once; without it the store starts small and doubles as it fills.
    """

    def __init__(self, cfg: ModelConfig, settings: TwoTierSettings, *, compute_dtype: torch.dtype,
                 device: torch.device, capacity: int | None = None):
        self.cfg = cfg
        self.settings = settings
        self._compute = compute_dtype
        self._device = device
        shape = (cfg.num_kv_heads, settings.hot_tokens, cfg.head_dim)
        self.hot_k = [torch.empty(shape, dtype=torch.float16, device=device) for _ in range(cfg.num_layers)]
        self.hot_v = [torch.empty(shape, dtype=torch.float16, device=device) for _ in range(cfg.num_layers)]
        #: Most cold tokens kept (the rest of max_tokens is the hot tail).
        self.cold_limit = settings.max_tokens - settings.hot_tokens
        # Cold storage is token-major, [cold capacity, Hkv, ...], so its valid part is a prefix.
        self.n_hot = 0
        self.n_cold = 0
        # After a migration the tail keeps at least hot_tokens - migrate_tokens + 1 tokens, so a
        # request of `capacity` tokens never holds more cold ones than this.
        most = None if capacity is None else capacity - settings.hot_tokens + settings.migrate_tokens - 1
        start = settings.migrate_tokens if most is None else most
        self.cold_k: list[PackedTensor] = []
        self.cold_v: list[PackedTensor] = []
        self._allocate_cold(min(max(start, settings.migrate_tokens), self.cold_limit))
        #: Slot of the oldest cold token: 0 until the store is full and the ring wraps.
        self._head = 0
        self.position = 0
        self.evicted = 0
        self._new = 0
        self._move = 0
        self._evict = 0

    def _allocate_cold(self, capacity: int) -> None:
        """(Re)allocate the cold store for ``capacity`` tokens, keeping the ``n_cold`` held."""
        s, cfg = self.settings, self.cfg
        keep = self.n_cold
        for store in (self.cold_k, self.cold_v):
            for layer in range(cfg.num_layers):
                grown = empty_packed(capacity, cfg.num_kv_heads, cfg.head_dim, s.bits, s.group_size,
                                     self._device)
                if keep:
                    old = store[layer]
                    for dst, src in zip((grown.codes, grown.scale, grown.minimum),
                                        (old.codes, old.scale, old.minimum), strict=True):
                        dst[:keep] = src[:keep]
                if layer < len(store):
                    store[layer] = grown
                else:
                    store.append(grown)
        self.cold_capacity = capacity

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
        evict = max(0, self.n_cold + move - self.cold_limit)
        return move, evict

    def begin(self, n_new: int) -> None:
        self._new = n_new
        self._move, self._evict = self._plan(n_new)
        need = self.n_cold + self._move - self._evict
        if need > self.cold_capacity:
            # Only before the ring has wrapped (eviction needs a full-size store), so the held
            # tokens are the prefix [0, n_cold).
            self._allocate_cold(min(max(need, 2 * self.cold_capacity), self.cold_limit))

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        s = self.settings
        k_new, v_new = k.transpose(0, 1), v.transpose(0, 1)
        hot_k = self.hot_k[layer][:, : self.n_hot]
        hot_v = self.hot_v[layer][:, : self.n_hot]
        parts_k = [hot_k.to(self._compute), k_new]
        parts_v = [hot_v.to(self._compute), v_new]
        if self.n_cold:
            n = self.n_cold  # the valid prefix, or (once the ring wrapped) the whole store
            for parts, store in ((parts_k, self.cold_k[layer]), (parts_v, self.cold_v[layer])):
                held = PackedTensor(store.codes[:n], store.scale[:n], store.minimum[:n])
                parts.insert(0, dequantize(held, s.bits, s.group_size, self._compute).transpose(0, 1))
        keys, values = torch.cat(parts_k, 1), torch.cat(parts_v, 1)
        out = attend_sequence(q, keys, values, self.length)
        self._store(layer, k_new, v_new)
        return out

    def _store(self, layer: int, k_new: torch.Tensor, v_new: torch.Tensor) -> None:
        s = self.settings
        move = self._move
        for hot, cold, new in ((self.hot_k, self.cold_k, k_new), (self.hot_v, self.cold_v, v_new)):
            # Only the hot tail and this step's tokens are copied: linear in the step's size.
            tail = torch.cat([hot[layer][:, : self.n_hot], new.to(torch.float16)], 1)
            if move:
                cap = self.cold_capacity
                first = max(0, move - cap)  # moved tokens a later one of this batch overwrites
                packed = quantize(tail[:, first:move].transpose(0, 1), s.bits, s.group_size)
                slots = (self._head + self.n_cold + torch.arange(first, move, device=self._device)) % cap
                store = cold[layer]
                store.codes.index_copy_(0, slots, packed.codes)
                store.scale.index_copy_(0, slots, packed.scale)
                store.minimum.index_copy_(0, slots, packed.minimum)
            kept = tail[:, move:]
            hot[layer][:, : kept.shape[1]] = kept

    def advance(self) -> None:
        move, evict = self._move, self._evict
        if evict:
            self._head = (self._head + evict) % self.cold_capacity
        self.n_cold += move - evict
        self.n_hot += self._new - move
        self.evicted += evict
        self.position += self._new
        self._new = self._move = self._evict = 0
