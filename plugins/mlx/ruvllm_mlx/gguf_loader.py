"""Read a GGUF file with ``mx.load``: hyper-parameters, weights (still packed) and metadata.

``mx.load`` keeps Q4_0, Q4_1 and Q8_0 tensors quantized: each arrives as a packed ``uint32``
``.weight`` plus ``.scales`` and ``.biases`` (affine, group size 32); other GGUF types arrive
already dequantized. Names are mapped to the compact model's names here so the model never
sees a file format.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ruvllm.errors import ModelLoadError

from ruvllm_mlx.arch import SUPPORTED, ModelConfig
from ruvllm_mlx.mlx_core import mx

GGUF_GROUP_SIZE = 32

_LAYER_NAMES = {
    "attn_norm": "attn_norm", "attn_q": "q", "attn_k": "k", "attn_v": "v",
    "attn_output": "o", "ffn_norm": "ffn_norm", "ffn_gate": "gate", "ffn_up": "up",
    "ffn_down": "down",
}
_TOP_NAMES = {"token_embd": "embed", "output_norm": "norm", "output": "lm_head"}


def meta_value(metadata: dict[str, Any], key: str, default: Any = None) -> Any:
    """A metadata value as a Python scalar/list (``mx.load`` gives scalars as 0-d arrays)."""
    if key not in metadata:
        return default
    value = metadata[key]
    if isinstance(value, mx.array):
        return value.item() if value.ndim == 0 else value.tolist()
    return value


def plain_metadata(metadata: dict[str, Any], prefix: str) -> dict[str, Any]:
    """The entries under ``prefix`` as plain Python values (what core's tokenizer reads)."""
    return {k: meta_value(metadata, k) for k in metadata if k.startswith(prefix)}


def canonical_name(gguf_name: str) -> str | None:
    """``blk.3.attn_q.weight`` -> ``layers.3.q.weight``; None for tensors the model does not use."""
    stem, _, suffix = gguf_name.rpartition(".")
    if stem.startswith("blk."):
        _, index, part = stem.split(".", 2)
        name = _LAYER_NAMES.get(part)
        return None if name is None else f"layers.{index}.{name}.{suffix}"
    name = _TOP_NAMES.get(stem)
    return None if name is None else f"{name}.{suffix}"


def load_gguf(path: Path) -> tuple[ModelConfig, dict[str, mx.array], dict[str, Any]]:
    try:
        tensors, metadata = mx.load(str(path), return_metadata=True)
    except Exception as exc:  # mlx raises RuntimeError/ValueError with the reason
        raise ModelLoadError(str(path), f"mx.load could not read the GGUF file: {exc}") from exc
    arch = meta_value(metadata, "general.architecture")
    if arch not in SUPPORTED:
        raise ModelLoadError(
            str(path), f"architecture {arch!r} is not supported by the mlx backend "
            f"(supported: {', '.join(SUPPORTED)})"
        )

    def need(key: str) -> Any:
        value = meta_value(metadata, f"{arch}.{key}")
        if value is None:
            raise ModelLoadError(str(path), f"GGUF metadata lacks {arch}.{key}")
        return value

    hidden = int(need("embedding_length"))
    heads = int(need("attention.head_count"))
    kv_heads = int(meta_value(metadata, f"{arch}.attention.head_count_kv", heads))
    head_dim = int(meta_value(metadata, f"{arch}.attention.key_length", hidden // heads))
    weights: dict[str, mx.array] = {}
    for name, tensor in tensors.items():
        canon = canonical_name(name)
        if canon is not None:
            weights[canon] = tensor
    freq_factors = None
    if "rope_freqs.weight" in tensors:
        freq_factors = tuple(float(f) for f in tensors["rope_freqs.weight"].tolist())
    tokens = meta_value(metadata, "tokenizer.ggml.tokens") or []
    vocab = int(meta_value(metadata, f"{arch}.vocab_size", 0) or len(tokens)
                or weights["embed.weight"].shape[0])
    config = ModelConfig(
        architecture=arch,
        hidden_size=hidden,
        num_layers=int(need("block_count")),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=int(need("feed_forward_length")),
        vocab_size=vocab,
        rms_eps=float(need("attention.layer_norm_rms_epsilon")),
        rope_theta=float(meta_value(metadata, f"{arch}.rope.freq_base", 10000.0)),
        rope_dims=int(meta_value(metadata, f"{arch}.rope.dimension_count", head_dim)),
        # llama.cpp's converter permutes Llama q/k rows for its adjacent-pair rope; Qwen2 keeps
        # the Hugging Face layout and llama.cpp runs it with NeoX (half-split) rope.
        rope_traditional=arch != "qwen2",
        context_length=int(need("context_length")),
        tie_embeddings="lm_head.weight" not in weights,
        attention_bias="layers.0.q.bias" in weights,
        rope_freq_factors=freq_factors,
    )
    return config, weights, metadata
