"""The model hyper-parameters, read from a Hugging Face ``config.json`` or GGUF metadata.

One frozen value describes every architecture this backend runs (the Llama family, Mistral,
Qwen2): they differ only in a few switches (QKV biases, tied embeddings, RoPE base and
scaling), so a single model implementation serves all of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
from ruvllm.errors import ModelLoadError

#: Architectures this backend implements, keyed by the name a config uses.
HF_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
}
MODEL_TYPES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}
#: GGUF ``general.architecture`` values and the model type they map to.
GGUF_ARCHITECTURES = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2"}


@attrs.frozen(kw_only=True)
class ModelConfig:
    model_type: str = attrs.field(validator=attrs.validators.in_(tuple(MODEL_TYPES)))
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    #: Hugging Face ``rope_scaling`` dict (``linear`` or ``llama3``), or None.
    rope_scaling: Mapping[str, Any] | None = None
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    #: Biases on the q/k/v projections (Qwen2).
    attention_bias: bool = False
    sliding_window: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None

    @classmethod
    def from_hf(cls, cfg: Mapping[str, Any], source: str = "config.json") -> ModelConfig:
        """Build from a parsed ``config.json``."""
        archs = cfg.get("architectures") or []
        model_type = cfg.get("model_type")
        if model_type not in MODEL_TYPES:
            model_type = next((HF_ARCHITECTURES[a] for a in archs if a in HF_ARCHITECTURES), None)
        if model_type is None:
            raise ModelLoadError(
                source,
                f"unsupported architecture {archs or cfg.get('model_type')!r}; candle_like runs "
                f"{', '.join(sorted(HF_ARCHITECTURES))}",
            )
        try:
            heads = int(cfg["num_attention_heads"])
            hidden = int(cfg["hidden_size"])
            return cls(
                model_type=model_type,
                vocab_size=int(cfg["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(cfg["intermediate_size"]),
                num_layers=int(cfg["num_hidden_layers"]),
                num_heads=heads,
                num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
                head_dim=int(cfg.get("head_dim") or hidden // heads),
                rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-5)),
                rope_theta=float(cfg.get("rope_theta", 10000.0)),
                rope_scaling=cfg.get("rope_scaling"),
                max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
                tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                attention_bias=bool(cfg.get("attention_bias", model_type == "qwen2")),
                sliding_window=cfg.get("sliding_window") if cfg.get("use_sliding_window", True) else None,
                bos_token_id=cfg.get("bos_token_id"),
                eos_token_id=cfg.get("eos_token_id"),
            )
        except KeyError as exc:
            raise ModelLoadError(source, f"config is missing the key {exc.args[0]!r}") from None

    def to_hf(self) -> dict[str, Any]:
        """The standard ``config.json`` transformers, mistral.rs and PEFT read."""
        out: dict[str, Any] = {
            "architectures": [MODEL_TYPES[self.model_type]],
            "model_type": self.model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": dict(self.rope_scaling) if self.rope_scaling else None,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id,
            "torch_dtype": "float32",
            "initializer_range": 0.02,
            "use_cache": True,
        }
        if self.model_type == "llama":
            out["attention_bias"] = self.attention_bias
            out["mlp_bias"] = False
            out["pretraining_tp"] = 1
        if self.model_type in ("mistral", "qwen2"):
            out["sliding_window"] = self.sliding_window
        if self.model_type == "qwen2":
            out["use_sliding_window"] = False
            out["max_window_layers"] = self.num_layers
        return out
