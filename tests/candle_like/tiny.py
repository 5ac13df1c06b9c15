"""Tiny randomly initialised Llama / Mistral / Qwen2 models, written in GGUF and HF form."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from ruvllm.hf_tokenizer import CONTROL, NORMAL, GgufVocab, HfTokenizer, byte_level_alphabet
from ruvllm_candle_like.config import ModelConfig
from ruvllm_candle_like.writers import save_hf, write_gguf

MERGES = ["Ġ t", "h e", "Ġ a", "i n", "Ġt he", "e r", "o n", "Ġ s", "r e", "a t"]


def tiny_tokenizer() -> GgufVocab:
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", *byte_level_alphabet()]
    for m in MERGES:
        tokens.append(m.replace(" ", ""))
    types = [CONTROL] * 3 + [NORMAL] * (len(tokens) - 3)
    return GgufVocab(
        model="gpt2", pre="gpt-2", tokens=tokens, token_types=types, merges=MERGES, scores=None,
        bos_id=1, eos_id=2, eot_id=None, unk_id=None, pad_id=None, add_bos=False, add_eos=False,
        add_space_prefix=False, chat_template=None,
    )


def tiny_config(kind: str, vocab: int) -> ModelConfig:
    common = dict(vocab_size=vocab, hidden_size=64, intermediate_size=96, num_layers=2, num_heads=4,
                  head_dim=16, max_position_embeddings=256, bos_token_id=1, eos_token_id=2)
    if kind == "llama":
        return ModelConfig(model_type="llama", num_kv_heads=2, rope_theta=10000.0, rms_norm_eps=1e-5,
                           tie_word_embeddings=True, **common)
    if kind == "mistral":
        return ModelConfig(model_type="mistral", num_kv_heads=1, rope_theta=1e6, rms_norm_eps=1e-6,
                           tie_word_embeddings=False, **common)
    if kind == "qwen2":
        return ModelConfig(model_type="qwen2", num_kv_heads=2, rope_theta=1e6, rms_norm_eps=1e-6,
                           tie_word_embeddings=False, attention_bias=True, **common)
    raise ValueError(kind)


def tiny_weights(cfg: ModelConfig, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)

    def w(*shape: int, scale: float = 0.08) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    hd, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    out = {"model.embed_tokens.weight": w(cfg.vocab_size, cfg.hidden_size, scale=0.5),
           "model.norm.weight": 1 + w(cfg.hidden_size, scale=0.1)}
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = w(cfg.vocab_size, cfg.hidden_size, scale=0.2)
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = 1 + w(cfg.hidden_size, scale=0.1)
        out[p + "post_attention_layernorm.weight"] = 1 + w(cfg.hidden_size, scale=0.1)
        out[p + "self_attn.q_proj.weight"] = w(hd, cfg.hidden_size, scale=0.3)
        out[p + "self_attn.k_proj.weight"] = w(kv, cfg.hidden_size, scale=0.3)
        out[p + "self_attn.v_proj.weight"] = w(kv, cfg.hidden_size)
        out[p + "self_attn.o_proj.weight"] = w(cfg.hidden_size, hd)
        if cfg.attention_bias:
            out[p + "self_attn.q_proj.bias"] = w(hd, scale=0.3)
            out[p + "self_attn.k_proj.bias"] = w(kv, scale=0.3)
            out[p + "self_attn.v_proj.bias"] = w(kv)
        out[p + "mlp.gate_proj.weight"] = w(cfg.intermediate_size, cfg.hidden_size)
        out[p + "mlp.up_proj.weight"] = w(cfg.intermediate_size, cfg.hidden_size)
        out[p + "mlp.down_proj.weight"] = w(cfg.hidden_size, cfg.intermediate_size)
    return out


def write_tiny(kind: str, root: Path, seed: int = 0) -> tuple[Path, Path, ModelConfig]:
    """(gguf file, HF directory, config) of one tiny random model."""
    tok = tiny_tokenizer()
    cfg = tiny_config(kind, len(tok.tokens))
    weights = tiny_weights(cfg, seed)
    gguf_path = write_gguf(root / f"tiny-{kind}.gguf", cfg, weights, tok)
    hf_dir = save_hf(root / f"tiny-{kind}-hf", cfg, weights,
                     HfTokenizer.from_gguf_vocab(tok, vocab_size=cfg.vocab_size),
                     chat_template=None)
    return gguf_path, hf_dir, cfg
