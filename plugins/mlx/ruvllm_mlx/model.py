"""The compact Llama-family transformer in MLX, run over a token-flattened batch.

One forward takes the new tokens of several sequences at once, flattened into ``[N, hidden]``
as vLLM does: every projection and MLP (where the weights are read) runs once over all N
tokens, and only attention, which reads each sequence's own KV, runs per sequence. Prefill
chunks and single decode tokens mix freely in one step.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import attrs

from ruvllm_mlx.arch import ModelConfig
from ruvllm_mlx.kv_cache import SequenceCache
from ruvllm_mlx.layers import Linear
from ruvllm_mlx.mlx_core import mx

DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}


@attrs.frozen
class Segment:
    """``length`` new tokens of one sequence, at positions ``start ..``, stored in ``cache``."""

    cache: SequenceCache
    start: int
    length: int


class Block:
    def __init__(self, linears: dict[str, Linear], attn_norm: mx.array, ffn_norm: mx.array):
        self.q, self.k, self.v, self.o = (linears[n] for n in ("q", "k", "v", "o"))
        self.gate, self.up, self.down = (linears[n] for n in ("gate", "up", "down"))
        self.attn_norm = attn_norm
        self.ffn_norm = ffn_norm

    def arrays(self) -> list[mx.array]:
        out = [self.attn_norm, self.ffn_norm]
        for lin in (self.q, self.k, self.v, self.o, self.gate, self.up, self.down):
            out += lin.arrays()
        return out


class Transformer:
    def __init__(self, config: ModelConfig, weights: dict[str, mx.array], *, mode: str, dtype: str,
                 group_size: int = 32, quantize_bits: int = 4, quantize_group_size: int = 32):
        self.config = config
        self.dtype = DTYPES[dtype]
        self.mode = mode

        def linear(name: str) -> Linear:
            return Linear(
                weights[f"{name}.weight"], scales=weights.get(f"{name}.scales"),
                biases=weights.get(f"{name}.biases"), bias=weights.get(f"{name}.bias"),
                group_size=group_size, mode=mode, dtype=self.dtype,
                quantize_bits=quantize_bits, quantize_group_size=quantize_group_size,
            )

        def norm(name: str) -> mx.array:
            return weights[f"{name}.weight"].astype(self.dtype)

        self.embed = linear("embed")
        self.lm_head = self.embed if config.tie_embeddings else linear("lm_head")
        self.norm = norm("norm")
        self.blocks = [
            Block({n: linear(f"layers.{i}.{n}") for n in ("q", "k", "v", "o", "gate", "up", "down")},
                  norm(f"layers.{i}.attn_norm"), norm(f"layers.{i}.ffn_norm"))
            for i in range(config.num_layers)
        ]
        self.scale = 1.0 / math.sqrt(config.head_dim)
        self._freqs = None
        if config.rope_freq_factors is not None:
            dims = config.rope_dims
            base = mx.power(config.rope_theta, mx.arange(0, dims, 2, dtype=mx.float32) / dims)
            self._freqs = base * mx.array(config.rope_freq_factors, dtype=mx.float32)
        mx.eval(self.arrays())

    def arrays(self) -> list[mx.array]:
        out = [self.norm, *self.embed.arrays()]
        if self.lm_head is not self.embed:
            out += self.lm_head.arrays()
        if self._freqs is not None:
            out.append(self._freqs)
        for b in self.blocks:
            out += b.arrays()
        return out

    def new_cache(self, kv_quantize: tuple[int, int] | None = None) -> SequenceCache:
        c = self.config
        return SequenceCache(c.num_layers, c.num_kv_heads, c.head_dim, self.dtype, kv_quantize)

    def _rope(self, x: mx.array, offset: int) -> mx.array:
        c = self.config
        if self._freqs is not None:
            return mx.fast.rope(x, c.rope_dims, traditional=c.rope_traditional, base=None,
                                scale=1.0, offset=offset, freqs=self._freqs)
        return mx.fast.rope(x, c.rope_dims, traditional=c.rope_traditional, base=c.rope_theta,
                            scale=1.0, offset=offset)

    def _mlp(self, block: Block, x: mx.array) -> mx.array:
        h = mx.fast.rms_norm(x, block.ffn_norm, self.config.rms_eps)
        g = block.gate(h)
        return x + block.down(g * mx.sigmoid(g) * block.up(h))

    def _attention(self, block: Block, layer: int, x: mx.array, segments: Sequence[Segment]) -> mx.array:
        c = self.config
        h = mx.fast.rms_norm(x, block.attn_norm, c.rms_eps)
        q, k, v = block.q(h), block.k(h), block.v(h)
        outs = []
        row = 0
        for seg in segments:
            n = seg.length
            qs = q[row:row + n].reshape(n, c.num_heads, c.head_dim).transpose(1, 0, 2)[None]
            ks = k[row:row + n].reshape(n, c.num_kv_heads, c.head_dim).transpose(1, 0, 2)[None]
            vs = v[row:row + n].reshape(n, c.num_kv_heads, c.head_dim).transpose(1, 0, 2)[None]
            qs, ks = self._rope(qs, seg.start), self._rope(ks, seg.start)
            keys, values = seg.cache.update(layer, ks, vs, seg.start)
            o = mx.fast.scaled_dot_product_attention(
                qs, keys, values, scale=self.scale, mask="causal" if n > 1 else None)
            outs.append(o[0].transpose(1, 0, 2).reshape(n, c.num_heads * c.head_dim))
            row += n
        attn = outs[0] if len(outs) == 1 else mx.concatenate(outs, axis=0)
        return x + block.o(attn)

    def forward(self, tokens: Sequence[int], segments: Sequence[Segment],
                sample_rows: Sequence[int]) -> mx.array:
        """Run ``tokens`` (the segments' new tokens, concatenated) and return float32 logits of
        the rows in ``sample_rows`` (indices into ``tokens``), ``[len(sample_rows), vocab]``."""
        for seg in segments:
            seg.cache.begin(seg.start, seg.length)
        ids = mx.array(list(tokens), dtype=mx.int32)
        x = self.embed.rows(ids).astype(self.dtype)
        for layer, block in enumerate(self.blocks):
            x = self._attention(block, layer, x, segments)
            x = self._mlp(block, x)
        if len(sample_rows) != x.shape[0]:
            x = x[mx.array(list(sample_rows), dtype=mx.int32)]
        x = mx.fast.rms_norm(x, self.norm, self.config.rms_eps)
        logits = self.lm_head(x).astype(mx.float32)
        for seg in segments:
            seg.cache.commit(seg.start + seg.length)
        return logits
