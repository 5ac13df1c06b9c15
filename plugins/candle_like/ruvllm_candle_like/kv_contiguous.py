"""Per-request contiguous KV cache: the request-level path's default (``kv_cache = "fp16"``).

One ``[Hkv, capacity, D]`` tensor per layer for K and for V, created for one ``generate`` call
and dropped at its end, so no state survives between calls (the isolation contract). Attention
reads a slice of it, with no gather. The capacity is sized from the request and grows by
doubling if a caller runs past it.
"""

from __future__ import annotations

import torch

from ruvllm_candle_like.attention_ops import attend_sequence
from ruvllm_candle_like.config import ModelConfig


class ContiguousCache:
    def __init__(self, cfg: ModelConfig, capacity: int, *, kv_dtype: torch.dtype,
                 compute_dtype: torch.dtype, device: torch.device):
        self._cfg = cfg
        self._kv_dtype = kv_dtype
        self._compute = compute_dtype
        self._device = device
        self.length = 0
        self._new = 0
        shape = (cfg.num_kv_heads, max(capacity, 1), cfg.head_dim)
        self.k = [torch.empty(shape, dtype=kv_dtype, device=device) for _ in range(cfg.num_layers)]
        self.v = [torch.empty(shape, dtype=kv_dtype, device=device) for _ in range(cfg.num_layers)]

    @property
    def position(self) -> int:
        """Absolute position of the next token (equal to the length: nothing is evicted)."""
        return self.length

    @property
    def capacity(self) -> int:
        return self.k[0].shape[1]

    def nbytes(self) -> int:
        """Bytes of the tensors holding this cache's K and V."""
        return sum(t.numel() * t.element_size() for t in (*self.k, *self.v))

    def begin(self, n_new: int) -> None:
        """Prepare to append ``n_new`` tokens in the next forward."""
        need = self.length + n_new
        if need > self.capacity:
            cap = max(need, 2 * self.capacity)
            for store in (self.k, self.v):
                for i, t in enumerate(store):
                    grown = torch.empty((t.shape[0], cap, t.shape[2]), dtype=t.dtype, device=t.device)
                    grown[:, : self.length] = t[:, : self.length]
                    store[i] = grown
        self._new = n_new

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        start, end = self.length, self.length + q.shape[0]
        self.k[layer][:, start:end] = k.transpose(0, 1)
        self.v[layer][:, start:end] = v.transpose(0, 1)
        keys, values = self.k[layer][:, :end], self.v[layer][:, :end]
        if self._kv_dtype != self._compute:
            keys, values = keys.to(self._compute), values.to(self._compute)
        return attend_sequence(q, keys, values, start)

    def advance(self) -> None:
        """Commit the tokens of the forward that just ran."""
        self.length += self._new
        self._new = 0
