"""Architecture hyper-parameters of the Llama family, independent of the file format."""

from __future__ import annotations

import attrs

#: Architectures the compact model implements. Mistral (v0.1-v0.3 without sliding-window
#: attention beyond the context) and Qwen2 (QKV bias, NeoX rope) are Llama-shaped.
SUPPORTED = ("llama", "mistral", "qwen2")


@attrs.frozen(kw_only=True)
class ModelConfig:
    architecture: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_eps: float
    rope_theta: float
    #: Rotated feature count per head (usually head_dim).
    rope_dims: int
    #: True rotates adjacent pairs (GGUF Llama, whose q/k rows llama.cpp's converter
    #: permuted); False rotates the two halves (Hugging Face layout, Qwen2 everywhere).
    rope_traditional: bool
    context_length: int
    tie_embeddings: bool
    attention_bias: bool = False
    #: Per-dimension rope period factors (Llama 3 long-context scaling), or None.
    rope_freq_factors: tuple[float, ...] | None = None
