"""A compact, single-file Llama-family transformer (Llama, SmolLM2, TinyLlama, Llama 3,
Mistral, Qwen2), in the spirit of gpt-fast.

The forward pass runs over a flat list of tokens (one or many sequences, prefill chunks and
decode tokens mixed) at explicit positions. Attention, the only part that needs to know which
sequence a token belongs to and where its past KV lives, is delegated to an
:class:`Attention` object, so one model serves the contiguous per-request cache, the paged
executor and the two-tier cache.

Weights are kept in Hugging Face layout, with q/k/v and gate/up fused into one matrix each:
fewer, larger matmuls mean less per-step Python overhead at batch 1. Each matrix is a
:class:`~ruvllm_candle_like.projection.Projection`, which on CPU also holds a copy packed for
oneDNN (the matmuls that dominate a decode step run 1.5x faster from it).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

import attrs
import numpy as np
import torch
import torch.nn.functional as F
from ruvllm.errors import ModelLoadError

from ruvllm_candle_like import blockmm, native_decoder
from ruvllm_candle_like.block_codes import GgufBlocks
from ruvllm_candle_like.blockmm import BlockWeights
from ruvllm_candle_like.config import ModelConfig
from ruvllm_candle_like.lora import LoraPlan
from ruvllm_candle_like.projection import PROJECTIONS, BlockProjection, Projection
from ruvllm_candle_like.weights import AnyProjection, ProjectionFactory, Weight, as_tensor


class Attention(Protocol):
    """Stores a step's new K/V and attends over the sequences' whole past."""

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """``q`` [T, H, D], ``k``/``v`` [T, Hkv, D] (RoPE applied) -> output [T, H*D]."""
        ...


def rope_inv_freq(cfg: ModelConfig, rope_freqs: np.ndarray | None = None) -> torch.Tensor:
    """Inverse frequencies of RoPE, with the scaling the config asks for."""
    d = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    scaling = dict(cfg.rope_scaling or {})
    kind = scaling.get("rope_type", scaling.get("type"))
    if rope_freqs is not None:
        # llama.cpp's Llama 3.1 GGUFs carry the per-frequency divisors precomputed.
        inv = inv / torch.as_tensor(rope_freqs, dtype=torch.float64)
    elif kind == "llama3":
        factor = float(scaling["factor"])
        low = float(scaling.get("low_freq_factor", 1.0))
        high = float(scaling.get("high_freq_factor", 4.0))
        old = float(scaling.get("original_max_position_embeddings", 8192))
        low_wavelen, high_wavelen = old / low, old / high
        wavelen = 2 * math.pi / inv
        smooth = (old / wavelen - low) / (high - low)
        scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
        mid = (1 - smooth) * scaled / factor + smooth * scaled
        is_mid = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        inv = torch.where(is_mid, mid, scaled)
    elif kind not in (None, "default", "linear"):
        raise ModelLoadError("config", f"rope_scaling type {kind!r} is not supported (linear, llama3)")
    return inv.float()


class RotaryTable:
    """cos/sin for every position up to the context length, in float32 (looked up by index)."""

    def __init__(self, cfg: ModelConfig, max_positions: int, device: torch.device,
                 rope_freqs: np.ndarray | None = None):
        inv = rope_inv_freq(cfg, rope_freqs)
        pos = torch.arange(max_positions, dtype=torch.float64)
        scaling = dict(cfg.rope_scaling or {})
        if scaling.get("rope_type", scaling.get("type")) == "linear":
            pos = pos / float(scaling["factor"])
        ang = torch.outer(pos, inv.double())
        ang = torch.cat([ang, ang], dim=-1)
        self.cos = ang.cos().float().to(device)
        # rotate_half(x) * sin == roll(x, D/2) * sin with the first half's sign flipped: the
        # negation moves from x (every call) to the table (once), exactly (x * -s == -x * s).
        half = ang.shape[-1] // 2
        self.sin = (ang.sin() * torch.cat([-torch.ones(half), torch.ones(half)]).double()).float().to(device)

    def lookup(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and the sign-folded sin (:func:`apply_rope`), [T, 1, D], for ``positions`` [T]."""
        return (self.cos[positions].unsqueeze(1).to(dtype), self.sin[positions].unsqueeze(1).to(dtype))


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Half-split ("rotate_half") RoPE, as Hugging Face's Llama applies it, with ``sin`` from
    :meth:`RotaryTable.lookup` (first half negated): 4 ops where slice/neg/cat took 7, same bits."""
    return x * cos + x.roll(x.shape[-1] // 2, -1) * sin


class Layer:
    __slots__ = ("down", "gate_up", "ln1", "ln2", "o", "qkv")

    def __init__(self) -> None:
        self.ln1: torch.Tensor
        self.qkv: AnyProjection
        self.o: AnyProjection
        self.ln2: torch.Tensor
        self.gate_up: AnyProjection
        self.down: AnyProjection


class Transformer:
    """Weights plus a functional forward pass; no nn.Module machinery on the hot path."""

    def __init__(self, cfg: ModelConfig, weights: Mapping[str, Weight], *, dtype: torch.dtype,
                 device: torch.device, max_positions: int, rope_freqs: np.ndarray | None = None,
                 prepack: bool = True, int4: bool = False, dense_rows: int | None = None,
                 int8: bool = False):
        """``prepack``: also keep oneDNN-packed copies of the projections (CPU only; they
        double the projections' memory for 1.5x faster matmuls). ``int4``: run the projections
        and the head given as GGUF blocks on those blocks (block_codes.py; 5 and 8-bit codes on the
        native kernel only), with a dense copy for calls of ``dense_rows`` rows or more when that is set
        (weights.py); ``int8``: the block kernel quantises activations to int8 (blockmm.py)."""
        self.cfg = cfg
        self.dtype = dtype
        self.device = device
        #: The block kernel quantises activations to int8 (for the projections that run on it).
        self.int8 = int8 and int4
        self.max_positions = max_positions
        self.rope = RotaryTable(cfg, max_positions, device, rope_freqs)

        def given(name: str) -> Weight:
            if name not in weights:
                raise ModelLoadError("weights", f"missing tensor {name!r}")
            return weights[name]

        def get(name: str) -> torch.Tensor:
            return as_tensor(given(name)).to(device=device, dtype=dtype)

        projection = ProjectionFactory(dtype=dtype, device=device, prepack=prepack, int4=int4,
                                       dense_rows=dense_rows, int8=int8)

        embedding = "model.embed_tokens.weight"
        if tuple(given(embedding).shape) != (cfg.vocab_size, cfg.hidden_size):
            raise ModelLoadError(
                "weights", f"embedding shape {tuple(given(embedding).shape)} does not match the config's "
                f"({cfg.vocab_size}, {cfg.hidden_size})"
            )
        self.norm = get("model.norm.weight")
        #: The head is the token embedding's matrix.
        self.tied = cfg.tie_word_embeddings or "lm_head.weight" not in weights
        head = embedding if self.tied else "lm_head.weight"
        # On its own blocks where they map (the embedded model's Q8_0 embedding: a quarter of
        # float32's bytes, read in full by every step); else dense, sharing the embedding if tied.
        # No dense copy: the head mostly sees one row per sequence (a prompt's last position).
        blocks_only = attrs.evolve(projection, dense_rows=None)
        quantized_head = blocks_only.quantized([(head, given(head))])
        table = quantized_head
        if not self.tied:
            # Only where ruvllm's kernel reads rows from blocks: torch's packs them for matmuls
            # alone, so packing a vocabulary there would be a transient for nothing.
            on_blocks = blockmm.unavailable() is None
            table = blocks_only.quantized([(embedding, given(embedding))]) if on_blocks else None
        #: The token rows on ruvllm's kernel's blocks (the tied head's own, or the embedding's),
        #: dequantised per lookup, exactly: no float32 copy of the vocabulary's rows stays
        #: resident (a 128k x 4096 one would be 2 GiB).
        self.embedding_blocks = (table.kernel if table is not None and isinstance(table.kernel, BlockWeights)
                                 else None)
        #: The dense embedding matrix, or None when :attr:`embedding_blocks` serves the rows.
        self.embed: torch.Tensor | None = None if self.embedding_blocks is not None else get(embedding)
        self.lm_head: AnyProjection = quantized_head or Projection(
            self.embed if self.tied else get(head), prepack=prepack)
        self.layers: list[Layer] = []
        for i in range(cfg.num_layers):
            p = f"model.layers.{i}."
            layer = Layer()
            layer.ln1 = get(p + "input_layernorm.weight")
            layer.ln2 = get(p + "post_attention_layernorm.weight")
            bias = None
            if cfg.attention_bias:
                bias = torch.cat([get(p + f"self_attn.{n}_proj.bias") for n in "qkv"])

            def named(*names: str, prefix: str = p) -> list[tuple[str, Weight]]:
                return [(prefix + n, given(prefix + n)) for n in names]

            layer.qkv = projection(named(*(f"self_attn.{n}_proj.weight" for n in "qkv")), bias)
            layer.o = projection(named("self_attn.o_proj.weight"))
            layer.gate_up = projection(named("mlp.gate_proj.weight", "mlp.up_proj.weight"))
            layer.down = projection(named("mlp.down_proj.weight"))
            self.layers.append(layer)
        expected = (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim
        if self.layers and self.layers[0].qkv.shape[0] != expected:
            raise ModelLoadError("weights", "q/k/v projection shapes do not match the config's heads")
        #: Why the layers run op by op on PyTorch, or None when the native decoder runs them.
        self.native_off = native_decoder.unavailable(self)
        self.native = native_decoder.NativeDecoder(self) if self.native_off is None else None

    def cast(self, dtype: torch.dtype) -> Transformer:
        """A copy computing in ``dtype`` (self when it already does on plain weights only),
        without packed weights.

        For training beside serving: SONA's backward in bf16 on a CPU without native bf16 falls
        to a slow reference gemm, so it trains on a float32 copy there while this model serves.
        Gradients take the plain weights anyway, so packing the copy would only cost memory; int4
        projections have no gradient formula, so the copy holds their weights dense.
        """
        if dtype == self.dtype and not self.has_blocks():
            return self
        twin = copy.copy(self)
        twin.dtype = dtype
        twin.native, twin.native_off = None, "a dense copy for training"
        twin.embed = self.embedding_matrix().to(dtype)
        twin.embedding_blocks = None
        twin.norm = self.norm.to(dtype)
        head = self.lm_head
        twin.lm_head = Projection(twin.embed if self.tied else head.weight.to(dtype),
                                  None if head.bias is None else head.bias.to(dtype), prepack=False)
        twin.layers = []
        for layer in self.layers:
            new = Layer()
            new.ln1, new.ln2 = layer.ln1.to(dtype), layer.ln2.to(dtype)
            for name in PROJECTIONS:
                proj = getattr(layer, name)
                setattr(new, name, Projection(proj.weight.to(dtype),
                                              None if proj.bias is None else proj.bias.to(dtype),
                                              prepack=False))
            twin.layers.append(new)
        return twin

    def embedding_matrix(self) -> torch.Tensor:
        """The token embedding ``[vocab, hidden]``, built from its blocks if that is how it is kept."""
        if self.embed is not None:
            return self.embed
        assert self.embedding_blocks is not None
        return self.embedding_blocks.dequantize().to(self.dtype)

    def embed_rows(self, tokens: torch.Tensor) -> torch.Tensor:
        """The tokens' embedding rows ``[T, hidden]`` in the model's dtype."""
        if self.embed is not None:
            return F.embedding(tokens, self.embed)
        assert self.embedding_blocks is not None
        return self.embedding_blocks.rows(tokens).to(self.dtype)

    def has_blocks(self) -> bool:
        return any(isinstance(layer.qkv, BlockProjection) or isinstance(layer.down, BlockProjection)
                   for layer in self.layers)

    def describe_weights(self) -> str:
        """How the projections and the head are held, for the serve banner: which kernel, how
        many matrices on each, and their resident MiB (e.g. a Q4_K_M file: most on 5-bit codes,
        its Q6_K on 8-bit ones)."""
        held: dict[str, list[int]] = {}
        for proj in [self.lm_head, *(getattr(layer, name) for layer in self.layers for name in PROJECTIONS)]:
            count = held.setdefault(proj.held, [0, 0])
            count[0] += 1
            count[1] += proj.nbytes()
        parts = [f"{n} on {kind} ({size / (1 << 20):.1f} MiB)" for kind, (n, size) in held.items()]
        return "weight matrices: " + ", ".join(parts)

    def parameter_count(self) -> int:
        n = self.cfg.vocab_size * self.cfg.hidden_size + self.norm.numel()
        if not self.tied:
            n += self.lm_head.shape.numel()
        for layer in self.layers:
            n += layer.ln1.numel() + layer.ln2.numel()
            n += sum(getattr(layer, name).shape.numel() for name in PROJECTIONS)
        return n

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, attention: Attention,
                logit_rows: torch.Tensor | None = None, lora: LoraPlan | None = None) -> torch.Tensor:
        """Logits (float32) of the rows ``logit_rows`` (all rows when None).

        ``tokens`` and ``positions`` are flat [T] int64 tensors on the model's device; ``lora``
        adds adapter deltas to the rows it names (None: the base model only).
        """
        return self.logits(self.hidden(tokens, positions, attention, lora), logit_rows)

    def logits(self, x: torch.Tensor, logit_rows: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (float32) of the rows ``logit_rows`` (all when None) of the final hidden state ``x``."""
        if logit_rows is not None:
            x = x[logit_rows]
        return self.lm_head(x).float()

    def hidden(self, tokens: torch.Tensor, positions: torch.Tensor, attention: Attention,
               lora: LoraPlan | None = None) -> torch.Tensor:
        """The final (normed) hidden state of every row, [T, hidden], in the model's dtype."""
        # On the native decoder unless tracing a graph or training an adapter (it has no gradients).
        if self.native is not None and not torch.compiler.is_compiling() and (
                lora is None or not torch.is_grad_enabled()):
            return self.native.hidden(self.embed_rows(tokens), positions, attention, lora)
        cfg = self.cfg
        h_q, h_kv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        k_end = (h_q + h_kv) * d
        eps = cfg.rms_norm_eps
        n = tokens.shape[0]
        cos, sin = self.rope.lookup(positions, self.dtype)
        x = self.embed_rows(tokens)
        hidden = x.shape[-1]
        for i, layer in enumerate(self.layers):
            y = F.rms_norm(x, (hidden,), layer.ln1, eps)
            qkv = layer.qkv(y)
            if lora is not None:
                qkv = lora.apply(i, "qkv", y, qkv)
            # Q and K heads rotated together: one set of element-wise ops per layer, not two.
            qk = apply_rope(qkv[:, :k_end].view(n, h_q + h_kv, d), cos, sin)
            q, k = qk[:, :h_q], qk[:, h_q:]
            v = qkv[:, k_end:].reshape(n, h_kv, d)
            attn = attention.attend(i, q, k, v)
            o = layer.o(attn)
            if lora is not None:
                o = lora.apply(i, "o", attn, o)
            x = x + o
            y = F.rms_norm(x, (hidden,), layer.ln2, eps)
            gu = layer.gate_up(y)
            if lora is not None:
                gu = lora.apply(i, "gate_up", y, gu)
            gate, up = gu.chunk(2, dim=-1)
            act = F.silu(gate) * up
            down = layer.down(act)
            if lora is not None:
                down = lora.apply(i, "down", act, down)
            x = x + down
        return F.rms_norm(x, (hidden,), self.norm, eps)


def to_torch_weights(items: Iterable[tuple[str, Any]]) -> dict[str, Weight]:
    """Name -> weight from (name, numpy array, tensor or GGUF blocks) pairs."""
    out: dict[str, Weight] = {}
    for name, arr in items:
        # np.require copies read-only (memory-mapped) arrays only: torch needs writable memory.
        out[name] = arr if isinstance(arr, torch.Tensor | GgufBlocks) else torch.from_numpy(
            np.require(arr, requirements="CW"))
    return out
