"""Read a Hugging Face directory (config.json + safetensors) for the compact model.

Checkpoints already quantized by MLX (``.scales``/``.biases`` next to each packed weight, and a
``quantization`` entry in config.json) load as they are; plain checkpoints load in their dtype
and may be quantized later with ``mx.quantize`` (``weights = "quantized"``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from ruvllm.errors import ModelLoadError

from ruvllm_mlx.arch import SUPPORTED, ModelConfig
from ruvllm_mlx.mlx_core import mx

_LAYER_NAMES = {
    "input_layernorm": "attn_norm", "self_attn.q_proj": "q", "self_attn.k_proj": "k",
    "self_attn.v_proj": "v", "self_attn.o_proj": "o", "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "gate", "mlp.up_proj": "up", "mlp.down_proj": "down",
}
_TOP_NAMES = {"model.embed_tokens": "embed", "model.norm": "norm", "lm_head": "lm_head"}


def canonical_name(hf_name: str) -> str | None:
    stem, _, suffix = hf_name.rpartition(".")
    if stem.startswith("model.layers."):
        rest = stem[len("model.layers."):]
        index, _, part = rest.partition(".")
        name = _LAYER_NAMES.get(part)
        return None if name is None else f"layers.{index}.{name}.{suffix}"
    name = _TOP_NAMES.get(stem)
    return None if name is None else f"{name}.{suffix}"


def llama3_freq_factors(scaling: dict[str, Any], base: float, dims: int) -> tuple[float, ...]:
    """Per-dimension period multipliers of Llama 3's rope scaling (as transformers computes)."""
    factor = float(scaling["factor"])
    low = float(scaling.get("low_freq_factor", 1.0))
    high = float(scaling.get("high_freq_factor", 4.0))
    original = float(scaling.get("original_max_position_embeddings", 8192))
    low_wavelen, high_wavelen = original / low, original / high
    out = []
    for i in range(0, dims, 2):
        wavelen = 2 * math.pi * base ** (i / dims)
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return tuple(out)


def load_hf(path: Path) -> tuple[ModelConfig, dict[str, mx.array], dict[str, Any]]:
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ModelLoadError(str(path), "a Hugging Face model directory needs config.json")
    cfg = json.loads(config_file.read_text())
    arch = cfg.get("model_type")
    if arch not in SUPPORTED:
        raise ModelLoadError(
            str(path), f"model_type {arch!r} is not supported by the mlx backend "
            f"(supported: {', '.join(SUPPORTED)})"
        )
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(str(path), "no *.safetensors weights in the directory")
    weights: dict[str, mx.array] = {}
    for f in files:
        try:
            loaded = mx.load(str(f))
        except Exception as exc:
            raise ModelLoadError(str(path), f"mx.load could not read {f.name}: {exc}") from exc
        for name, tensor in loaded.items():
            canon = canonical_name(name)
            if canon is not None:
                weights[canon] = tensor
    hidden = int(cfg["hidden_size"])
    heads = int(cfg["num_attention_heads"])
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    theta = float(cfg.get("rope_theta", 10000.0))
    scaling = cfg.get("rope_scaling")
    factors = None
    if scaling:
        kind = scaling.get("rope_type") or scaling.get("type")
        if kind == "llama3":
            factors = llama3_freq_factors(scaling, theta, head_dim)
        elif kind != "default":
            raise ModelLoadError(str(path), f"rope_scaling type {kind!r} is not supported by the mlx backend")
    config = ModelConfig(
        architecture=arch,
        hidden_size=hidden,
        num_layers=int(cfg["num_hidden_layers"]),
        num_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=head_dim,
        intermediate_size=int(cfg["intermediate_size"]),
        vocab_size=int(cfg["vocab_size"]),
        rms_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=theta,
        rope_dims=head_dim,
        rope_traditional=False,
        context_length=int(cfg.get("max_position_embeddings", 4096)),
        tie_embeddings="lm_head.weight" not in weights,
        attention_bias="layers.0.q.bias" in weights,
        rope_freq_factors=factors,
    )
    return config, weights, cfg
